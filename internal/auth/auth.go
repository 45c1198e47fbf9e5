// Package auth verifies shoppers' JWTs and admins' bearer tokens.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/wire"
	"github.com/flashsale/flashsale/model"
)

// JWT mints HS256 shopper tokens and verifies shopper tokens: HS256 with
// the shared secret (the embedded default, tests, load tests) and, with a
// JWKS URL, the identity provider's RS256/ES256 tokens (jwks.go). The
// algorithms are pinned, so a token signed with "none" or any algorithm not
// configured is refused, and each algorithm has its own key: an HS256 token
// is checked with the secret, never with a provider's public key.
type JWT struct {
	secret []byte
	leeway time.Duration
	now    func() time.Time
	cache  *verified
	// minted checks the claims of tokens in Mint's exact form (verifyMinted).
	minted *jwt.Validator
	// algorithms are the accepted "alg" values; hs256 says HS256 is one.
	algorithms []string
	hs256      bool
	// issuer and audience, when set, must be the token's iss and one of its aud.
	issuer, audience string
	// keys is the provider's key set, nil without a JWKS URL; keysFresh
	// bounds how long a token checked with it is served from the cache,
	// so a key the provider withdrew stops working within that time.
	keys      keyfunc.Keyfunc
	keysFresh time.Duration
	// maxLifetime bounds exp from now (Options.MaxLifetime); 0: none.
	maxLifetime time.Duration
}

// NewJWT returns an HS256-only JWT with secret and the clock skew it
// tolerates on exp/nbf.
func NewJWT(secret []byte, leeway time.Duration) *JWT {
	j, _ := New(context.Background(), secret, Options{Leeway: leeway}) // fails only with a JWKS URL
	return j
}

// New returns a JWT with secret and opts. With opts.JWKSURL it fetches the
// key set once (an error if it cannot) and keeps it fresh until ctx ends.
func New(ctx context.Context, secret []byte, opts Options) (*JWT, error) {
	j := &JWT{secret: secret, leeway: opts.Leeway, now: time.Now, cache: newVerified(defaultVerifiedEntries),
		algorithms: opts.Algorithms, issuer: opts.Issuer, audience: opts.Audience, maxLifetime: opts.MaxLifetime}
	if len(j.algorithms) == 0 {
		j.algorithms = []string{jwt.SigningMethodHS256.Alg()}
		if opts.JWKSURL != "" {
			j.algorithms = DefaultProviderAlgorithms
		}
	}
	j.hs256 = slices.Contains(j.algorithms, jwt.SigningMethodHS256.Alg())
	if opts.JWKSURL != "" {
		if err := j.openKeys(ctx, opts); err != nil {
			return nil, err
		}
	}
	j.minted = jwt.NewValidator(j.parserOptions()...)
	return j, nil
}

// parserOptions are golang-jwt's checks of a shopper token: the configured
// algorithms only, exp required, nbf/exp with the leeway, on j's clock, and
// iss and aud when configured.
func (j *JWT) parserOptions() []jwt.ParserOption {
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(j.algorithms),
		jwt.WithLeeway(j.leeway),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(func() time.Time { return j.now() }),
	}
	if j.issuer != "" {
		opts = append(opts, jwt.WithIssuer(j.issuer))
	}
	if j.audience != "" {
		opts = append(opts, jwt.WithAudience(j.audience))
	}
	return opts
}

