package auth

import (
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/wire"
)

// maxExactSeconds bounds the dates read here to those golang-jwt's float64
// parsing keeps exact.
const maxExactSeconds = 1 << 53

// mintedClaims reads claims in the shape Mint writes with wire.Decoder:
// "sub" a plain string, "exp", "nbf" and "iat" whole seconds, no other
// member; ok is false for anything else. What it reads equals what
// encoding/json reads into jwt.RegisteredClaims (tested and fuzzed); a sale
// verifies every shopper's token once, and reflection-driven decoding was
// most of that (docs/BENCHMARKS.md).
func mintedClaims(b []byte) (rc jwt.RegisteredClaims, ok bool) {
	d := wire.NewDecoder(b)
	date := func(dst **jwt.NumericDate) bool {
		secs, ok := d.Int()
		if !ok || secs <= -maxExactSeconds || secs >= maxExactSeconds {
			return false
		}
		*dst = jwt.NewNumericDate(time.Unix(secs, 0))
		return true
	}
	ok = d.Members(func(key string) (uint16, bool) {
		switch key {
		case "sub":
			var ok bool
			rc.Subject, ok = d.Str()
			return 1, ok
		case "exp":
			return 1 << 1, date(&rc.ExpiresAt)
		case "nbf":
			return 1 << 2, date(&rc.NotBefore)
		case "iat":
			return 1 << 3, date(&rc.IssuedAt)
		}
		return 0, false
	})
	return rc, ok
}
