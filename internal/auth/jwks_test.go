package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

const (
	testIssuer   = "https://idp.example.test/"
	testAudience = "flashsale-api"
)

// provider is an identity provider as the gateway sees one: a JWKS URL
// served by the test, whose keys it can rotate, counting every fetch.
type provider struct {
	t       *testing.T
	srv     *httptest.Server
	fetches atomic.Int64
	mu      sync.Mutex
	set     []byte
	private map[string]any // kid -> private key
}

func newProvider(t *testing.T) *provider {
	p := &provider{t: t, private: map[string]any{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.fetches.Add(1)
		p.mu.Lock()
		defer p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(p.set)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// newKey makes a key of alg's kind under kid, not yet published.
func (p *provider) newKey(kid string, alg jwkset.ALG) {
	p.t.Helper()
	var key any
	var err error
	switch alg {
	case jwkset.AlgRS256:
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	case jwkset.AlgES256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	if err != nil {
		p.t.Fatalf("generate %s key: %v", alg, err)
	}
	p.private[kid] = key
}

// publish makes the set the public keys of kids, with their alg.
func (p *provider) publish(kids ...string) {
	p.t.Helper()
	store := jwkset.NewMemoryStorage()
	for _, kid := range kids {
		var pub any
		alg := jwkset.AlgRS256
		switch k := p.private[kid].(type) {
		case *rsa.PrivateKey:
			pub = &k.PublicKey
		case *ecdsa.PrivateKey:
			pub, alg = &k.PublicKey, jwkset.AlgES256
		}
		jwk, err := jwkset.NewJWKFromKey(pub, jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: kid, ALG: alg, USE: jwkset.UseSig}})
		if err != nil {
			p.t.Fatalf("jwk %s: %v", kid, err)
		}
		if err := store.KeyWrite(context.Background(), jwk); err != nil {
			p.t.Fatalf("write jwk %s: %v", kid, err)
		}
	}
	set, err := store.JSONPublic(context.Background())
	if err != nil {
		p.t.Fatalf("jwks json: %v", err)
	}
	p.mu.Lock()
	p.set = set
	p.mu.Unlock()
}

// claims are a valid token's for sub.
func providerClaims(sub string) jwt.RegisteredClaims {
	return jwt.RegisteredClaims{Subject: sub, Issuer: testIssuer, Audience: jwt.ClaimStrings{testAudience},
		IssuedAt: jwt.NewNumericDate(time.Now()), ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}
}

// sign signs claims with kid's key (its own kind of algorithm).
func (p *provider) sign(kid string, claims jwt.Claims) string {
	p.t.Helper()
	method := jwt.SigningMethod(jwt.SigningMethodRS256)
	if _, ok := p.private[kid].(*ecdsa.PrivateKey); ok {
		method = jwt.SigningMethodES256
	}
	tok := jwt.NewWithClaims(method, claims)
	tok.Header["kid"] = kid
	s, err := tok.SignedString(p.private[kid])
	if err != nil {
		p.t.Fatalf("sign with %s: %v", kid, err)
	}
	return s
}

func (p *provider) jwt(t *testing.T, opts Options) *JWT {
	t.Helper()
	opts.JWKSURL, opts.Issuer, opts.Audience = p.srv.URL, testIssuer, testAudience
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // ends the refresh goroutine
	j, err := New(ctx, []byte(testSecret), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return j
}

const testSecret = "jwks-test-secret-0123456789abcdef0123"

func mustVerify(t *testing.T, j *JWT, token, want string) {
	t.Helper()
	if got, err := j.Verify(token); err != nil || got != want {
		t.Fatalf("Verify: got %q, %v; want %q", got, err, want)
	}
}

func mustRefuse(t *testing.T, j *JWT, token string) {
	t.Helper()
	if got, err := j.Verify(token); !errors.Is(err, model.ErrUnauthorized) {
		t.Fatalf("Verify: got %q, %v; want %v", got, err, model.ErrUnauthorized)
	}
}

// TestJWKS: RS256 and ES256 tokens of the provider's keys verify; a wrong
// issuer or audience, another algorithm, a key of another kind, a key not
// the provider's, and HS256 signed with the provider's public key (the
// algorithm-confusion attack) are 401, all without fetching the set again.
func TestJWKS(t *testing.T) {
	p := newProvider(t)
	p.newKey("rsa-1", jwkset.AlgRS256)
	p.newKey("ec-1", jwkset.AlgES256)
	p.newKey("rogue", jwkset.AlgRS256)
	p.publish("rsa-1", "ec-1")
	j := p.jwt(t, Options{Leeway: time.Second, JWKSUnknownKID: time.Hour})
	if n := p.fetches.Load(); n != 1 {
		t.Fatalf("fetches at start: got %d, want 1", n)
	}
	pub := &p.private["rsa-1"].(*rsa.PrivateKey).PublicKey
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatalf("marshal public key: %v", err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	hs256 := func(secret []byte, kid string) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, providerClaims("auth0|mallory"))
		if kid != "" {
			tok.Header["kid"] = kid
		}
		s, err := tok.SignedString(secret)
		if err != nil {
			t.Fatalf("sign HS256: %v", err)
		}
		return s
	}
	wrongIssuer, wrongAudience, noAudience := providerClaims("auth0|a"), providerClaims("auth0|a"), providerClaims("auth0|a")
	wrongIssuer.Issuer = "https://other.example.test/"
	wrongAudience.Audience = jwt.ClaimStrings{"another-api"}
	noAudience.Audience = nil
	expired := providerClaims("auth0|a")
	expired.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Hour))
	rogueAsRSA1 := jwt.NewWithClaims(jwt.SigningMethodRS256, providerClaims("auth0|a"))
	rogueAsRSA1.Header["kid"] = "rsa-1"
	rogue, _ := rogueAsRSA1.SignedString(p.private["rogue"])
	ecAsRS256 := jwt.NewWithClaims(jwt.SigningMethodRS256, providerClaims("auth0|a"))
	ecAsRS256.Header["kid"] = "ec-1"
	ecKeyRSAToken, _ := ecAsRS256.SignedString(p.private["rsa-1"])
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, providerClaims("auth0|a")).SignedString(jwt.UnsafeAllowNoneSignatureType)
	withoutKID := jwt.NewWithClaims(jwt.SigningMethodES256, providerClaims("google-oauth2|1234"))
	noKID, _ := withoutKID.SignedString(p.private["ec-1"])

	tests := []struct {
		name, token, want string // want "" = 401
	}{
		{"RS256", p.sign("rsa-1", providerClaims("auth0|5f7c8ec7b4a1d2006b1f0e3a")), "auth0|5f7c8ec7b4a1d2006b1f0e3a"},
		{"ES256", p.sign("ec-1", providerClaims("google-oauth2|1234")), "google-oauth2|1234"},
		{"ES256 without kid", noKID, "google-oauth2|1234"},
		{"wrong issuer", p.sign("rsa-1", wrongIssuer), ""},
		{"wrong audience", p.sign("rsa-1", wrongAudience), ""},
		{"no audience", p.sign("rsa-1", noAudience), ""},
		{"expired", p.sign("rsa-1", expired), ""},
		{"signed by another key under a known kid", rogue, ""},
		{"RS256 under an EC key's kid", ecKeyRSAToken, ""},
		{"alg none", none, ""},
		{"HS256 with the public key PEM as secret", hs256(pemKey, "rsa-1"), ""},
		{"HS256 with the public key DER as secret", hs256(der, "rsa-1"), ""},
		{"HS256 with the shared secret (not configured)", hs256([]byte(testSecret), ""), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == "" {
				mustRefuse(t, j, tc.token)
			} else {
				mustVerify(t, j, tc.token, tc.want)
			}
		})
	}
	if n := p.fetches.Load(); n != 1 {
		t.Fatalf("fetches after tokens of known kids: got %d, want 1", n)
	}
}

