package auth

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// sameAsRegisteredClaims fails unless what mintedClaims reads from b is
// exactly what encoding/json reads into jwt.RegisteredClaims; anything it
// refuses goes to golang-jwt's own parse.
func sameAsRegisteredClaims(t *testing.T, b []byte) {
	t.Helper()
	got, ok := mintedClaims(b)
	if !ok {
		return
	}
	var want jwt.RegisteredClaims
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("claims %q: mintedClaims read them, encoding/json refuses them: %v", b, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("claims %q: got %+v, want %+v", b, got, want)
	}
}

func TestMintedClaimsDecodeAsRegisteredClaims(t *testing.T) {
	tests := []struct{ name, claims string }{
		{"as minted", `{"sub":"alice","exp":1893456000,"nbf":1893452400,"iat":1893452400}`},
		{"odd subject", `{"sub":"a.b@c:d-e_f","exp":1,"nbf":0,"iat":0}`},
		{"escaped subject", `{"sub":"al\u0069ce","exp":1893456000,"nbf":1,"iat":1}`},
		{"quote in subject", `{"sub":"a\"b","exp":1893456000,"nbf":1,"iat":1}`},
		{"non-ASCII subject", `{"sub":"ünï","exp":1893456000,"nbf":1,"iat":1}`},
		{"fractional date", `{"sub":"alice","exp":1893456000.5,"nbf":1,"iat":1}`},
		{"exponent date", `{"sub":"alice","exp":1.8e9,"nbf":1,"iat":1}`},
		{"negative date", `{"sub":"alice","exp":-5,"nbf":1,"iat":1}`},
		{"leading zero", `{"sub":"alice","exp":01,"nbf":1,"iat":1}`},
		{"sixteen digits", `{"sub":"alice","exp":1234567890123456,"nbf":1,"iat":1}`},
		{"string date", `{"sub":"alice","exp":"1893456000","nbf":1,"iat":1}`},
		{"no nbf", `{"sub":"alice","exp":1893456000,"iat":1}`},
		{"other order", `{"exp":1893456000,"sub":"alice","nbf":1,"iat":1}`},
		{"spaces", `{ "sub":"alice","exp":1893456000,"nbf":1,"iat":1}`},
		{"extra claim", `{"sub":"alice","exp":1893456000,"nbf":1,"iat":1,"admin":true}`},
		{"issuer", `{"iss":"x","sub":"alice","exp":1893456000,"nbf":1,"iat":1}`},
		{"repeated sub", `{"sub":"alice","sub":"bob","exp":1893456000,"nbf":1,"iat":1}`},
		{"other case key", `{"Sub":"alice","exp":1893456000,"nbf":1,"iat":1}`},
		{"null sub", `{"sub":null,"exp":1893456000,"nbf":1,"iat":1}`},
		{"empty object", `{}`},
		{"array", `[]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { sameAsRegisteredClaims(t, []byte(tc.claims)) })
	}
}

// TestMintedClaimsTakeTheFastPath: what Mint writes is what the fast path
// reads, so the speed-up is real and not a silent fallback.
func TestMintedClaimsTakeTheFastPath(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	rc := jwt.RegisteredClaims{Subject: "shopper-1@x", IssuedAt: jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}
	b, err := json.Marshal(rc)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := mintedClaims(b)
	if !ok {
		t.Fatalf("claims %s: fast path refused them", b)
	}
	var want jwt.RegisteredClaims
	if err := json.Unmarshal(b, &want); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("claims %s: got %+v, want %+v (%v)", b, got, want, err)
	}
}

func FuzzMintedClaims(f *testing.F) {
	for _, s := range []string{`{"sub":"alice","exp":1893456000,"nbf":1893452400,"iat":1893452400}`,
		`{"sub":"a\"b","exp":1,"nbf":1,"iat":1}`, `{"sub":"alice","exp":1e3,"nbf":1,"iat":1}`, `{}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sameAsRegisteredClaims(t, []byte(s))
	})
}

// BenchmarkVerify: a token seen for the first time (every shopper's first
// purchase) and one seen before (the verified-token cache).
func BenchmarkVerify(b *testing.B) {
	j := NewJWT([]byte("bench-jwt-secret-0123456789abcdef0123456789"), time.Second)
	toks := make([]string, 100_000)
	for i := range toks {
		toks[i], _ = j.Mint(fmt.Sprintf("shopper%d", i), time.Hour)
	}
	b.Run("fresh", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if i%len(toks) == 0 {
				j.cache = newVerified(len(toks)) // every token unseen again
			}
			if _, err := j.Verify(toks[i%len(toks)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("cached", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if _, err := j.Verify(toks[i%1000]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
