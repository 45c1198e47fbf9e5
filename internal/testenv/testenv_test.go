package testenv

import (
	"strings"
	"testing"
)

// TestNameDeletesItsKeys: the keys carrying a Name, in any case, are gone
// when its test ends; a key carrying a UniqueName that nothing deleted is
// what Main reports (and deletes).
func TestNameDeletesItsKeys(t *testing.T) {
	rdb := Redis(t)
	var name string
	t.Run("writer", func(t *testing.T) {
		name = Name(t, "tn-")
		for _, k := range []string{"fs:{" + name + "}:stock", "fsq:{" + name + ":3}:fence", "fs:{" + strings.ToUpper(name) + "}:meta"} {
			if err := rdb.Set(t.Context(), k, "1", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if keys, err := scan(t.Context(), rdb, "*"+globFold(name)+"*"); err != nil || len(keys) != 0 {
		t.Fatalf("after the test: got keys %v (%v), want none", keys, err)
	}

	// A key of a Name written after its test's cleanup (a system still
	// stopping) is deleted at the end, not reported.
	late := "fs:{" + name + "}:users"
	if err := rdb.Set(t.Context(), late, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}

	leaked := UniqueName("tl-")
	key := "fs:{" + leaked + "}:stock"
	if err := rdb.Set(t.Context(), key, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	err := checkLeftKeys()
	if err == nil || !strings.Contains(err.Error(), key) {
		t.Fatalf("got %v, want an error naming %s", err, key)
	}
	if strings.Contains(err.Error(), late) {
		t.Errorf("got %v, want %s (written after its test's cleanup) deleted without a report", err, late)
	}
	if n := rdb.Exists(t.Context(), key, late).Val(); n != 0 {
		t.Errorf("%d of the keys left are still there", n)
	}
	if err := checkLeftKeys(); err != nil {
		t.Errorf("second check: got %v, want none", err)
	}
}

func TestGlobFold(t *testing.T) {
	if got, want := globFold("ab-1_*"), `[aA][bB]-1_\*`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