// TestJWKSUnknownKID: a token whose kid the set lacks fetches the set again,
// at most once per auth.jwks_unknown_kid interval however many come; a key
// rotated in is found that way at once, and one rotated out is gone.
func TestJWKSUnknownKID(t *testing.T) {
	p := newProvider(t)
	p.newKey("rsa-1", jwkset.AlgRS256)
	p.newKey("rsa-2", jwkset.AlgRS256)
	p.newKey("rsa-3", jwkset.AlgRS256)
	p.publish("rsa-1")
	j := p.jwt(t, Options{JWKSUnknownKID: time.Hour})
	old := p.sign("rsa-1", providerClaims("auth0|old"))
	mustVerify(t, j, p.sign("rsa-1", providerClaims("auth0|before")), "auth0|before")

	// Rotation: the provider signs with rsa-2 and withdraws rsa-1.
	p.publish("rsa-2")
	mustVerify(t, j, p.sign("rsa-2", providerClaims("auth0|after")), "auth0|after")
	if n := p.fetches.Load(); n != 2 {
		t.Fatalf("fetches after a token of the rotated-in key: got %d, want 2", n)
	}
	mustRefuse(t, j, old) // rsa-1 left with the refetch
	// rsa-3 is published, but the interval's one refetch is spent: tokens
	// of unknown kids are refused without fetching, however many come.
	p.publish("rsa-2", "rsa-3")
	for range 20 {
		mustRefuse(t, j, p.sign("rsa-3", providerClaims("auth0|later")))
	}
	if n := p.fetches.Load(); n != 2 {
		t.Fatalf("fetches after 21 tokens of unknown kids: got %d, want 2 (one per interval)", n)
	}
}

