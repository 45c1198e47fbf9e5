package main

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

// Sales on the rocketmq driver under faults: real workers (child processes,
// see rocketmq_test.go) decide a campaign through the driver, where "no
// double deduction, no lost request" means something.

// rocketMQQueues is the queue count of the test topics: the campaign's
// requests all go to one of them.
const rocketMQQueues = 4

// TestConsumerKilledMidBatch kills a worker in the middle of a batch
// — after its Lua call deducted stock, before the orders reached MySQL and
// before the acknowledgement — by cutting its connections at the broker
// (what a killed process looks like to a broker). Another worker takes the
// queue over once the dead one's lock expires and finishes the sale: nothing
// is deducted twice, no request is lost, and the dead worker's batch reaches
// MySQL through the survivor. Then the "dead" worker wakes up and finishes
// its batch too, which must change nothing.
//
// The worker is held mid-batch by stalling its MySQL connections (a proxy
// that holds their bytes), and the lock's expiry is fast-forwarded on the
// double: the workers renew their locks every 20 s, so the double keeps a
// broker's 60 s lifetime.
func TestConsumerKilledMidBatch(t *testing.T) {
	t.Parallel()
	const stock, requests = 40, 90
	cfg := realConfig(t, "rocketmq")
	srv := startBrokerDouble(t, rmqtest.Options{})
	srv.CreateTopic(cfg.Queue.Topic, rocketMQQueues)
	srv.CreateTopic(cfg.Queue.ExpiryTopic, rocketMQQueues)
	bin := buildBinary(t)
	env := append(rocketMQEnv(cfg, srv.Addr()), "FLASHSALE_QUEUE_BATCH_SIZE=16")
	shop, results := startShopFront(t, bin, cfg, env)

	// The doomed worker reaches the broker only through a port of its own,
	// and MySQL only through a proxy that can stall.
	port, err := srv.Listen()
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	dsn, err := mysql.ParseDSN(cfg.Database.DSN)
	if err != nil {
		t.Fatal(err)
	}
	db := newStallProxy(t, dsn.Addr)
	dsn.Addr = db.addr()
	doomedCfg := cfg
	doomedCfg.Database.DSN = dsn.FormatDSN()
	doomed := startRole(t, bin, "worker", append(rocketMQEnv(doomedCfg, port.Addr()), "FLASHSALE_QUEUE_BATCH_SIZE=16"))
	db.stall()
	t.Cleanup(db.release) // before the doomed worker's stop, which waits for its batch

	campaign := testenv.Name(t, "rmqkill-")
	shop.openCampaign(campaign, stock, 1)
	accepted, codes := shopPaced(t, shop, campaign, requests, 10, 5*time.Millisecond)
	if len(accepted) != requests {
		t.Fatalf("got %d purchases accepted (codes %v), want all %d: nothing is decided yet", len(accepted), codes, requests)
	}

	// Mid-batch: results decided in Redis, orders stuck on their way to MySQL.
	held := map[string]resultBody{}
	testenv.Eventually(t, 20*time.Second, "the doomed worker to decide a batch", func() (bool, string) {
		st := shop.stats(campaign)
		var finished int64
		for _, n := range st.FinishedByStatus {
			finished += n
		}
		return finished > 0 && db.held() > 0, fmt.Sprintf("%d results, %d bytes held on the way to MySQL", finished, db.held())
	})
	for rid, user := range accepted {
		if code, r := results.poll(user, rid); code == http.StatusOK && r.Status != "queued" {
			held[rid] = r
		}
	}
	if err := port.Close(); err != nil {
		t.Fatalf("cut the doomed worker off: %v", err)
	}
	if n := srv.ExpireLocks(cfg.Queue.Group); n == 0 {
		t.Fatalf("the doomed worker held no queue lock, want the campaign's")
	}
	killed := time.Now()

	startRole(t, bin, "worker", env)
	st := shop.settle(campaign, 60*time.Second)
	t.Logf("survivor settled the sale %v after the kill; the dead worker held %d requests", time.Since(killed), len(held))
	verifySettled(t, results, campaign, stock, 1, accepted, st)
	if st.Sold != stock {
		t.Errorf("sold %d, want %d: demand exceeded stock, so nothing may be undersold", st.Sold, stock)
	}
	orders := results.ordersInDB(campaign)
	for rid, r := range held {
		if r.Status == "success" && orders[rid] != r.OrderID {
			t.Errorf("request %s, mid-batch in the dead worker: got order %q in MySQL, want %q (the survivor must persist it)",
				rid, orders[rid], r.OrderID)
		}
	}

	// The zombie finishes its batch: orders already there, results the same.
	db.release()
	if err := doomed.stop(); err != nil {
		t.Errorf("the doomed worker, woken and stopped: %v", err)
	}
	after := shop.settle(campaign, 10*time.Second)
	verifySettled(t, results, campaign, stock, 1, accepted, after)
	for rid, r := range held {
		if _, got := results.poll(accepted[rid], rid); got.Status != r.Status || got.OrderID != r.OrderID {
			t.Errorf("request %s after the zombie finished: got %s/%s, want %s/%s as before", rid, got.Status, got.OrderID, r.Status, r.OrderID)
		}
	}
}

