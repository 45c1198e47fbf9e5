package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestSeparateAdminListener: with http.admin_addr set, the admin API is
// served only there, so it need not face the internet.
func TestSeparateAdminListener(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	cfg.HTTP.AdminAddr = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	sys, err := start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), roleSet{gateway: true, worker: true, notifier: true})
	if err != nil {
		cancel()
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { cancel(); _ = sys.Wait() })
	public := newClient(t, "http://"+sys.Addr(), cfg.Auth)
	admin := newClient(t, "http://"+sys.adminAddr, cfg.Auth)
	campaign := testenv.Name(t, "adm-")
	if code := public.do("GET", "/admin/v1/campaigns/"+campaign+"/stats", testAdminToken, nil, nil, nil); code != http.StatusNotFound {
		t.Fatalf("admin route on the public listener: got %d, want 404", code)
	}
	admin.openCampaign(campaign, 3, 1)
	if code := public.do("GET", "/api/v1/campaigns/"+campaign, "", nil, nil, nil); code != http.StatusOK {
		t.Fatalf("public route on the public listener: got %d, want 200", code)
	}
}

// TestSlowlorisIsCut: a client that sends headers slower than
// http.read_header_timeout is disconnected instead of holding a connection.
func TestSlowlorisIsCut(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	cfg.HTTP.ReadHeaderTimeout = 300 * time.Millisecond
	c := startSystem(t, cfg)
	conn, err := net.Dial("tcp", c.base[len("http://"):])
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatalf("write: %v", err)
	}
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(conn) // the server answers 408 or just closes; either ends the read
	if took := time.Since(start); err != nil || took > 3*time.Second {
		t.Fatalf("connection held %s (err %v), want it closed soon after the 300ms header timeout", took, err)
	}
}
