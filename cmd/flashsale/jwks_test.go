package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	jwtlib "github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestProviderTokens: with auth.jwks_url set, the gateway and the notifier
// take the identity provider's RS256 tokens (key set from a local JWKS
// server), check their issuer and audience, and refuse HS256 ones unless
// auth.algorithms lists it.
func TestProviderTokens(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	jwk, err := jwkset.NewJWKFromKey(&key.PublicKey, jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: "k1", ALG: jwkset.AlgRS256}})
	if err != nil {
		t.Fatalf("jwk: %v", err)
	}
	keys := jwkset.NewMemoryStorage()
	if err := keys.KeyWrite(t.Context(), jwk); err != nil {
		t.Fatalf("write jwk: %v", err)
	}
	set, err := keys.JSONPublic(t.Context())
	if err != nil {
		t.Fatalf("jwks: %v", err)
	}
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(set) }))
	defer idp.Close()

	cfg := realConfig(t, "memqueue")
	cfg.Auth.JWKSURL, cfg.Auth.Issuer, cfg.Auth.Audience = idp.URL+"/.well-known/jwks.json", "https://idp.example.test/", "flashsale-api"
	cfg.Auth.JWKSRefresh, cfg.Auth.JWKSUnknownKID = time.Hour, time.Minute
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	c := startSystem(t, cfg)
	campaign := testenv.Name(t, "idp-")
	c.openCampaign(campaign, 5, 1)
	sign := func(sub, aud string) string {
		tok := jwtlib.NewWithClaims(jwtlib.SigningMethodRS256, jwtlib.RegisteredClaims{Subject: sub, Issuer: cfg.Auth.Issuer,
			Audience: jwtlib.ClaimStrings{aud}, ExpiresAt: jwtlib.NewNumericDate(time.Now().Add(time.Hour))})
		tok.Header["kid"] = "k1"
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatalf("sign: %v", err)
		}
		return s
	}
	user := "auth0|5f7c8ec7b4a1d2006b1f0e3a"
	tok := sign(user, cfg.Auth.Audience)
	var p purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", tok, `{"quantity":1}`, nil, &p); code != http.StatusAccepted {
		t.Fatalf("purchase with the provider's token: got %d %q, want 202", code, p.Code)
	}
	testenv.Eventually(t, 20*time.Second, "the purchase a success", func() (bool, string) {
		var r resultBody
		c.do("GET", "/api/v1/purchases/"+p.RequestID, tok, nil, nil, &r)
		return r.Status == "success", fmt.Sprintf("%+v", r)
	})
	for name, bad := range map[string]string{
		"another audience":             sign(user, "another-api"),
		"HS256 with the shared secret": c.token(user),
	} {
		var got resultBody
		if code := c.do("GET", "/api/v1/purchases/"+p.RequestID, bad, nil, nil, &got); code != http.StatusUnauthorized || got.Code != "unauthorized" {
			t.Errorf("%s: got %d %q, want 401 unauthorized", name, code, got.Code)
		}
	}
}

// TestProviderKeysUnreachable: a JWKS URL that does not answer fails the
// start, naming it.
func TestProviderKeysUnreachable(t *testing.T) {
	idp := httptest.NewServer(http.NotFoundHandler())
	defer idp.Close()
	cfg := realConfig(t, "memqueue")
	cfg.Auth.JWKSURL, cfg.Auth.Issuer, cfg.Auth.Audience = idp.URL+"/jwks.json", "https://idp.example.test/", "flashsale-api"
	cfg.Auth.JWKSRefresh, cfg.Auth.JWKSUnknownKID = time.Hour, time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sys, err := start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), roleSet{gateway: true, worker: true, notifier: true})
	if err == nil {
		cancel()
		_ = sys.Wait()
		t.Fatal("start with an unreachable JWKS URL: got no error")
	}
	if !strings.Contains(err.Error(), "/jwks.json") {
		t.Fatalf("start: got %v, want an error naming the JWKS URL", err)
	}
}
