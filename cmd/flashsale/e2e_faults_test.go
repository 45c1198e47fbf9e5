package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

// TestIdempotencyKey: the same key from the same user returns the same
// request id (200) and never creates a second request.
func TestIdempotencyKey(t *testing.T) {
	c := startSystem(t, realConfig(t, "redisstream"))
	campaign := testenv.Name(t, "idem-")
	c.openCampaign(campaign, 10, 3)
	path := "/api/v1/campaigns/" + campaign + "/purchases"
	key := map[string]string{"Idempotency-Key": "order-42"}
	var first, second, other purchaseBody
	if code := c.do("POST", path, c.token("ann"), `{"quantity":1}`, key, &first); code != http.StatusAccepted {
		t.Fatalf("first: got %d, want 202", code)
	}
	if code := c.do("POST", path, c.token("ann"), `{"quantity":1}`, key, &second); code != http.StatusOK || second.RequestID != first.RequestID {
		t.Fatalf("repeat: got %d %s, want 200 %s", code, second.RequestID, first.RequestID)
	}
	if code := c.do("POST", path, c.token("ben"), `{"quantity":1}`, key, &other); code != http.StatusAccepted || other.RequestID == first.RequestID {
		t.Fatalf("another user, same key: got %d %s, want 202 and a new id", code, other.RequestID)
	}
	st := c.settle(campaign, 10*time.Second)
	if st.Admitted != 2 || st.Sold != 2 || st.OrdersInDB != 2 {
		t.Fatalf("got admitted %d sold %d orders %d, want 2 2 2", st.Admitted, st.Sold, st.OrdersInDB)
	}
	if code, r := c.poll("ben", first.RequestID); code != http.StatusNotFound {
		t.Fatalf("another user's poll: got %d %+v, want 404", code, r)
	}
}

// switchablePublisher passes publishes through, or while down hangs each one
// until its deadline, like a broker that stopped answering.
type switchablePublisher struct {
	queue.Publisher
	down atomic.Bool
}

func (p *switchablePublisher) Publish(ctx context.Context, topic string, msgs ...queue.Message) error {
	if p.down.Load() {
		<-ctx.Done()
		return errors.New("broker did not answer")
	}
	return p.Publisher.Publish(ctx, topic, msgs...)
}

// TestQueueOutage: the queue fails every publish for 5 s mid-sale: on Redis
// Streams it stops answering (each publish hangs until its deadline), on
// RocketMQ (`flashsale serve` against the broker double) the broker refuses
// every send (SYSTEM_BUSY). Shoppers get 503 unavailable within the publish
// timeout, then at once while the circuit breaker is open; nothing is left
// behind (no queued marker, no counter), and admitting recovers by itself
// when the queue is back.
func TestQueueOutage(t *testing.T) {
	testenv.SkipShort(t, "a fault test: the queue down mid-sale")
	setCfg := func(cfg *config.Config) {
		cfg.Gateway.PublishTimeout = 500 * time.Millisecond
		cfg.Gateway.BreakerFailures, cfg.Gateway.BreakerOpenFor = 3, time.Second
	}
	t.Run("redisstream", func(t *testing.T) {
		cfg := realConfig(t, "redisstream")
		setCfg(&cfg)
		var sw *switchablePublisher
		c := startSystemWith(t, cfg, func(p queue.Publisher) queue.Publisher { sw = &switchablePublisher{Publisher: p}; return sw })
		queueOutage(t, c, cfg, sw.down.Store)
	})
	t.Run("rocketmq", func(t *testing.T) {
		cfg := realConfig(t, "rocketmq")
		setCfg(&cfg)
		srv := startBrokerDouble(t, rmqtest.Options{})
		createTopics(srv, cfg)
		env := append(rocketMQEnv(cfg, srv.Addr()),
			"FLASHSALE_GATEWAY_PUBLISH_TIMEOUT="+cfg.Gateway.PublishTimeout.String(),
			fmt.Sprintf("FLASHSALE_GATEWAY_BREAKER_FAILURES=%d", cfg.Gateway.BreakerFailures),
			"FLASHSALE_GATEWAY_BREAKER_OPEN_FOR="+cfg.Gateway.BreakerOpenFor.String())
		c := startRole(t, buildBinary(t), "serve", env).client(t, cfg)
		queueOutage(t, c, cfg, func(down bool) {
			if down {
				srv.InjectFault(rmqSendMessage, rmqtest.Fault{Code: rmqSystemBusy, Remark: "busy"})
			} else {
				srv.ClearFaults()
			}
		})
	})
}

