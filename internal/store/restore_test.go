package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// TestRestoreLock: one holder at a time; restore.lua releases it for its
// token only (reply 1), and a stranger's token changes nothing (reply 0).
func TestRestoreLock(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 1, 1)
		token, err := s.LockRestore(t.Context(), c.ID, 10*time.Second)
		if err != nil || token == "" {
			t.Fatalf("lock: got %q, %v; want a token", token, err)
		}
		if again, err := s.LockRestore(t.Context(), c.ID, 10*time.Second); err != nil || again != "" {
			t.Fatalf("lock while held: got %q, %v; want \"\"", again, err)
		}
		if released, err := s.UnlockRestore(t.Context(), c.ID, "someone-else"); err != nil || released {
			t.Fatalf("unlock with another token: got %v, %v; want false", released, err)
		}
		if again, err := s.LockRestore(t.Context(), c.ID, 10*time.Second); err != nil || again != "" {
			t.Fatalf("lock after a stranger's unlock: got %q, %v; want \"\" (still held)", again, err)
		}
		if released, err := s.UnlockRestore(t.Context(), c.ID, token); err != nil || !released {
			t.Fatalf("unlock: got %v, %v; want true", released, err)
		}
		next, err := s.LockRestore(t.Context(), c.ID, 10*time.Second)
		if err != nil || next == "" || next == token {
			t.Fatalf("lock after the unlock: got %q, %v; want a new token", next, err)
		}
		if released, err := s.UnlockRestore(t.Context(), c.ID, token); err != nil || released {
			t.Fatalf("unlock with the old token: got %v, %v; want false", released, err)
		}
		if released, err := s.UnlockRestore(t.Context(), c.ID, next); err != nil || !released {
			t.Fatalf("unlock: got %v, %v; want true", released, err)
		}
	})
}

// TestRestoreLockExpires: a holder that died frees the lock after its TTL.
func TestRestoreLockExpires(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 1, 1)
		if token, err := s.LockRestore(t.Context(), c.ID, 50*time.Millisecond); err != nil || token == "" {
			t.Fatalf("lock: got %q, %v; want a token", token, err)
		}
		ttl, err := s.rdb.PTTL(t.Context(), campaignKeys(c.ID).restore).Result()
		if err != nil || ttl <= 0 || ttl > 50*time.Millisecond {
			t.Fatalf("lock TTL: got %v, %v; want at most 50ms", ttl, err)
		}
		var token string
		testenv.Eventually(t, 5*time.Second, "the lock expired", func() (bool, string) {
			token, err = s.LockRestore(t.Context(), c.ID, 10*time.Second)
			return err == nil && token != "", fmt.Sprint(err)
		})
		if _, err := s.UnlockRestore(t.Context(), c.ID, token); err != nil {
			t.Fatal(err)
		}
	})
}

// TestBehind: Redis is behind the ledger when it lacks the campaign, or a
// bucket of it, or holds an older epoch.
func TestBehind(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		behind := func(c model.Campaign) bool {
			t.Helper()
			got, err := s.Behind(t.Context(), c)
			if err != nil {
				t.Fatalf("behind: %v", err)
			}
			return got
		}
		c := newCampaign(t, 5, 1)
		if !behind(c) {
			t.Errorf("not loaded: got false, want true")
		}
		mustLoad(t, s, c)
		if behind(c) {
			t.Errorf("loaded at the ledger's epoch: got true, want false")
		}
		next := c
		next.Epoch++
		if !behind(next) {
			t.Errorf("loaded at an older epoch than the ledger's: got false, want true")
		}

		b := newCampaign(t, 6, 1)
		b.Buckets = 3
		mustLoad(t, s, b)
		if behind(b) {
			t.Errorf("bucketed, loaded: got true, want false")
		}
		if err := s.rdb.Del(t.Context(), campaignKeys(model.BucketTag(b.ID, 1, 3)).meta).Err(); err != nil {
			t.Fatal(err)
		}
		if !behind(b) {
			t.Errorf("bucketed, a bucket lost: got false, want true")
		}
	})
}