// Mint returns a token for userID valid for ttl.
func (j *JWT) Mint(userID string, ttl time.Duration) (string, error) {
	if why := model.CheckUserID(userID); why != "" {
		return "", model.Invalid("user_id", why)
	}
	now := j.now()
	claims := jwt.RegisteredClaims{
		Issuer:    j.issuer,
		Subject:   userID,
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}
	if j.audience != "" {
		claims.Audience = jwt.ClaimStrings{j.audience}
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(j.secret)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}

// Verify returns the user id (subject) of a valid token, or an error wrapping
// model.ErrUnauthorized.
func (j *JWT) Verify(token string) (string, error) {
	if user, ok := j.cache.lookup(token, j.now(), j.leeway); ok {
		return user, nil
	}
	var claims jwt.RegisteredClaims
	ok, byKeySet := false, false
	if j.hs256 {
		claims, ok = j.verifyMinted(token)
	}
	if !ok {
		// Anything else, and every failure, gets golang-jwt's whole parse
		// and its error.
		var err error
		if claims, byKeySet, err = j.parse(token); err != nil {
			return "", fmt.Errorf("%w: %v", model.ErrUnauthorized, err)
		}
	}
	if why := model.CheckUserID(claims.Subject); why != "" {
		return "", &model.AuthError{Reason: "token subject (sub) " + why}
	}
	// exp is required above, so it is set; nbf is optional.
	if j.maxLifetime > 0 && claims.ExpiresAt.After(j.now().Add(j.maxLifetime+j.leeway)) {
		return "", &model.AuthError{Reason: fmt.Sprintf("token expiry (exp) more than %s ahead (auth.max_token_lifetime)", j.maxLifetime)}
	}
	e := verifiedToken{subject: claims.Subject, expiresAt: claims.ExpiresAt.Time}
	if claims.NotBefore != nil {
		e.notBefore = claims.NotBefore.Time
	}
	if fresh := j.now().Add(j.keysFresh); byKeySet && fresh.Before(e.expiresAt) {
		e.expiresAt = fresh
	}
	j.cache.store(token, e)
	return claims.Subject, nil
}

// parse is golang-jwt's whole parse of a token, and stricter than it where
// it is lenient: a "crit" header (extensions the token says must be
// understood; this verifier understands none, RFC 7515 4.1.11) and lenient
// claims (strictClaims) are refused.
func (j *JWT) parse(token string) (claims jwt.RegisteredClaims, byKeySet bool, err error) {
	var strict strictClaims
	_, err = jwt.ParseWithClaims(token, &strict, func(t *jwt.Token) (any, error) {
		if _, ok := t.Header["crit"]; ok {
			return nil, errCritical
		}
		// golang-jwt has checked the algorithm against j.algorithms
		// already; each has its own key.
		if t.Method.Alg() == jwt.SigningMethodHS256.Alg() {
			return j.secret, nil
		}
		if j.keys == nil {
			return nil, errNoKeySet
		}
		byKeySet = true
		return j.keys.Keyfunc(t)
	}, j.parserOptions()...)
	return strict.RegisteredClaims, byKeySet, err
}

var errNoKeySet = errors.New("no JWKS URL configured for this algorithm")

var errCritical = errors.New(`"crit" header: no extension is understood`)

// strictClaims are jwt.RegisteredClaims read strictly. encoding/json, and
// so golang-jwt, reads a date given as a numeric string ("exp":"1893456000"),
// a repeated claim (the last one wins) and a claim in another case ("EXP");
// RFC 7519 makes dates numbers, and the others let a token say one thing to
// one reader and another to the next.
type strictClaims struct{ jwt.RegisteredClaims }

func (c *strictClaims) UnmarshalJSON(b []byte) error {
	if err := wire.CheckKeys(b, reflect.TypeFor[jwt.RegisteredClaims]()); err != nil {
		return err
	}
	var dates struct {
		Exp json.RawMessage `json:"exp"`
		Nbf json.RawMessage `json:"nbf"`
		Iat json.RawMessage `json:"iat"`
	}
	if err := json.Unmarshal(b, &dates); err != nil {
		return err
	}
	for _, d := range [...]json.RawMessage{dates.Exp, dates.Nbf, dates.Iat} {
		if len(d) > 0 && d[0] == '"' {
			return errors.New("a date claim must be a number")
		}
	}
	return json.Unmarshal(b, &c.RegisteredClaims)
}

// mintedPrefix is the header segment of every token Mint signs,
// {"alg":"HS256","typ":"JWT"} as golang-jwt encodes it, and its dot.
var mintedPrefix = func() string {
	s, err := jwt.New(jwt.SigningMethodHS256).SigningString()
	if err != nil {
		panic(err)
	}
	header, _, _ := strings.Cut(s, ".")
	return header + "."
}()

// verifyMinted verifies a token in the exact form Mint writes, the form of
// every token of a sale: the header segment is mintedPrefix's, so the
// algorithm is known to be HS256 without decoding the header into a map
// (much of a fresh token's verification, docs/BENCHMARKS.md), and the
// claims are mintedClaims' shape. golang-jwt still checks the HMAC and
// validates the claims as ParseWithClaims would. ok is false for any other
// token and for any failure; the caller then runs parse, so errors
// stay golang-jwt's and a true here always agrees with it (tested and fuzzed).
func (j *JWT) verifyMinted(token string) (claims jwt.RegisteredClaims, ok bool) {
	rest, found := strings.CutPrefix(token, mintedPrefix)
	if !found {
		return claims, false
	}
	payload, signature, found := strings.Cut(rest, ".")
	if !found || strings.Contains(signature, ".") {
		return claims, false
	}
	sig, err := base64.RawURLEncoding.DecodeString(signature)
	if err != nil {
		return claims, false
	}
	signed := token[:len(mintedPrefix)+len(payload)]
	if jwt.SigningMethodHS256.Verify(signed, sig, j.secret) != nil {
		return claims, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return claims, false
	}
	if claims, ok = mintedClaims(raw); !ok || j.minted.Validate(&claims) != nil {
		return jwt.RegisteredClaims{}, false
	}
	return claims, true
}

// AdminTokenEqual compares a presented admin token with the configured one in
// constant time, so response timing reveals nothing about the secret: both
// are hashed first, so neither the compare nor its early return on unequal
// lengths depends on the secret's length or content.
func AdminTokenEqual(got, want string) bool {
	if want == "" {
		return false
	}
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// ErrNoToken is returned when a request carries no bearer token.
var ErrNoToken = errors.New("no bearer token")
