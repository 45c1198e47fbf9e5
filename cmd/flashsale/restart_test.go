package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// startRoles runs some roles in this process until the returned stop is
// called (or the test ends).
func startRoles(t *testing.T, cfg config.Config, roles roleSet) (addr string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sys, err := start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), roles)
	if err != nil {
		cancel()
		t.Fatalf("start %s: %v", roles, err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := sys.Wait(); err != nil {
				t.Errorf("stop %s: %v", roles, err)
			}
		}
	}
	t.Cleanup(stop)
	return sys.Addr(), stop
}

// TestGatewayRestartWhileClientsWait: shoppers wait on WebSockets when the
// gateway+notifier process restarts. Their connections close (going away);
// they reconnect to the new process, subscribe again and still get every
// result, which were decided while no notifier was watching.
func TestGatewayRestartWhileClientsWait(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	front := roleSet{gateway: true, notifier: true}
	addr, stopFront := startRoles(t, cfg, front)
	c := newClient(t, "http://"+addr, cfg.Auth)
	c.db = cfg.Database
	campaign := testenv.Name(t, "restart-")
	c.openCampaign(campaign, 20, 1)

	// No worker yet: every request stays queued while its shopper waits.
	users := []string{"s1", "s2", "s3", "s4", "s5", "s6"}
	admitted := map[string]string{}
	for _, u := range users {
		var p purchaseBody
		if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(u), `{"quantity":1}`, nil, &p); code != http.StatusAccepted {
			t.Fatalf("purchase %s: got %d", u, code)
		}
		admitted[p.RequestID] = u
	}
	type waited struct {
		rid string
		r   resultBody
		err error
	}
	firstTry := make(chan waited, len(admitted))
	for rid, u := range admitted {
		go func() {
			r, err := c.wsResult(u, rid, 20*time.Second)
			firstTry <- waited{rid, r, err}
		}()
	}
	// Every shopper waits on the old process before it stops, or the test
	// would prove nothing of them.
	testenv.Eventually(t, 20*time.Second, "every shopper subscribed", func() (bool, string) {
		n, _ := scrape(t, "http://"+addr).value("flashsale_websocket_subscriptions")
		return n == float64(len(admitted)), fmt.Sprintf("%v subscriptions", n)
	})
	stopFront()
	for range admitted {
		if w := <-firstTry; w.err == nil {
			t.Errorf("%s: got a result %+v from a gateway with no worker, want the connection closed", w.rid, w.r)
		}
	}

	// The new gateway+notifier and a worker come up; clients reconnect.
	addr, _ = startRoles(t, cfg, front)
	startRoles(t, cfg, roleSet{worker: true})
	c2 := newClient(t, "http://"+addr, cfg.Auth)
	c2.db = cfg.Database
	for rid, u := range admitted {
		r, err := c2.wsResult(u, rid, 20*time.Second)
		if err != nil || r.Status != "success" {
			t.Errorf("%s after reconnect: got %+v (%v), want success", rid, r, err)
		}
	}
	st := c2.settle(campaign, 10*time.Second)
	verifySettled(t, c2, campaign, 20, 1, admitted, st)
}
