package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestLoadtestSeparateRoles runs `flashsale loadtest` against the
// production layout: a gateway, a notifier and a worker as separate
// processes on real Redis and MySQL with the Redis-Streams queue.
func TestLoadtestSeparateRoles(t *testing.T) {
	testenv.SkipShort(t, "a load test")
	cfg := realConfig(t, "redisstream")
	bin := buildBinary(t)
	// Every simulated shopper connects from this host (docs/OPERATIONS.md, "Load test").
	env := append(processEnv(cfg), "FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP=100000")
	gw := startRole(t, bin, "gateway", env)
	ntf := startRole(t, bin, "notifier", env)
	startRole(t, bin, "worker", env)
	// A gateway whose per-IP limit (production.yaml's kind) refuses most of
	// one host's shoppers.
	tight := startRole(t, bin, "gateway", append(env, "FLASHSALE_GATEWAY_IP_RATE=5", "FLASHSALE_GATEWAY_IP_BURST=10"))
	gwURL, ntfURL := "http://"+gw.addr, "http://"+ntf.addr
	sale := func(campaign string) []string {
		return []string{"--admin-token", testAdminToken, "--jwt-secret", testJWTSecret, "--campaign", campaign,
			"--shoppers", "300", "--stock", "40", "--concurrency", "16", "--settle", "30s"}
	}

	// First: the notifier's upgrade count and clients are then the crowd's alone.
	t.Run("a crowd on the notifier, one socket per shopper", func(t *testing.T) {
		out, err := runLoadtestCmd(t, append(sale(testenv.Name(t, "ltcrowd-")), "--url", gwURL, "--results-url", ntfURL, "--json",
			"--ws-per-shopper", "--connect-window", "200ms", "--hold", "1s")...)
		if err != nil {
			t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
		}
		var rep report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("report is not JSON: %v\n%s", err, out)
		}
		if !rep.OK || rep.Successes != 40 || rep.Crowd == nil {
			t.Fatalf("got ok %v, %d successes, crowd %v; want ok, 40, a crowd section: %+v", rep.OK, rep.Successes, rep.Crowd, rep.Invariants)
		}
		c, n := rep.Crowd, rep.Crowd.Notifier
		if c.Connected != 300 || n.ClientsHerd != 300 || n.Upgrades < 300 || n.Upgrades > 300+c.Reconnects || n.ClientsAfterLeave != 0 {
			t.Errorf("got %d connected; notifier: %d clients, %d upgrade requests, %d clients after leaving; want 300, 300, 300 to %d, 0",
				c.Connected, n.ClientsHerd, n.Upgrades, n.ClientsAfterLeave, 300+c.Reconnects)
		}
		if n.Unavailable != "" || n.SharedWithLoadtest || n.RSSBefore <= 0 || n.RSSConnected <= 0 || n.RSSAfterLeave <= 0 || n.IdleCPUSeconds == nil {
			t.Errorf("notifier figures: got %+v, want the notifier process's RSS and idle CPU", n)
		}
	})

	t.Run("results from the notifier", func(t *testing.T) {
		out, err := runLoadtestCmd(t, append(sale(testenv.Name(t, "ltroles-")), "--url", gwURL, "--results-url", ntfURL, "--json")...)
		if err != nil {
			t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
		}
		var rep report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("report is not JSON: %v\n%s", err, out)
		}
		if !rep.OK || rep.Successes != 40 || rep.Server.OrdersInDB != 40 {
			t.Errorf("got ok %v, %d successes, %d orders in DB; want ok, 40 and 40: %+v", rep.OK, rep.Successes, rep.Server.OrdersInDB, rep.Invariants)
		}
		if rep.ByChannel["ws"] == 0 || rep.Delivered != rep.Admitted {
			t.Errorf("results: got %d delivered (%v) for %d admitted, want all, some over WebSocket", rep.Delivered, rep.ByChannel, rep.Admitted)
		}
	})

	t.Run("results URL is the gateway", func(t *testing.T) {
		campaign := testenv.Name(t, "ltwrong-")
		out, err := runLoadtestCmd(t, append(sale(campaign), "--url", gwURL)...)
		want := "--results-url " + gwURL + " does not serve GET /api/v1/purchases/"
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "must be a notifier") {
			t.Fatalf("got error %v, want one containing %q and naming the notifier", err, want)
		}
		if out != "" {
			t.Errorf("got output %q, want none", out)
		}
		c := gw.client(t, cfg)
		if code := c.do("GET", "/api/v1/campaigns/"+campaign, "", nil, nil, nil); code != http.StatusNotFound {
			t.Errorf("campaign after the refused run: got %d, want 404 (nothing created)", code)
		}
	})

	t.Run("rate-limited run", func(t *testing.T) {
		out, err := runLoadtestCmd(t, append(sale(testenv.Name(t, "lt429-")), "--url", "http://"+tight.addr, "--results-url", ntfURL)...)
		if err == nil || !strings.Contains(err.Error(), "the run measured the rate limits, not the sale") {
			t.Fatalf("got error %v, want one saying the run measured the rate limits; output:\n%s", err, out)
		}
		if !strings.HasPrefix(out, "!!! NOT A MEASUREMENT OF THE SALE") || strings.Count(out, "!!!") != 2 {
			t.Errorf("report:\n%s\nwant it to open and close with the !!! warning", out)
		}
		t.Log(out)
	})
}
