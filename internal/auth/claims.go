package auth

import (
	"encoding/json"
	"strconv"
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

// maxDateDigits keeps a date exact through golang-jwt's float64 parsing.
const maxDateDigits = 15

// mintedClaims parses exactly {"sub":S,"exp":N,"nbf":N,"iat":N} with S a
// string that needs no unescaping and N plain decimal seconds; ok is false
// for anything else.
func mintedClaims(b []byte) (rc jwt.RegisteredClaims, ok bool) {
	rest, ok := cut(b, `{"sub":"`)
	if !ok {
		return rc, false
	}
	end := 0
	for end < len(rest) && rest[end] != '"' {
		end++
	}
	if end == len(rest) || !model.JSONSafe(string(rest[:end])) {
		return rc, false
	}
	rc.Subject = string(rest[:end])
	rest = rest[end+1:]
	for _, f := range []struct {
		prefix string
		date   **jwt.NumericDate
	}{{`,"exp":`, &rc.ExpiresAt}, {`,"nbf":`, &rc.NotBefore}, {`,"iat":`, &rc.IssuedAt}} {
		if rest, ok = cut(rest, f.prefix); !ok {
			return rc, false
		}
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 0 || n > maxDateDigits || (rest[0] == '0' && n > 1) {
			return rc, false
		}
		secs, err := strconv.ParseInt(string(rest[:n]), 10, 64)
		if err != nil {
			return rc, false
		}
		*f.date = jwt.NewNumericDate(time.Unix(secs, 0))
		rest = rest[n:]
	}
	return rc, string(rest) == "}"
}

// cut returns b after prefix, if b starts with it.
func cut(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return nil, false
	}
	return b[len(prefix):], true
}
