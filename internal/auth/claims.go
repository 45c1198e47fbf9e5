package auth

import (
	"encoding/json"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"flashsale/model"
)

// shopperClaims are a shopper token's registered claims. golang-jwt decodes
// them through UnmarshalJSON and still does all the checking (signature,
// algorithm, exp/nbf); only the decoding is ours, and only for the exact
// form Mint writes: a sale verifies every shopper's token once, and
// reflection-driven decoding was most of that (docs/BENCHMARKS.md).
type shopperClaims struct {
	jwt.RegisteredClaims
}

// UnmarshalJSON decodes b as encoding/json decodes it into
// jwt.RegisteredClaims (tested and fuzzed for equality).
func (c *shopperClaims) UnmarshalJSON(b []byte) error {
	if rc, ok := mintedClaims(b); ok {
		c.RegisteredClaims = rc
		return nil
	}
	return json.Unmarshal(b, &c.RegisteredClaims)
}

// maxExactSeconds bounds the dates read here to those golang-jwt's float64
// parsing keeps exact.
const maxExactSeconds = 1 << 53

// mintedClaims reads claims in the shape Mint writes with model.LiteDecoder:
// "sub" a plain string, "exp", "nbf" and "iat" whole seconds, no other
// member; ok is false for anything else.
func mintedClaims(b []byte) (rc jwt.RegisteredClaims, ok bool) {
	d := model.NewLiteDecoder(b)
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
