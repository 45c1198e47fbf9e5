// Package auth verifies shoppers' JWTs and admins' bearer tokens.
package auth

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"flashsale/model"
)

// JWT mints and verifies HS256 shopper tokens. The algorithm is pinned, so a
// token signed with "none" or an asymmetric algorithm is refused.
type JWT struct {
	secret []byte
	leeway time.Duration
	now    func() time.Time
	cache  *verified
}

// NewJWT returns a JWT with secret and the clock skew it tolerates on exp/nbf.
func NewJWT(secret []byte, leeway time.Duration) *JWT {
	return &JWT{secret: secret, leeway: leeway, now: time.Now, cache: newVerified(defaultVerifiedEntries)}
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
	var claims shopperClaims
	_, err := jwt.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return j.secret, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithLeeway(j.leeway),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(j.now),
	)
	if err != nil {
		return "", fmt.Errorf("%w: %v", model.ErrUnauthorized, err)
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
