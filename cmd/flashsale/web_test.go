package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/config"
)

// TestDevTokenRoute: serve in development mode mints shopper tokens for the
// page at /api/v1/dev/token (answers valid against the OpenAPI document,
// tokens signed with the development secret); with a secret of one's own
// the route does not exist.
func TestDevTokenRoute(t *testing.T) {
	tests := []struct {
		name   string
		secret string
		want   int
	}{
		{name: "development secret", secret: config.DevJWTSecret, want: http.StatusOK},
		{name: "a secret of one's own", secret: "real-jwt-secret-0123456789abcdef0123456789", want: http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.HTTP.Addr = "127.0.0.1:0"
			cfg.Auth.JWTSecret = tc.secret
			cfg.Log.Level = "warn"
			ctx, cancel := context.WithCancel(context.Background())
			sys, err := start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), roleSet{gateway: true, worker: true, notifier: true})
			if err != nil {
				cancel()
				t.Fatalf("start: %v", err)
			}
			t.Cleanup(func() {
				cancel()
				if err := sys.Wait(); err != nil {
					t.Errorf("shutdown: %v", err)
				}
			})
			c := newClient(t, "http://"+sys.Addr(), cfg.Auth)
			c.http.Transport = newAPIChecker(t, c.http.Transport)

			var got struct {
				Token  string `json:"token"`
				UserID string `json:"user_id"`
			}
			if code := c.do("GET", devTokenPath+"?user=bob", "", nil, nil, &got); code != tc.want {
				t.Fatalf("GET %s: got %d, want %d", devTokenPath, code, tc.want)
			}
			if tc.want != http.StatusOK {
				return
			}
			user, err := auth.NewJWT([]byte(config.DevJWTSecret), cfg.Auth.JWTLeeway).Verify(got.Token)
			if err != nil || user != "bob" || got.UserID != "bob" {
				t.Errorf("token for %q verifies as %q (%v), want bob", got.UserID, user, err)
			}
			if code := c.do("GET", devTokenPath+"?user="+strings.Repeat("x", 256), "", nil, nil, nil); code != http.StatusBadRequest {
				t.Errorf("a user id too long: got %d, want 400", code)
			}
			// serve on one listener: every documented operation, this one too.
			compareRoutes(t, "development mode", sys.engine, documentedOps(t), func(documentedOp) bool { return true })
		})
	}
}

// TestWebFiles: the page and its scripts are served with their types and
// a policy that lets only the page's own scripts run; names outside web/
// are 404.
func TestWebFiles(t *testing.T) {
	c := startSystem(t, realConfig(t, "memqueue"))
	tests := []struct {
		path, wantType string
		wantCode       int
	}{
		{"/", "text/html", 200},
		{"/web/flashsale.js", "text/javascript", 200},
		{"/web/app.js", "text/javascript", 200},
		{"/web/style.css", "text/css", 200},
		{"/web/web.go", "application/json", 404},
		{"/web/..%2Fgo.mod", "application/json", 404},
		{"/web/missing.js", "application/json", 404},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := c.http.Get(c.base + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tc.wantCode || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.wantType) {
				t.Errorf("got %d %s, want %d %s", resp.StatusCode, resp.Header.Get("Content-Type"), tc.wantCode, tc.wantType)
			}
			// Sockets to the page's own host only, and every answer (the
			// JSON 404s too) taken as its Content-Type says.
			host, _, _ := strings.Cut(strings.TrimPrefix(c.base, "http://"), ":")
			csp := resp.Header.Get("Content-Security-Policy")
			if tc.wantCode == 200 && (!strings.Contains(csp, "default-src 'self'") ||
				!strings.Contains(csp, "connect-src 'self' ws://"+host+":* wss://"+host+":*;") || strings.Contains(csp, " ws: ")) {
				t.Errorf("Content-Security-Policy %q: want default-src 'self' and sockets to %s only", csp, host)
			}
			if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options %q, want nosniff", got)
			}
		})
	}
}

func TestSocketSources(t *testing.T) {
	for host, want := range map[string]string{
		"shop.example:8443":  " ws://shop.example:* wss://shop.example:*",
		"shop.example":       " ws://shop.example:* wss://shop.example:*",
		"127.0.0.1:8080":     " ws://127.0.0.1:* wss://127.0.0.1:*",
		"[::1]:8080":         "",
		"":                   "",
		"evil; script-src *": "",
		"a b":                "",
	} {
		if got := socketSources(host); got != want {
			t.Errorf("socketSources(%q): got %q, want %q", host, got, want)
		}
	}
}