// TestJWKSRefetchAfterInterval: once the interval has passed, an unknown
// kid fetches again.
func TestJWKSRefetchAfterInterval(t *testing.T) {
	p := newProvider(t)
	p.newKey("rsa-1", jwkset.AlgRS256)
	p.newKey("rsa-2", jwkset.AlgRS256)
	p.publish("rsa-1")
	j := p.jwt(t, Options{JWKSUnknownKID: 200 * time.Millisecond})
	mustRefuse(t, j, p.sign("rsa-2", providerClaims("auth0|x"))) // spends the interval's fetch
	p.publish("rsa-1", "rsa-2")
	token := p.sign("rsa-2", providerClaims("auth0|x"))
	testenv.Eventually(t, 30*time.Second, "rsa-2 found after the interval", func() (bool, string) {
		got, err := j.Verify(token)
		return err == nil && got == "auth0|x", fmt.Sprintf("%d fetches", p.fetches.Load())
	})
}

// TestJWKSRefresh: the set is fetched again every auth.jwks_refresh, so a
// key rotated in works without an unknown-kid fetch, and a token of a
// withdrawn key, though verified before, stops working after one refresh.
func TestJWKSRefresh(t *testing.T) {
	p := newProvider(t)
	p.newKey("rsa-1", jwkset.AlgRS256)
	p.newKey("rsa-2", jwkset.AlgRS256)
	p.newKey("nobody", jwkset.AlgRS256) // never published
	p.publish("rsa-1")
	j := p.jwt(t, Options{JWKSRefresh: 100 * time.Millisecond, JWKSUnknownKID: time.Hour})
	mustRefuse(t, j, p.sign("nobody", providerClaims("auth0|x"))) // spends the unknown-kid fetch
	old := p.sign("rsa-1", providerClaims("auth0|old"))
	mustVerify(t, j, old, "auth0|old") // and caches it
	p.publish("rsa-2")
	// Two fetches after the rotation: at least one began after it.
	from := p.fetches.Load()
	testenv.Eventually(t, 30*time.Second, "two refreshes", func() (bool, string) {
		n := p.fetches.Load()
		return n >= from+2, fmt.Sprintf("%d fetches", n)
	})
	mustVerify(t, j, p.sign("rsa-2", providerClaims("auth0|new")), "auth0|new")
	mustRefuse(t, j, old)
}

// TestJWKSWithHS256: with HS256 among the algorithms, minted tokens carry
// and pass the issuer and audience, and HS256 is still checked with the
// shared secret only, never with a provider's key.
func TestJWKSWithHS256(t *testing.T) {
	p := newProvider(t)
	p.newKey("rsa-1", jwkset.AlgRS256)
	p.publish("rsa-1")
	j := p.jwt(t, Options{Algorithms: []string{"RS256", "HS256"}, JWKSUnknownKID: time.Hour})
	minted, err := j.Mint("load-test-1", time.Hour)
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	mustVerify(t, j, minted, "load-test-1")
	mustVerify(t, j, p.sign("rsa-1", providerClaims("auth0|a")), "auth0|a")
	der, _ := x509.MarshalPKIXPublicKey(&p.private["rsa-1"].(*rsa.PrivateKey).PublicKey)
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, providerClaims("auth0|mallory"))
	tok.Header["kid"] = "rsa-1"
	confused, _ := tok.SignedString(der)
	mustRefuse(t, j, confused)
	// Without iss and aud a minted-form token is refused.
	plain := NewJWT([]byte(testSecret), 0)
	bare, _ := plain.Mint("load-test-1", time.Hour)
	mustRefuse(t, j, bare)
}

// TestJWKSUnreachable: a key set that cannot be fetched fails New, so a
// wrong URL shows at start.
func TestJWKSUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	defer srv.Close()
	_, err := New(t.Context(), []byte(testSecret), Options{JWKSURL: srv.URL, Issuer: testIssuer, Audience: testAudience})
	if err == nil {
		t.Fatal("New with a failing JWKS URL: got no error")
	}
}
