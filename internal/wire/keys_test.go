package wire

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

type keysInner struct {
	Name string `json:"name"`
}

type keysEmbedded struct {
	Level int `json:"level"`
}

type keysTarget struct {
	keysEmbedded
	Quantity *int64            `json:"quantity"`
	At       time.Time         `json:"at"`
	Inner    keysInner         `json:"inner"`
	List     []keysInner       `json:"list"`
	Labels   map[string]string `json:"labels"`
	Any      any               `json:"any"`
	Plain    string
	Skipped  string `json:"-"`
}

func TestCheckKeys(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantKey   string // "" = no error
		wantField string // the field a case variant matches
	}{
		{name: "exact keys", body: `{"quantity":1,"at":"2030-01-01T00:00:00Z","inner":{"name":"x"},"list":[{"name":"y"}],"labels":{"A":"1","a":"2"},"level":3,"Plain":"p"}`},
		{name: "unknown key is the decoder's", body: `{"qty":1}`},
		{name: "not an object", body: `[1,2]`},
		{name: "scalar", body: `3`},
		{name: "key in another case", body: `{"Quantity":2}`, wantKey: "Quantity", wantField: "quantity"},
		{name: "key in upper case", body: `{"QUANTITY":2}`, wantKey: "QUANTITY", wantField: "quantity"},
		{name: "key with a long s", body: `{"inner":{"name":"x"},"label\u017f":{}}`, wantKey: "label\u017f", wantField: "labels"},
		{name: "untagged field in another case", body: `{"plain":"p"}`, wantKey: "plain", wantField: "Plain"},
		{name: "embedded field in another case", body: `{"Level":1}`, wantKey: "Level", wantField: "level"},
		{name: "repeated key", body: `{"quantity":1,"quantity":2}`, wantKey: "quantity"},
		{name: "repeated unknown key", body: `{"x":1,"x":2}`, wantKey: "x"},
		{name: "repeated in a nested object", body: `{"inner":{"name":"a","name":"b"}}`, wantKey: "name"},
		{name: "case in a nested object", body: `{"inner":{"Name":"a"}}`, wantKey: "Name", wantField: "name"},
		{name: "case in a list element", body: `{"list":[{"name":"a"},{"NAME":"b"}]}`, wantKey: "NAME", wantField: "name"},
		{name: "repeated in a map", body: `{"labels":{"a":"1","a":"2"}}`, wantKey: "a"},
		{name: "repeated inside any", body: `{"any":{"k":1,"k":2}}`, wantKey: "k"},
		{name: "skipped field is unknown", body: `{"Skipped":"x"}`},
		{name: "same key in two objects", body: `{"list":[{"name":"a"},{"name":"b"}]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckKeys([]byte(tc.body), reflect.TypeFor[*keysTarget]())
			if tc.wantKey == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var ke *KeyError
			if !errors.As(err, &ke) || ke.Key != tc.wantKey || ke.Field != tc.wantField {
				t.Fatalf("got %v, want a KeyError on %q (field %q)", err, tc.wantKey, tc.wantField)
			}
		})
	}
}

// TestCheckKeysSyntax: a document that is not JSON is an error, never a
// pass.
func TestCheckKeysSyntax(t *testing.T) {
	for _, body := range []string{`{"quantity":`, `{"a" 1}`, ``} {
		if err := CheckKeys([]byte(body), reflect.TypeFor[keysTarget]()); err == nil {
			t.Errorf("%q: got nil, want an error", body)
		}
	}
}
