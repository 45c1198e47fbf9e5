package auth

import (
	"errors"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

// TestVerifyCached: a token verified once is served from the cache, but
// only while its time claims hold, and only for the exact token string.
func TestVerifyCached(t *testing.T) {
	start := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		tamper   func(string) string
		later    time.Duration // clock moved after the first Verify
		wantUser string        // "" = want ErrUnauthorized
	}{
		{name: "same token again", later: time.Minute, wantUser: "alice"},
		{name: "expired since it was cached", later: time.Hour + 2*time.Second},
		{name: "within the leeway after exp", later: time.Hour + 500*time.Millisecond, wantUser: "alice"},
		{name: "signature changed", tamper: func(s string) string { return s[:len(s)-2] + "xx" }},
		{name: "payload changed", tamper: func(s string) string { return s[:40] + flip(s[40]) + s[41:] }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := start
			j := NewJWT([]byte("cache-test-secret-0123456789abcdef0123"), time.Second)
			j.now = func() time.Time { return now }
			tok, err := j.Mint("alice", time.Hour)
			if err != nil {
				t.Fatalf("Mint: %v", err)
			}
			if got, err := j.Verify(tok); err != nil || got != "alice" {
				t.Fatalf("first Verify: got %q, %v; want alice", got, err)
			}
			now = now.Add(tt.later)
			if tt.tamper != nil {
				tok = tt.tamper(tok)
			}
			got, err := j.Verify(tok)
			if tt.wantUser == "" {
				if !errors.Is(err, model.ErrUnauthorized) {
					t.Fatalf("Verify: got %q, %v; want %v", got, err, model.ErrUnauthorized)
				}
				return
			}
			if err != nil || got != tt.wantUser {
				t.Fatalf("Verify: got %q, %v; want %q", got, err, tt.wantUser)
			}
		})
	}
}

// flip returns a base64url character other than c.
func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}

// TestVerifiedBounded: a full cache forgets entries instead of growing.
func TestVerifiedBounded(t *testing.T) {
	v := newVerified(100)
	exp := time.Now().Add(time.Hour)
	for i := range 1000 {
		v.store(string(rune('a'+i%26))+time.Duration(i).String(), verifiedToken{subject: "u", expiresAt: exp})
	}
	if n := len(v.entries); n > 100 {
		t.Fatalf("got %d entries, want at most 100", n)
	}
}
