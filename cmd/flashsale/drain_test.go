package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestDrainOnStop: when a gateway+notifier is told to stop, /readyz turns
// 503 "draining" at once, while every other request is still answered, and
// the listeners close only after http.drain_delay, so a load balancer
// polling /readyz stops sending traffic before connections are refused.
func TestDrainOnStop(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	cfg.HTTP.AdminAddr = "127.0.0.1:0"
	// Long enough for the checks below to run inside it on a loaded machine.
	cfg.HTTP.DrainDelay = 8 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sys, err := start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), roleSet{gateway: true, notifier: true})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			cancel()
			_ = sys.Wait()
		}
	})
	public := newClient(t, "http://"+sys.Addr(), cfg.Auth)
	admin := newClient(t, "http://"+sys.adminAddr, cfg.Auth)
	campaign := testenv.Name(t, "drain-")
	admin.openCampaign(campaign, 10, 1)
	var ready map[string]string
	testenv.Eventually(t, 10*time.Second, "/readyz 200", func() (bool, string) {
		return admin.do("GET", "/readyz", "", nil, nil, &ready) == http.StatusOK, fmt.Sprintf("%v", ready)
	})

	stopped := time.Now()
	cancel()
	for {
		var body map[string]string
		if code := admin.do("GET", "/readyz", "", nil, nil, &body); code == http.StatusServiceUnavailable && body["status"] == "draining" {
			break
		}
		if time.Since(stopped) > cfg.HTTP.DrainDelay {
			t.Fatalf("/readyz did not answer 503 draining within the drain delay of the stop")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Draining, and still serving.
	if code := public.do("GET", "/healthz", "", nil, nil, nil); code != http.StatusOK {
		t.Errorf("/healthz while draining: got %d, want 200", code)
	}
	if code := public.do("GET", "/api/v1/campaigns/"+campaign, "", nil, nil, nil); code != http.StatusOK {
		t.Errorf("campaign while draining: got %d, want 200", code)
	}
	if code, _ := public.tryBuy(campaign, "alice"); code != http.StatusAccepted {
		t.Errorf("purchase while draining: got %d, want 202", code)
	}
	if time.Since(stopped) >= cfg.HTTP.DrainDelay {
		t.Fatalf("the checks took longer than the drain delay (%s): rerun on a less loaded machine", cfg.HTTP.DrainDelay)
	}

	done := make(chan error, 1)
	go func() { done <- sys.Wait() }()
	select {
	case err := <-done:
		waited = true
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
	case <-time.After(cfg.HTTP.DrainDelay + time.Minute):
		t.Fatalf("not stopped a minute after the drain delay")
	}
	if took := time.Since(stopped); took < cfg.HTTP.DrainDelay {
		t.Errorf("stopped %s after the stop, before the drain delay of %s", took, cfg.HTTP.DrainDelay)
	}
	public.http.CloseIdleConnections()
	if resp, err := public.http.Get(public.base + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("/healthz after the stop: got %d, want the connection refused", resp.StatusCode)
	}
}
