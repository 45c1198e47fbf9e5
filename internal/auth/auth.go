// Package auth verifies shoppers' JWTs and admins' bearer tokens.
package auth

import (
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/model"
)

// JWT mints and verifies HS256 shopper tokens. The algorithm is pinned, so a
// token signed with "none" or an asymmetric algorithm is refused.
type JWT struct {
	secret []byte
	leeway time.Duration
	now    func() time.Time
	cache  *verified
	// minted checks the claims of tokens in Mint's exact form (verifyMinted).
	minted *jwt.Validator
}

// NewJWT returns a JWT with secret and the clock skew it tolerates on exp/nbf.
func NewJWT(secret []byte, leeway time.Duration) *JWT {
	j := &JWT{secret: secret, leeway: leeway, now: time.Now, cache: newVerified(defaultVerifiedEntries)}
	j.minted = jwt.NewValidator(j.parserOptions()...)
	return j
}

// parserOptions are golang-jwt's checks of a shopper token: HS256 only, exp
// required, nbf/exp with the leeway, on j's clock.
func (j *JWT) parserOptions() []jwt.ParserOption {
	return []jwt.ParserOption{
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithLeeway(j.leeway),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(func() time.Time { return j.now() }),
	}
}

// Mint returns a token for userID valid for ttl.
func (j *JWT) Mint(userID string, ttl time.Duration) (string, error) {
	if !model.ValidUserID(userID) {
		return "", model.Invalid("user_id", "must match [A-Za-z0-9_.@:-]{1,128}")
	}
	now := j.now()
	claims := jwt.RegisteredClaims{
		Subject:   userID,
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
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
	claims, ok := j.verifyMinted(token)
	if !ok {
		// Anything else, and every failure, gets golang-jwt's whole parse
		// and its error.
		claims = jwt.RegisteredClaims{}
		_, err := jwt.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return j.secret, nil },
			j.parserOptions()...)
		if err != nil {
			return "", fmt.Errorf("%w: %v", model.ErrUnauthorized, err)
		}
	}
	if !model.ValidUserID(claims.Subject) {
		return "", fmt.Errorf("%w: subject malformed", model.ErrUnauthorized)
	}
	// exp is required above, so it is set; nbf is optional.
	e := verifiedToken{subject: claims.Subject, expiresAt: claims.ExpiresAt.Time}
	if claims.NotBefore != nil {
		e.notBefore = claims.NotBefore.Time
	}
	j.cache.store(token, e)
	return claims.Subject, nil
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
// token and for any failure; the caller then runs ParseWithClaims, so errors
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
// constant time, so response timing reveals nothing about the secret.
func AdminTokenEqual(got, want string) bool {
	if want == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// ErrNoToken is returned when a request carries no bearer token.
var ErrNoToken = errors.New("no bearer token")