// TestBrokerRestartMidSale restarts the broker (state kept, as on
// its disk) while shoppers' purchases are published and consumed. A
// purchase refused with 503 is retried with the same Idempotency-Key, as a
// shopper's client would; the sale must still end with exactly the stock
// sold, one result per accepted request and nothing lost. The library only
// gives up a pull that was held open across the restart at its next
// rebalance, so the sale may stall that long.
func TestBrokerRestartMidSale(t *testing.T) {
	t.Parallel()
	// The stock lasts past the restart: once it is gone the gateway refuses
	// purchases without publishing, and the restart would hit nothing.
	const stock, requests = 120, 150
	cfg := realConfig(t, "rocketmq")
	srv := startBrokerDouble(t, rmqtest.Options{})
	srv.CreateTopic(cfg.Queue.Topic, rocketMQQueues)
	srv.CreateTopic(cfg.Queue.ExpiryTopic, rocketMQQueues)
	env := append(rocketMQEnv(cfg, srv.Addr()), "FLASHSALE_GATEWAY_PUBLISH_TIMEOUT=300ms")
	c := startRole(t, buildBinary(t), "serve", env).client(t, cfg)
	campaign := testenv.Name(t, "rmqrestart-")
	c.openCampaign(campaign, stock, 1)

	run := shopAcross(t, c, campaign, requests, nil, func() error { return srv.Restart(true, 500*time.Millisecond) })
	// A send the restart cut off after it left is an unknown outcome: its
	// purchase is accepted, and rejected as not enqueued when the message
	// never arrived (after worker.max_queue_delay).
	st := c.settle(campaign, 60*time.Second)
	if run.refused == 0 && st.FinishedByStatus["rejected"] == 0 {
		t.Errorf("got no refused purchase and no request rejected as not enqueued, want the restart to have hit the sale")
	}
	verifySettled(t, c, campaign, stock, 1, run.accepted, st)
	stored := map[string]bool{}
	for _, m := range srv.AllMessages(cfg.Queue.Topic) {
		stored[m.Keys()] = true
	}
	for rid, user := range run.accepted {
		if _, r := c.poll(user, rid); r.Reason == "not_enqueued" && stored[rid] {
			t.Errorf("request %s was rejected as not enqueued, but the broker stored it", rid)
		}
	}
	if st.Sold != stock {
		t.Errorf("sold %d, want %d: demand exceeded stock, so nothing may be undersold", st.Sold, stock)
	}
	t.Logf("%d purchases refused and retried, %d refused as sold out, %d rejected as not enqueued; the sale settled %v after the restart",
		run.refused, run.soldOut, st.FinishedByStatus["rejected"], time.Since(run.faultAt))
}

// stallProxy forwards TCP to a backend and can hold the traffic: while
// stalled, the bytes it reads from either side wait in the proxy, as behind
// a frozen network, and flow on when released.
type stallProxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	flowing chan struct{} // closed while traffic flows
	bytes   atomic.Int64  // read while stalled
}

func newStallProxy(t *testing.T, backend string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &stallProxy{ln: ln, backend: backend, flowing: make(chan struct{})}
	close(p.flowing)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.DialTimeout("tcp", backend, 2*time.Second)
			if err != nil {
				_ = in.Close()
				continue
			}
			go p.pipe(out, in)
			go p.pipe(in, out)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.release()
	})
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

// stall holds all traffic from now on.
func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
		p.flowing = make(chan struct{})
	default:
	}
}

