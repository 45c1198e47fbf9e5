package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
)

// TestServePrintsOnlyDevSecrets: serve in development mode prints the
// development admin token and a shopper token, but never a secret set in
// the environment, nor a token signed with one.
func TestServePrintsOnlyDevSecrets(t *testing.T) {
	const realAdmin, realJWT = "real-admin-token-4f9c2e", "real-jwt-secret-0123456789abcdef0123456789"
	tests := []struct {
		name     string
		env      map[string]string
		want     []string
		wantNone []string
	}{
		{name: "development secrets", env: map[string]string{},
			want: []string{"dev admin token: " + config.DevAdminToken, "dev shopper token for user alice: eyJ"}},
		{name: "real secrets", env: map[string]string{"FLASHSALE_AUTH_ADMIN_TOKEN": realAdmin, "FLASHSALE_AUTH_JWT_SECRET": realJWT},
			want: []string{"(not printed)"}, wantNone: []string{realAdmin, realJWT, "eyJ", config.DevAdminToken}},
		{name: "real admin token only", env: map[string]string{"FLASHSALE_AUTH_ADMIN_TOKEN": realAdmin},
			want: []string{"dev shopper token for user alice: eyJ"}, wantNone: []string{realAdmin}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := serveUntilListening(t, tc.env)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output:\n%s\nwant it to contain %q", out, w)
				}
			}
			for _, w := range tc.wantNone {
				if strings.Contains(out, w) {
					t.Errorf("output:\n%s\nprints %q", out, w)
				}
			}
		})
	}
}

// serveUntilListening runs `flashsale serve` (embedded) with env until it
// listens, stops it and returns everything it printed.
func serveUntilListening(t *testing.T, env map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--addr", "127.0.0.1:0"}, &out, env, logTo(io.Discard)) }()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(out.String(), "listening on") {
		select {
		case err := <-done:
			t.Fatalf("serve ended before listening: %v\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("serve not listening after 30s:\n%s", out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	// The tokens are printed before serve waits for its end.
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	return out.String()
}

// TestStartRefusesBadEnvironment: development mode with real services and a
// misspelt variable fail before anything starts, naming the key; nothing
// secret is printed.
func TestStartRefusesBadEnvironment(t *testing.T) {
	real := map[string]string{
		"FLASHSALE_AUTH_JWT_SECRET":        "real-jwt-secret-0123456789abcdef0123456789",
		"FLASHSALE_AUTH_ADMIN_TOKEN":       "real-admin-token-4f9c2e",
		"FLASHSALE_PAYMENT_WEBHOOK_SECRET": "real-webhook-secret-0123456789abcdef0123",
	}
	with := func(kv ...string) map[string]string {
		env := map[string]string{}
		for k, v := range real {
			env[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			env[kv[i]] = kv[i+1]
		}
		return env
	}
	tests := []struct {
		name string
		cmd  string
		env  map[string]string
		want string
	}{
		{"dev mode with real redis", "serve", with("FLASHSALE_REDIS_MODE", "server", "FLASHSALE_REDIS_ADDR", "127.0.0.1:1"), "auth.dev"},
		{"dev mode with mysql", "serve", with("FLASHSALE_DATABASE_DRIVER", "mysql", "FLASHSALE_DATABASE_DSN", "root@tcp(127.0.0.1:1)/x"), "auth.dev"},
		{"dev mode on a gateway", "gateway", with("FLASHSALE_REDIS_MODE", "server", "FLASHSALE_REDIS_ADDR", "127.0.0.1:1",
			"FLASHSALE_DATABASE_DRIVER", "mysql", "FLASHSALE_DATABASE_DSN", "root@tcp(127.0.0.1:1)/x"), "auth.dev"},
		{"misspelt variable", "serve", with("FLASHSALE_REDIS_ADRR", "127.0.0.1:6379"), "FLASHSALE_REDIS_ADRR (did you mean FLASHSALE_REDIS_ADDR?)"},
		{"misspelt variable, token", "token", with("FLASHSALE_AUTH_JWT_SECRT", "x"), "did you mean FLASHSALE_AUTH_JWT_SECRET?"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			args := []string{tc.cmd, "--addr", "127.0.0.1:0"}
			if tc.cmd == "token" {
				args = []string{"token", "alice"}
			}
			// Bounded: a check that lets the command through would serve.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, args, &out, tc.env, logTo(io.Discard))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			for _, secret := range real {
				if strings.Contains(out.String()+err.Error(), secret) {
					t.Errorf("a secret was printed: %q, error %v", out.String(), err)
				}
			}
		})
	}
}