func queueOutage(t *testing.T, c *client, cfg config.Config, setDown func(bool)) {
	campaign := testenv.Name(t, "qdown-")
	const stock, limit = 1000, 1
	c.openCampaign(campaign, stock, limit)

	var mu sync.Mutex
	admitted := map[string]string{}
	var slowest503, afterOpen503 time.Duration
	var fast503, outageRequests, recovered int
	buy := func(user string) (int, time.Duration) {
		var p purchaseBody
		start := time.Now()
		code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(user), `{"quantity":1}`, nil, &p)
		took := time.Since(start)
		if code == http.StatusAccepted {
			mu.Lock()
			admitted[p.RequestID] = user
			mu.Unlock()
		} else if code != http.StatusServiceUnavailable || p.Code != "unavailable" {
			t.Errorf("%s: got %d %q, want 202 or 503 unavailable", user, code, p.Code)
		}
		return code, took
	}
	for i := range 20 {
		buy(fmt.Sprintf("before%d", i))
	}
	setDown(true)
	outageEnds := time.Now().Add(5 * time.Second)
	for i := 0; time.Now().Before(outageEnds); i++ {
		code, took := buy(fmt.Sprintf("during%d", i))
		outageRequests++
		if code != http.StatusServiceUnavailable {
			t.Errorf("during the outage: got %d, want 503", code)
		}
		slowest503 = max(slowest503, took)
		if i >= 3 { // the breaker has opened after three failed publishes
			afterOpen503 = max(afterOpen503, took)
			if took < 100*time.Millisecond {
				fast503++
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	setDown(false)
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; recovered < 20; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("admitting did not recover within 5 s of the queue coming back (%d admitted)", recovered)
		}
		if code, _ := buy(fmt.Sprintf("after%d", i)); code == http.StatusAccepted {
			recovered++
		}
		time.Sleep(50 * time.Millisecond)
	}
	if slowest503 > cfg.Gateway.PublishTimeout+time.Second {
		t.Errorf("slowest 503 took %s, want within the publish timeout (%s) plus slack", slowest503, cfg.Gateway.PublishTimeout)
	}
	if fast503 < (outageRequests-3)/2 {
		t.Errorf("only %d of %d refusals after the breaker opened were fast (<100ms; slowest %s)", fast503, outageRequests-3, afterOpen503)
	}
	st := c.settle(campaign, 20*time.Second)
	verifySettled(t, c, campaign, stock, limit, admitted, st)
	t.Logf("outage: %d requests refused, slowest %s, %d under 100ms; %d admitted in all", outageRequests, slowest503, fast503, len(admitted))
}

// TestSoldOutFlagAtGateway: once stock is gone, later purchases are refused
// with 410 from the gateway's flag, and the public view says sold out.
func TestSoldOutFlagAtGateway(t *testing.T) {
	c := startSystem(t, realConfig(t, "redisstream"))
	campaign := testenv.Name(t, "so-")
	c.openCampaign(campaign, 1, 1)
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("ann"), `{"quantity":1}`, nil, nil); code != http.StatusAccepted {
		t.Fatalf("first purchase: got %d", code)
	}
	c.settle(campaign, 10*time.Second)
	testenv.Eventually(t, 5*time.Second, "410 sold_out after selling out", func() (bool, string) {
		var body purchaseBody
		code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("ben"), `{"quantity":1}`, nil, &body)
		return code == http.StatusGone && body.Code == "sold_out", fmt.Sprintf("got %d %q", code, body.Code)
	})
	var pub struct {
		SoldOut bool `json:"sold_out"`
	}
	if code := c.do("GET", "/api/v1/campaigns/"+campaign, "", nil, nil, &pub); code != http.StatusOK || !pub.SoldOut {
		t.Fatalf("public view: got %d sold_out=%v, want 200 true", code, pub.SoldOut)
	}
}

// TestIdempotencyKeyAfterSoldOut: a shopper who lost the answer to an
// admitted purchase and repeats it with the same Idempotency-Key after the
// campaign sold out gets its request back (it succeeded), not 410.
func TestIdempotencyKeyAfterSoldOut(t *testing.T) {
	c := startSystem(t, realConfig(t, "redisstream"))
	campaign := testenv.Name(t, "idemso-")
	c.openCampaign(campaign, 1, 1)
	path := "/api/v1/campaigns/" + campaign + "/purchases"
	key := map[string]string{"Idempotency-Key": "lost-answer"}
	var first purchaseBody
	if code := c.do("POST", path, c.token("ann"), `{"quantity":1}`, key, &first); code != http.StatusAccepted {
		t.Fatalf("first: got %d, want 202", code)
	}
	c.settle(campaign, 10*time.Second)
	testenv.Eventually(t, 5*time.Second, "the gateway's flag saying sold out", func() (bool, string) {
		var p purchaseBody
		code := c.do("POST", path, c.token("ben"), `{"quantity":1}`, nil, &p)
		return code == http.StatusGone, fmt.Sprintf("got %d", code)
	})
	var again purchaseBody
	if code := c.do("POST", path, c.token("ann"), `{"quantity":1}`, key, &again); code != http.StatusOK || again.RequestID != first.RequestID {
		t.Fatalf("repeat after sold out: got %d %q %s, want 200 with %s", code, again.Code, again.RequestID, first.RequestID)
	}
	if code, r := c.pollDecided("ann", first.RequestID); code != http.StatusOK || r.Status != "success" {
		t.Fatalf("poll: got %d %s, want 200 success", code, r.Status)
	}
	var other purchaseBody
	if code := c.do("POST", path, c.token("cat"), `{"quantity":1}`, key, &other); code != http.StatusGone {
		t.Fatalf("another user with the same key after sold out: got %d, want 410", code)
	}
}
