package auth

import (
	"encoding/base64"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

// TestVerifyStrict: tokens golang-jwt alone would take, signed with the
// right secret, are refused where they are lenient: a date as a numeric
// string, a "crit" header, repeated claims, claims in another case.
func TestVerifyStrict(t *testing.T) {
	j := newMintedTestJWT()
	exp := mintedTestStart.Add(time.Hour).Unix()
	header := func(h string) string { return base64.RawURLEncoding.EncodeToString([]byte(h)) }
	hs256 := header(`{"alg":"HS256","typ":"JWT"}`)
	tests := []struct {
		name     string
		header   string
		claims   string
		wantUser string // "" = refused
	}{
		{name: "other claim order", header: hs256, claims: fmt.Sprintf(`{"exp":%d,"sub":"alice"}`, exp), wantUser: "alice"},
		{name: "extra claims", header: hs256, claims: fmt.Sprintf(`{"sub":"alice","exp":%d,"iss":"shop","role":"x"}`, exp), wantUser: "alice"},
		{name: "header without typ", header: header(`{"alg":"HS256"}`), claims: fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp), wantUser: "alice"},
		{name: "exp as a numeric string", header: hs256, claims: fmt.Sprintf(`{"sub":"alice","exp":"%d"}`, exp)},
		{name: "nbf as a numeric string", header: hs256, claims: fmt.Sprintf(`{"sub":"alice","exp":%d,"nbf":"1"}`, exp)},
		{name: "iat as a numeric string", header: hs256, claims: fmt.Sprintf(`{"sub":"alice","exp":%d,"iat":"1"}`, exp)},
		{name: "crit header", header: header(`{"alg":"HS256","typ":"JWT","crit":["exp"]}`), claims: fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp)},
		{name: "empty crit header", header: header(`{"alg":"HS256","crit":[]}`), claims: fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp)},
		{name: "repeated sub", header: hs256, claims: fmt.Sprintf(`{"sub":"alice","sub":"bob","exp":%d}`, exp)},
		{name: "repeated exp", header: hs256, claims: fmt.Sprintf(`{"sub":"alice","exp":1,"exp":%d}`, exp)},
		{name: "sub in another case", header: hs256, claims: fmt.Sprintf(`{"Sub":"alice","exp":%d}`, exp)},
		{name: "exp in another case", header: hs256, claims: fmt.Sprintf(`{"sub":"alice","EXP":%d}`, exp)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			token := signHS256(j.secret, tc.header, tc.claims)
			got, err := j.Verify(token)
			if tc.wantUser == "" {
				if !errors.Is(err, model.ErrUnauthorized) {
					t.Fatalf("got %q, %v; want %v", got, err, model.ErrUnauthorized)
				}
				return
			}
			if err != nil || got != tc.wantUser {
				t.Fatalf("got %q, %v; want %q", got, err, tc.wantUser)
			}
		})
	}
}

// TestAdminTokenEqual: equal tokens match, anything else does not, and an
// unset token matches nothing.
func TestAdminTokenEqual(t *testing.T) {
	tests := []struct {
		got, want string
		equal     bool
	}{
		{"admin-token-1", "admin-token-1", true},
		{"admin-token-2", "admin-token-1", false},
		{"admin-token-1x", "admin-token-1", false},
		{"admin-token-", "admin-token-1", false},
		{"", "admin-token-1", false},
		{"", "", false},
	}
	for _, tc := range tests {
		if got := AdminTokenEqual(tc.got, tc.want); got != tc.equal {
			t.Errorf("AdminTokenEqual(%q, %q): got %v, want %v", tc.got, tc.want, got, tc.equal)
		}
	}
}

// TestVerifyMaxLifetime: a token whose exp is further ahead than
// Options.MaxLifetime (with the leeway) is refused, however well signed;
// one within it is taken.
func TestVerifyMaxLifetime(t *testing.T) {
	j := newMintedTestJWT()
	j.maxLifetime = 24 * time.Hour
	hs256 := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	for _, tc := range []struct {
		name string
		exp  time.Time
		ok   bool
	}{
		{"within the bound", mintedTestStart.Add(24 * time.Hour), true},
		{"at the bound and the leeway", mintedTestStart.Add(24*time.Hour + j.leeway), true},
		{"beyond it", mintedTestStart.Add(25 * time.Hour), false},
		{"the year 9999", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := j.Verify(signHS256(j.secret, hs256, fmt.Sprintf(`{"sub":"alice","exp":%d}`, tc.exp.Unix())))
			if tc.ok != (err == nil) || (tc.ok && got != "alice") || (!tc.ok && !errors.Is(err, model.ErrUnauthorized)) {
				t.Fatalf("got %q, %v; want ok %v (refusals %v)", got, err, tc.ok, model.ErrUnauthorized)
			}
		})
	}
}
