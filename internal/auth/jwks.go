package auth

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"golang.org/x/time/rate"
)

// Options configure a JWT beyond its HS256 secret.
type Options struct {
	// Leeway is the clock skew tolerated on exp and nbf.
	Leeway time.Duration
	// Algorithms are the accepted "alg" values: HS256 alone by default,
	// DefaultProviderAlgorithms with a JWKSURL. HS256 is checked with the
	// secret, every other one with the key set.
	Algorithms []string
	// MaxLifetime bounds how far in the future a token's exp may be
	// (beyond the leeway): a token valid for longer, stolen, would be good
	// for that long. 0: no bound.
	MaxLifetime time.Duration
	// Issuer and Audience, when set, must be the token's iss and among its
	// aud (every token's, minted ones included).
	Issuer, Audience string
	// JWKSURL is the identity provider's key set (RFC 7517), e.g.
	// https://tenant.auth0.com/.well-known/jwks.json.
	JWKSURL string
	// JWKSRefresh is how often the key set is fetched again, so keys the
	// provider rotates in are known and keys it withdraws stop working.
	JWKSRefresh time.Duration
	// JWKSUnknownKID is the least time between two fetches for a token whose
	// key id ("kid") the set lacks: a key rotated in is picked up at once,
	// and tokens with made-up ids cannot make the gateway hammer the
	// provider.
	JWKSUnknownKID time.Duration
	// HTTPTimeout bounds one fetch of the key set.
	HTTPTimeout time.Duration
	// Log receives failed refreshes (the keys already held stay in use).
	Log *slog.Logger
}

// SupportedAlgorithms are the "alg" values Options.Algorithms may name.
var SupportedAlgorithms = []string{"HS256", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// DefaultProviderAlgorithms are the algorithms accepted with a JWKS URL and
// no Options.Algorithms: what identity providers sign with.
var DefaultProviderAlgorithms = []string{"RS256", "ES256"}

// openKeys fetches the key set at opts.JWKSURL (keyfunc over jwkset) and
// keeps it fresh in the background until ctx ends.
func (j *JWT) openKeys(ctx context.Context, opts Options) error {
	if opts.HTTPTimeout <= 0 {
		opts.HTTPTimeout = 10 * time.Second
	}
	if opts.JWKSRefresh <= 0 {
		opts.JWKSRefresh = time.Hour
	}
	if opts.JWKSUnknownKID <= 0 {
		opts.JWKSUnknownKID = time.Minute
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	failOnFirst := false // a wrong URL fails at start, not on every token
	keys, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{opts.JWKSURL}, keyfunc.Override{
		Client:                    &http.Client{Timeout: opts.HTTPTimeout},
		HTTPTimeout:               opts.HTTPTimeout,
		NoErrorReturnFirstHTTPReq: &failOnFirst,
		RefreshInterval:           opts.JWKSRefresh,
		// One token a JWKSUnknownKID: a token with an unknown kid fetches
		// at once when one is there; when none is, the wait is longer than
		// RateLimitWaitMax (unless within its last moments) and the token
		// is refused at once instead of holding its request.
		RefreshUnknownKID: rate.NewLimiter(rate.Every(opts.JWKSUnknownKID), 1),
		RateLimitWaitMax:  opts.HTTPTimeout,
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(_ context.Context, err error) {
				log.Warn("refresh JWKS: keeping the keys held", "url", u, "err", err)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("jwks %s: %w", opts.JWKSURL, err)
	}
	j.keys, j.keysFresh = keys, opts.JWKSRefresh
	return nil
}
