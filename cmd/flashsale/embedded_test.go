package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestServeEmbeddedDefault runs `flashsale serve` exactly as a new user
// would, with no services, and buys through it.
func TestServeEmbeddedDefault(t *testing.T) {
	base, printed := serveInProcess(t, []string{"serve"}, map[string]string{}, "dev admin token: ")
	adminToken := printed["dev admin token: "]
	if base == "" || adminToken != config.DevAdminToken {
		t.Fatalf("serve printed address %q and admin token %q", base, adminToken)
	}

	c := newClient(t, base, config.Default().Auth)
	// Ready only once the notifier's results subscription is confirmed, a
	// moment after the listener is up.
	for _, path := range []string{"/healthz", "/readyz"} {
		testenv.Eventually(t, 5*time.Second, path+" 200", func() (bool, string) {
			code := c.do("GET", path, "", nil, nil, nil)
			return code == http.StatusOK, fmt.Sprintf("got %d", code)
		})
	}
	c.openCampaign("embedded-demo", 2, 1)

	var p purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/embedded-demo/purchases", c.token("alice"), map[string]int{"quantity": 1}, nil, &p); code != http.StatusAccepted {
		t.Fatalf("purchase: got %d, want 202", code)
	}
	r, err := c.wsResult("alice", p.RequestID, 10*time.Second)
	if err != nil {
		t.Fatalf("ws result: %v", err)
	}
	if r.Status != "success" || r.OrderID == "" {
		t.Fatalf("got %s order %q, want success with an order id", r.Status, r.OrderID)
	}
	st := c.settle("embedded-demo", 10*time.Second)
	if st.Remaining != 1 || st.OrdersInDB != 1 {
		t.Fatalf("got remaining %d, orders %d; want 1 and 1", st.Remaining, st.OrdersInDB)
	}
	var m bytes.Buffer
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	_, _ = io.Copy(&m, resp.Body)
	resp.Body.Close()
	for _, name := range []string{"flashsale_http_requests_total", "flashsale_deductions_total", "flashsale_results_delivered_total"} {
		if !strings.Contains(m.String(), name) {
			t.Errorf("metrics lack %s", name)
		}
	}
}

func TestCommands(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr bool
		want    string
	}{
		{name: "help", args: []string{"--help"}, want: "Commands:"},
		{name: "version", args: []string{"version"}, want: "flashsale dev"},
		{name: "serve help", args: []string{"serve", "--help"}, wantErr: true, want: "Usage: flashsale serve"},
		{name: "token", args: []string{"token", "bob"}, want: "eyJ"},
		{name: "token without user", args: []string{"token"}, wantErr: true, want: "Usage: flashsale token"},
		{name: "token provider user", args: []string{"token", "auth0|5f7c8ec7b4a1d2006b1f0e3a"}, want: "eyJ"},
		{name: "token user of 256 bytes", args: []string{"token", strings.Repeat("u", 256)}, wantErr: true},
		{name: "token bad user", args: []string{"token", "bob\nsmith"}, wantErr: true},
		{name: "unknown", args: []string{"frobnicate"}, wantErr: true, want: "Commands:"},
		{name: "single role on embedded", args: []string{"worker"}, wantErr: true},
		{name: "bad config", args: []string{"serve", "--config", "/nonexistent.yaml"}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), tc.args, &out, map[string]string{}, logTo(io.Discard))
			if (err != nil) != tc.wantErr {
				t.Fatalf("got err %v, want error %v", err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Fatalf("output %q lacks %q", out.String(), tc.want)
			}
		})
	}
}

// TestStartFailsCleanly: a service that cannot be reached is a one-line
// error at start, not a panic, and what was opened is closed again.
func TestStartFailsCleanly(t *testing.T) {
	cfg := config.Default()
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.Database.Driver, cfg.Database.DSN = "mysql", "root@tcp(127.0.0.1:1)/nothing"
	_, err := start(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), roleSet{gateway: true, worker: true, notifier: true})
	if err == nil || !strings.Contains(err.Error(), "mysql") {
		t.Fatalf("got %v, want an error naming the unreachable mysql", err)
	}
}

// serveInProcess runs `flashsale args...` (a serve) in the test's process on
// a free port with env, stops it at cleanup (failing the test if it returns
// an error or does not stop), and returns its base URL once it printed its
// address, with what it printed after each of the prefixes, which it waits
// for too.
func serveInProcess(t *testing.T, args []string, env map[string]string, prefixes ...string) (string, map[string]string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append(args, "--addr", "127.0.0.1:0"), pw, env, logTo(io.Discard))
		_ = pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve returned %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("serve did not stop within 15s of cancellation")
		}
	})
	const address = "listening on "
	printed := map[string]string{}
	lines := bufio.NewScanner(pr)
	for len(printed) < len(prefixes)+1 && lines.Scan() {
		for _, prefix := range append(prefixes, address) {
			if _, after, ok := strings.Cut(lines.Text(), prefix); ok {
				printed[prefix] = after
			}
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	base := printed[address]
	if base == "" {
		t.Fatalf("serve printed no address")
	}
	return base, printed
}
