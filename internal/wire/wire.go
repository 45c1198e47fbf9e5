// Package wire reads and writes flashsale's hot JSON by hand: the queue
// message, which the worker decodes for every purchase, the result, which
// every notifier decodes, and the small objects of the gateway's purchase body
// and the token claims. These are measured hot paths (docs/BENCHMARKS.md), so
// their common shape skips encoding/json's reflection; model keeps the types
// and the Encode/Decode entry points, which call this package.
//
// That shape is the one flashsale's own encoders write: a flat object, no
// whitespace, keys in lower case, string values of printable ASCII without
// escapes, integer numbers. Anything outside it — whitespace, escapes,
// non-ASCII, other key spellings, unknown or repeated keys, null, fractions —
// makes these functions give up (ok is false), and the caller falls back to
// encoding/json, so every input decodes exactly as encoding/json decodes it
// and every output is byte for byte what json.Marshal writes.
//
// CheckKeys closes what encoding/json leaves open in those fallbacks and in
// every strict decoder of a request: repeated keys and keys that match a
// field only when case is ignored.
//
// wire depends on the standard library only and does not import model (model
// imports it).
package wire

import (
	"strconv"
	"time"
)

// Decoder reads one flat object in that shape. s is string(b), made once, so
// that every string field is a substring of one allocation.
type Decoder struct {
	b []byte
	s string
	i int
}

// NewDecoder returns a Decoder of b.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b, s: string(b)} }

// byte consumes c if it is next.
func (d *Decoder) byte(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// done reports whether the whole input was read.
func (d *Decoder) done() bool { return d.i == len(d.b) }

// str reads a string without escapes and returns it with its position in b.
func (d *Decoder) str() (s string, start, end int, ok bool) {
	if !d.byte('"') {
		return "", 0, 0, false
	}
	start = d.i
	for ; d.i < len(d.b); d.i++ {
		c := d.b[d.i]
		if c == '"' {
			end = d.i
			d.i++
			return d.s[start:end], start, end, true
		}
		// Escapes, control bytes (invalid JSON) and non-ASCII (which
		// encoding/json may rewrite) are left to encoding/json.
		if c == '\\' || c < 0x20 || c >= 0x80 {
			return "", 0, 0, false
		}
	}
	return "", 0, 0, false
}

// key reads `"name":`.
func (d *Decoder) key() (string, bool) {
	k, _, _, ok := d.str()
	if !ok || !d.byte(':') {
		return "", false
	}
	return k, true
}

// Str reads a string without escapes, control bytes or non-ASCII; anything
// else is left to encoding/json.
func (d *Decoder) Str() (string, bool) {
	s, _, _, ok := d.str()
	return s, ok
}

// Int reads an integer of at most 18 digits (so it cannot overflow) that is
// followed by ',' or '}': a fraction or an exponent, which encoding/json
// refuses for integer fields, is left to it.
func (d *Decoder) Int() (int64, bool) {
	neg := d.byte('-')
	digits := d.i
	var n int64
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		n = n*10 + int64(d.b[d.i]-'0')
		d.i++
	}
	switch l := d.i - digits; {
	case l == 0 || l > 18:
		return 0, false
	case l > 1 && d.b[digits] == '0': // leading zeros are not JSON
		return 0, false
	}
	if d.i == len(d.b) || (d.b[d.i] != ',' && d.b[d.i] != '}') {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// Time reads a string as encoding/json reads a time.Time: RFC 3339, strictly.
func (d *Decoder) Time() (time.Time, bool) {
	_, start, end, ok := d.str()
	if !ok {
		return time.Time{}, false
	}
	var t time.Time
	// UnmarshalText and UnmarshalJSON share the same strict RFC 3339 parser.
	if err := t.UnmarshalText(d.b[start:end]); err != nil {
		return time.Time{}, false
	}
	return t, true
}

// Members calls member for each key of the object until it returns false;
// it reports whether the object was read to its end and the input with it.
// member reads the key's value and returns a bit of its own for the key, so
// that a key seen twice makes Members give up: encoding/json keeps the last
// one, and the fallback does exactly that.
func (d *Decoder) Members(member func(key string) (bit uint16, ok bool)) bool {
	if !d.byte('{') {
		return false
	}
	if d.byte('}') {
		return d.done()
	}
	var seen uint16
	for {
		k, ok := d.key()
		if !ok {
			return false
		}
		bit, ok := member(k)
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		if d.byte(',') {
			continue
		}
		return d.byte('}') && d.done()
	}
}

// JSONSafe reports whether encoding/json writes s unchanged between quotes:
// printable ASCII other than '"', '\\' and the HTML-escaped '<', '>', '&'.
// Hand-written encoders (here and the gateway's purchase answer) copy such a
// string as it is and leave any other to encoding/json.
func JSONSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// appendStr appends a JSONSafe string as a JSON string.
func appendStr(b []byte, s string) []byte {
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendTime appends t as encoding/json writes a time.Time (RFC 3339 with
// nanoseconds, quoted); it fails where time.Time.MarshalJSON fails.
func appendTime(b []byte, t time.Time) ([]byte, error) {
	b = append(b, '"')
	b, err := t.AppendText(b)
	if err != nil {
		return nil, err
	}
	return append(b, '"'), nil
}

// appendInt appends n in decimal.
func appendInt(b []byte, n int64) []byte { return strconv.AppendInt(b, n, 10) }
