package auth

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/model"
)

// TestVerifyProviderSubjects: any subject an identity provider issues is
// the user id, whether minted here or signed elsewhere; an empty, oversized
// or unprintable one is refused with why.
func TestVerifyProviderSubjects(t *testing.T) {
	j := newMintedTestJWT()
	exp := mintedTestStart.Add(time.Hour)
	tests := []struct {
		name, sub  string
		wantReason string // "" = accepted
	}{
		{name: "auth0", sub: "auth0|5f7c8ec7b4a1d2006b1f0e3a"},
		{name: "google", sub: "google-oauth2|1234"},
		{name: "non-ASCII", sub: "Zoë|日本語"},
		{name: "quotes and backslashes", sub: `a"b\c`},
		{name: "255 bytes", sub: strings.Repeat("é", 127) + "a"},
		{name: "256 bytes", sub: strings.Repeat("é", 128), wantReason: "token subject (sub) longer than 255 bytes"},
		{name: "empty", sub: "", wantReason: "token subject (sub) empty"},
		{name: "control character", sub: "a\u0007b", wantReason: "token subject (sub) holds the unprintable character U+0007"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			signed, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: tc.sub,
				ExpiresAt: jwt.NewNumericDate(exp)}).SignedString(j.secret)
			if err != nil {
				t.Fatalf("sign: %v", err)
			}
			minted, mintErr := j.Mint(tc.sub, time.Hour)
			for _, token := range []string{signed, minted} {
				if token == "" {
					if tc.wantReason == "" {
						t.Fatalf("Mint(%q): %v", tc.sub, mintErr)
					}
					continue // Mint refuses what Verify would
				}
				got, err := j.Verify(token)
				if tc.wantReason == "" {
					if err != nil || got != tc.sub {
						t.Fatalf("Verify: got %q, %v; want %q", got, err, tc.sub)
					}
					continue
				}
				var ae *model.AuthError
				if !errors.As(err, &ae) || !errors.Is(err, model.ErrUnauthorized) || ae.Reason != tc.wantReason {
					t.Fatalf("Verify: got %q, %v; want %v with reason %q", got, err, model.ErrUnauthorized, tc.wantReason)
				}
			}
			if tc.wantReason != "" && mintErr == nil {
				t.Fatalf("Mint(%q): got no error", tc.sub)
			}
		})
	}
}
