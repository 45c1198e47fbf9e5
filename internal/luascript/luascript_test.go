package luascript

import (
	"crypto/sha1"
	"encoding/hex"
	"testing"
	"testing/fstest"
)

func TestNames(t *testing.T) {
	src := []byte("return 1")
	sum := sha1.Sum(src)
	got := Names(fstest.MapFS{"one.lua": {Data: src}, "notes.txt": {Data: []byte("x")}})
	if len(got) != 1 || got[hex.EncodeToString(sum[:])] != "one" {
		t.Fatalf("got %v, want the one script by its SHA1", got)
	}
}