// release lets the held traffic and everything after it through.
func (p *stallProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
	default:
		close(p.flowing)
	}
}

// held counts the bytes read while the proxy was stalled.
func (p *stallProxy) held() int64 { return p.bytes.Load() }

// pipe copies src to dst, holding each chunk while the proxy is stalled.
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			flowing := p.flowing
			p.mu.Unlock()
			select {
			case <-flowing:
			default:
				p.bytes.Add(int64(n))
				<-flowing
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestLongPauseRocketMQ: a sale paused with requests in the queue, for many
// more held deliveries than queue.rocketmq.max_reconsume_times, loses none
// of them to the dead-letter topic: a hold is not a failure (the driver
// runs the held batch again within one delivery). Resumed, every accepted
// request gets its final result. Before, a pause longer than
// max_reconsume_times × suspend_time (1,000 × 1 s by default) dead-lettered
// the held requests, which then never got one.
func TestLongPauseRocketMQ(t *testing.T) {
	t.Parallel()
	const stock, shoppers = 5, 8
	cfg := realConfig(t, "rocketmq")
	srv := startBrokerDouble(t, rmqtest.Options{})
	createTopics(srv, cfg)
	env := append(rocketMQEnv(cfg, srv.Addr()),
		fmt.Sprintf("FLASHSALE_QUEUE_ROCKETMQ_MAX_RECONSUME_TIMES=%d", cfg.Worker.MaxAttempts), // the least allowed
		"FLASHSALE_QUEUE_ROCKETMQ_SUSPEND_TIME=10ms")
	bin := buildBinary(t)
	c := startRole(t, bin, "gateway", env).client(t, cfg)
	results := startRole(t, bin, "notifier", env).client(t, cfg)
	campaign := testenv.Name(t, "rmqpause-")
	c.openCampaign(campaign, stock, 1)
	accepted := map[string]string{}
	for i := range shoppers {
		user := fmt.Sprintf("u%d", i)
		code, rid := c.tryBuy(campaign, user)
		if code != http.StatusAccepted {
			t.Fatalf("purchase %d: got %d, want 202", i, code)
		}
		accepted[rid] = user
	}
	if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/pause", c.admin, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("pause: got %d", code)
	}
	worker := startRole(t, bin, "worker", env)
	w := newClient(t, "http://"+worker.addr, cfg.Auth)
	// Held for three times the deliveries a failure gets before it is
	// dead-lettered.
	holds := float64(3 * (cfg.Worker.MaxAttempts + 2))
	testenv.Eventually(t, 60*time.Second, "the worker holding the paused sale's batch", func() (bool, string) {
		n := w.metric("flashsale_worker_held_batches_total")
		return n >= holds, fmt.Sprintf("%v held deliveries, want %v", n, holds)
	})
	// Operators see the held backlog (the broker's offsets).
	topic := `topic="` + cfg.Queue.Topic + `"`
	if lag, age := w.metricSum("flashsale_queue_lag_messages", topic), w.metricSum("flashsale_queue_oldest_message_age_seconds", topic); lag != shoppers || age <= 0 {
		t.Errorf("while held: flashsale_queue_lag_messages %v, oldest message age %vs; want %d and > 0", lag, age, shoppers)
	}
	if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/resume", c.admin, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("resume: got %d", code)
	}
	st := c.settle(campaign, 60*time.Second)
	final := map[string]int{}
	for rid, user := range accepted {
		code, r := results.poll(user, rid)
		if code != http.StatusOK || r.Status == "queued" {
			t.Fatalf("%s: got %d %+v, want a final result", rid, code, r)
		}
		final[r.Status]++
	}
	if final["success"] != stock || final["sold_out"] != shoppers-stock || st.Sold != stock || st.OrdersInDB != stock {
		t.Fatalf("final %v, stats %+v; want %d successes, %d sold out, all in MySQL", final, st, stock, shoppers-stock)
	}
	if dlq := srv.DLQ(cfg.Queue.Group); len(dlq) != 0 {
		t.Fatalf("dead-letter topic: got %d messages, want none", len(dlq))
	}
	testenv.Eventually(t, 30*time.Second, "the backlog gone once the acknowledgements are committed", func() (bool, string) {
		lag := w.metricSum("flashsale_queue_lag_messages", topic)
		return lag == 0, fmt.Sprintf("lag %v", lag)
	})
}
