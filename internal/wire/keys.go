package wire

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
)

// KeyError is an object key that encoding/json takes but flashsale refuses:
// a key repeated in one object (encoding/json keeps the last value) or a key
// that names a field only when case is ignored ({"Quantity":2} fills
// "quantity"). Both let a request say one thing to a reader of its bytes and
// another to the server.
type KeyError struct {
	Key string
	// Field is the field's exact name when the key matches it only
	// case-insensitively; "" for a repeated key.
	Field string
}

func (e *KeyError) Error() string { return "key " + strconv.Quote(e.Key) + ": " + e.Reason() }

// Reason says what is wrong with the key, without naming it.
func (e *KeyError) Reason() string {
	if e.Field == "" {
		return "repeated key"
	}
	return "keys are case-sensitive: the field is " + strconv.Quote(e.Field)
}

// CheckKeys reports the first key of b, a valid JSON document, that
// encoding/json would read into a value of type t only leniently (see
// KeyError); keys that match no field are left to the decoder (unknown
// fields). The value of a type with its own JSON or text decoding is only
// checked for repeated keys. A syntax error in b is returned as
// encoding/json reports it.
func CheckKeys(b []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // numbers are skipped, not converted
	return checkValue(dec, t)
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// shape returns t without pointers, or nil when encoding/json does not read
// into it field by field (its own decoding, an interface, unknown).
func shape(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() == reflect.Interface {
		return nil
	}
	if p := reflect.PointerTo(t); p.Implements(jsonUnmarshaler) || p.Implements(textUnmarshaler) {
		return nil
	}
	return t
}

func checkValue(dec *json.Decoder, t reflect.Type) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	t = shape(t)
	if delim == '[' {
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for dec.More() {
			if err := checkValue(dec, elem); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		return err
	}
	var fields map[string]reflect.Type
	if t != nil && t.Kind() == reflect.Struct {
		fields = map[string]reflect.Type{}
		addFields(fields, t)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key := tok.(string) // an object's tokens alternate key, value
		if seen[key] {
			return &KeyError{Key: key}
		}
		seen[key] = true
		var value reflect.Type
		switch {
		case fields != nil:
			var exact bool
			if value, exact = fields[key]; !exact {
				for name := range fields {
					// EqualFold folds as encoding/json does when
					// it matches keys to fields.
					if strings.EqualFold(name, key) {
						return &KeyError{Key: key, Field: name}
					}
				}
			}
		case t != nil && t.Kind() == reflect.Map:
			value = t.Elem()
		}
		if err := checkValue(dec, value); err != nil {
			return err
		}
	}
	_, err = dec.Token()
	return err
}

// addFields adds the JSON names of t's fields as encoding/json sees them:
// the tag's name, else the Go name; "-" and unexported fields are skipped,
// and an embedded struct without a name contributes its own fields.
func addFields(fields map[string]reflect.Type, t reflect.Type) {
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			if et := shape(f.Type); et != nil && et.Kind() == reflect.Struct {
				addFields(fields, et)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
}
