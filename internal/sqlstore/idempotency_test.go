package sqlstore

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// TestClaimKey: the first claim of a key holds it; a later claim, with any
// request id or quantity, gets the holder back; a key is a user's within
// one campaign, compared exactly — on both drivers.
func TestClaimKey(t *testing.T) {
	type claim struct {
		campaign, user, key string
		quantity            int64
		requestID           string
	}
	tests := []struct {
		name             string
		claim            claim
		wantID           string
		wantQty          int64
		wantStoredBefore bool // the key was held before the claim
	}{
		{"first claim", claim{"c1", "u1", "k1", 2, "c1.r1"}, "c1.r1", 2, false},
		{"the same again", claim{"c1", "u1", "k1", 2, "c1.r1"}, "c1.r1", 2, true},
		{"another request, same body", claim{"c1", "u1", "k1", 2, "c1.r2"}, "c1.r1", 2, true},
		{"another quantity", claim{"c1", "u1", "k1", 1, "c1.r3"}, "c1.r1", 2, true},
		{"another user", claim{"c1", "u2", "k1", 1, "c1.r4"}, "c1.r4", 1, false},
		{"another campaign", claim{"c2", "u1", "k1", 1, "c2.r5"}, "c2.r5", 1, false},
		{"another case", claim{"c1", "u1", "K1", 1, "c1.r6"}, "c1.r6", 1, false},
		{"the longest user id", claim{"c1", "ü|" + strings.Repeat("é", 126), "k1", 3, "c1.r7"}, "c1.r7", 3, false},
	}
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			for _, tc := range tests {
				c := tc.claim
				_, _, err := db.KeyHolder(t.Context(), c.campaign, c.user, c.key)
				if held := err == nil; held != tc.wantStoredBefore || (err != nil && !errors.Is(err, model.ErrNotFound)) {
					t.Fatalf("%s: KeyHolder before the claim: got %v, want held %v", tc.name, err, tc.wantStoredBefore)
				}
				id, qty, err := db.ClaimKey(t.Context(), c.campaign, c.user, c.key, c.quantity, c.requestID)
				if err != nil || id != tc.wantID || qty != tc.wantQty {
					t.Fatalf("%s: got %q, %d, %v; want %q, %d", tc.name, id, qty, err, tc.wantID, tc.wantQty)
				}
				id, qty, err = db.KeyHolder(t.Context(), c.campaign, c.user, c.key)
				if err != nil || id != tc.wantID || qty != tc.wantQty {
					t.Fatalf("%s: KeyHolder after: got %q, %d, %v; want %q, %d", tc.name, id, qty, err, tc.wantID, tc.wantQty)
				}
			}
		})
	}
}

// TestClaimKeyRace: of many concurrent claims of one key, exactly one
// wins, and every claim gets the winner back.
func TestClaimKeyRace(t *testing.T) {
	const claims = 16
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			got := make([]string, claims)
			errs := make([]error, claims)
			var wg sync.WaitGroup
			for i := range claims {
				wg.Go(func() {
					got[i], _, errs[i] = db.ClaimKey(t.Context(), "c1", "u1", "k", 1, fmt.Sprintf("c1.r%d", i))
				})
			}
			wg.Wait()
			winner := got[0]
			won := false
			for i := range claims {
				if errs[i] != nil {
					t.Fatalf("claim %d: %v", i, errs[i])
				}
				if got[i] != winner {
					t.Fatalf("claim %d: got holder %s, want %s as claim 0 got", i, got[i], winner)
				}
				won = won || winner == fmt.Sprintf("c1.r%d", i)
			}
			if !won {
				t.Fatalf("got holder %s, want one of the claims' request ids", winner)
			}
		})
	}
}
