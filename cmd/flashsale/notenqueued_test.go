package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/redisstream"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

// Not enqueued, end to end: a publish whose outcome is unknown
// (queue.ErrUnknown) is answered 202 and its request kept: a worker decides
// it if its message was stored after all, and the workers' not-enqueued
// sweep rejects it (not_enqueued) if it was not, as it does a request whose
// gateway died before publishing. A publish the queue refused is still
// withdrawn and answered 503.

// faultProxy forwards TCP to Redis and can fault the publishes that pass:
// in dropReply mode it forwards a request carrying XADD, but when Redis
// answers it closes the client's connection instead of passing the answer
// on (stored, outcome unknown to the client); in swallow mode it discards
// every request (nothing stored; the client times out); in holdPublish
// mode it discards the requests carrying XADD, signalling held, and passes
// the rest.
type faultProxy struct {
	ln      net.Listener
	backend string
	mode    atomic.Int32
	held    chan struct{}
	mu      sync.Mutex
	conns   []net.Conn
}

const (
	proxyPass int32 = iota
	proxyDropReply
	proxySwallow
	proxyHoldPublish
)

func newFaultProxy(t *testing.T, backend string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &faultProxy{ln: ln, backend: backend, held: make(chan struct{}, 1)}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.backend)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		var publishing atomic.Bool // an XADD went out in dropReply mode
		go func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := in.Read(buf)
				if err != nil {
					_ = out.Close()
					return
				}
				switch p.mode.Load() {
				case proxySwallow:
					continue
				case proxyHoldPublish:
					if bytes.Contains(bytes.ToLower(buf[:n]), []byte("xadd")) {
						select {
						case p.held <- struct{}{}:
						default:
						}
						continue
					}
				case proxyDropReply:
					if bytes.Contains(bytes.ToLower(buf[:n]), []byte("xadd")) {
						publishing.Store(true)
					}
				}
				if _, err := out.Write(buf[:n]); err != nil {
					_ = in.Close()
					return
				}
			}
		}()
		go func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := out.Read(buf)
				if err != nil || publishing.Load() {
					_ = in.Close()
					_ = out.Close()
					return
				}
				if _, err := in.Write(buf[:n]); err != nil {
					_ = out.Close()
					return
				}
			}
		}()
	}
}

// metric reads a counter from a process's /metrics.
func (c *client) metric(name string) float64 {
	c.t.Helper()
	resp, err := c.http.Get(c.base + "/metrics")
	if err != nil {
		c.t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				c.t.Fatalf("metric %s: %v", name, err)
			}
			return f
		}
	}
	return 0
}

// metricSum adds up a labelled family's samples from a process's
// /metrics whose labels include match (e.g. `topic="t"`).
func (c *client) metricSum(name, match string) float64 {
	c.t.Helper()
	resp, err := c.http.Get(c.base + "/metrics")
	if err != nil {
		c.t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+"{")
		labels, value, cut := strings.Cut(rest, "} ")
		if !ok || !cut || !strings.Contains(labels, match) {
			continue
		}
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			c.t.Fatalf("metric %s: %v", name, err)
		}
		sum += f
	}
	return sum
}

// buyWithKey purchases one unit for user with an Idempotency-Key and
// returns the status code and answer.
func (c *client) buyWithKey(campaign, user, key string) (int, purchaseBody) {
	c.t.Helper()
	var p purchaseBody
	code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(user), `{"quantity":1}`,
		map[string]string{"Idempotency-Key": key}, &p)
	return code, p
}

// mustRetrySame retries user's purchase with the same key and checks that
// it names rid again.
func (c *client) mustRetrySame(campaign, user, key, rid string) {
	c.t.Helper()
	if code, p := c.buyWithKey(campaign, user, key); code != http.StatusOK || p.RequestID != rid {
		c.t.Fatalf("%s's retry with key %s: got %d %s, want 200 %s", user, key, code, p.RequestID, rid)
	}
}

// movePast waits for rid's result pushed over WebSocket to user while other
// shoppers keep buying in campaign, a purchase every quarter second: the
// not-enqueued sweep rejects an orphan once a request admitted
// worker.not_enqueued_grace after it is decided. It returns the result and
// how many purchases it made (each answered 202).
func (c *client) movePast(campaign, user, rid string) (resultBody, int, error) {
	c.t.Helper()
	type pushed struct {
		r   resultBody
		err error
	}
	done := make(chan pushed, 1)
	go func() {
		r, err := c.wsResult(user, rid, 60*time.Second)
		done <- pushed{r, err}
	}()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; {
		select {
		case p := <-done:
			return p.r, n, p.err
		case <-tick.C:
		}
		n++
		if code, _ := c.buyWithKey(campaign, fmt.Sprintf("mover%d", n), "m"); code != http.StatusAccepted {
			c.t.Fatalf("purchase %d while the queue moves: got %d, want 202", n, code)
		}
	}
}

// TestPublishUnknownRedisStream: the gateway publishes through the
// redisstream driver on a connection to Redis that a proxy faults. An XADD
// Redis stored but whose answer was lost is answered 202, and the worker
// sells it; one that never reached Redis is answered 202 too, and once the
// queue has moved past it (a later purchase decided) the not-enqueued
// sweep rejects it, pushed over WebSocket. A retry with the same
// Idempotency-Key names the same request in both cases.
func TestPublishUnknownRedisStream(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	cfg.Gateway.PublishTimeout = 500 * time.Millisecond
	cfg.Worker.NotEnqueuedGrace = 2 * time.Second
	proxy := newFaultProxy(t, cfg.Redis.Addr)
	c := startSystemWith(t, cfg, func(queue.Publisher) queue.Publisher {
		// One connection, no retries (a retried XADD would be stored twice),
		// and the caller's deadline on every read.
		rdb := redis.NewClient(&redis.Options{Addr: proxy.addr(), PoolSize: 1, MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		return redisstream.New(rdb, redisstream.Options{Partitions: cfg.Queue.Partitions, Group: cfg.Queue.Group})
	})
	campaign := testenv.Name(t, "unknown-")
	c.openCampaign(campaign, 1000, 1)
	if code, _ := c.buyWithKey(campaign, "warm", "w"); code != http.StatusAccepted {
		t.Fatalf("purchase before the faults: got %d, want 202", code)
	}
	c.settle(campaign, 30*time.Second)

	// Stored, answer lost.
	proxy.mode.Store(proxyDropReply)
	code, ann := c.buyWithKey(campaign, "ann", "a")
	proxy.mode.Store(proxyPass)
	if code != http.StatusAccepted || ann.RequestID == "" {
		t.Fatalf("stored, answer lost: got %d %+v, want 202 with a request id", code, ann)
	}
	c.mustRetrySame(campaign, "ann", "a", ann.RequestID)
	c.settle(campaign, 30*time.Second)
	if code, r := c.pollDecided("ann", ann.RequestID); code != http.StatusOK || r.Status != "success" || r.OrderID == "" {
		t.Fatalf("stored, answer lost: got %d %+v, want a success", code, r)
	}

	// Never stored.
	proxy.mode.Store(proxySwallow)
	code, ben := c.buyWithKey(campaign, "ben", "b")
	proxy.mode.Store(proxyPass)
	if code != http.StatusAccepted || ben.RequestID == "" {
		t.Fatalf("never stored: got %d %+v, want 202 with a request id", code, ben)
	}
	c.mustRetrySame(campaign, "ben", "b", ben.RequestID)
	if code, r := c.poll("ben", ben.RequestID); code != http.StatusOK || r.Status != "queued" {
		t.Fatalf("never stored, before the not-enqueued sweep: got %d %+v, want queued", code, r)
	}
	r, n, err := c.movePast(campaign, "ben", ben.RequestID)
	if err != nil || r.Status != "rejected" || r.Reason != "not_enqueued" {
		t.Fatalf("never stored: pushed %+v, %v; want rejected/not_enqueued", r, err)
	}
	c.mustRetrySame(campaign, "ben", "b", ben.RequestID)

	st := c.settle(campaign, 10*time.Second)
	if st.Admitted != int64(3+n) || st.Sold != int64(2+n) || st.FinishedByStatus["rejected"] != 1 || st.OrdersInDB != int64(2+n) {
		t.Fatalf("stats: got %+v, want %d admitted, %d sold and in MySQL, 1 rejected", st, 3+n, 2+n)
	}
	orders := c.ordersInDB(campaign)
	if _, ok := orders[ben.RequestID]; ok {
		t.Fatalf("the request rejected as not enqueued has an order")
	}
	if got := c.metric("flashsale_publish_unknown_total"); got != 2 {
		t.Fatalf("flashsale_publish_unknown_total: got %v, want 2", got)
	}
	if got := c.metric("flashsale_not_enqueued_total"); got != 1 {
		t.Fatalf("flashsale_not_enqueued_total: got %v, want 1", got)
	}
}

// RocketMQ 4.9.4's codes for the faults below: RequestCode.SEND_MESSAGE,
// ResponseCode.FLUSH_DISK_TIMEOUT and ResponseCode.SYSTEM_BUSY.
const (
	rmqSendMessage      int16 = 10
	rmqFlushDiskTimeout int16 = 10
	rmqSystemBusy       int16 = 2
)

// TestPublishUnknownRocketMQ: `flashsale serve` on the rocketmq driver
// against the broker double. A send the broker refused (SYSTEM_BUSY) is
// withdrawn and answered 503, and leaves nothing: the shopper's retry with
// the same key is a new request. A send the broker stored but answered
// FLUSH_DISK_TIMEOUT is answered 202, a retry names the same request, and
// the worker sells it.
func TestPublishUnknownRocketMQ(t *testing.T) {
	t.Parallel()
	cfg := realConfig(t, "rocketmq")
	srv := startBrokerDouble(t, rmqtest.Options{})
	createTopics(srv, cfg)
	c := startRole(t, buildBinary(t), "serve", rocketMQEnv(cfg, srv.Addr())).client(t, cfg)
	campaign := testenv.Name(t, "rmqunknown-")
	c.openCampaign(campaign, 10, 1)

	srv.InjectFault(rmqSendMessage, rmqtest.Fault{Code: rmqSystemBusy, Remark: "busy", Times: 1})
	if code, p := c.buyWithKey(campaign, "ann", "a"); code != http.StatusServiceUnavailable || p.Code != "unavailable" {
		t.Fatalf("refused send: got %d %+v, want 503 unavailable", code, p)
	}
	if st := c.stats(campaign); st.Admitted != 0 || st.Queued != 0 || len(srv.AllMessages(cfg.Queue.Topic)) != 0 {
		t.Fatalf("after the refused send: admitted %d, queued %d, %d messages; want nothing left",
			st.Admitted, st.Queued, len(srv.AllMessages(cfg.Queue.Topic)))
	}

	srv.InjectFault(rmqSendMessage, rmqtest.Fault{Code: rmqFlushDiskTimeout, Remark: "flush timed out", Stored: true, Times: 1})
	code, ann := c.buyWithKey(campaign, "ann", "a")
	if code != http.StatusAccepted || ann.RequestID == "" {
		t.Fatalf("stored, FLUSH_DISK_TIMEOUT: got %d %+v, want 202 with a new request", code, ann)
	}
	if msgs := srv.AllMessages(cfg.Queue.Topic); len(msgs) != 1 || msgs[0].Keys() != ann.RequestID {
		t.Fatalf("messages on the topic: got %d, want the request's one", len(msgs))
	}
	c.mustRetrySame(campaign, "ann", "a", ann.RequestID)
	st := c.settle(campaign, 60*time.Second)
	if code, r := c.pollDecided("ann", ann.RequestID); code != http.StatusOK || r.Status != "success" || r.OrderID == "" {
		t.Fatalf("stored, FLUSH_DISK_TIMEOUT: got %d %+v, want a success", code, r)
	}
	if st.Admitted != 1 || st.Sold != 1 || st.OrdersInDB != 1 {
		t.Fatalf("stats: got %+v, want 1 admitted, sold and in MySQL", st)
	}
	if got := c.metric("flashsale_publish_unknown_total"); got != 1 {
		t.Fatalf("flashsale_publish_unknown_total: got %v, want 1", got)
	}
}

// TestGatewayKilledBeforePublish: a gateway process is SIGKILLed after
// admit.lua stored a purchase and before its publish reached the queue (a
// proxy holds its XADD): the shopper has no answer, and no message will
// ever come. Their retry with the same Idempotency-Key at another gateway
// names the stored request; once the queue has moved past it (purchases
// admitted worker.not_enqueued_grace later decided; worker.max_queue_delay
// is far off), the workers' not-enqueued sweep rejects it, pushed over
// WebSocket, so it ends instead of staying queued for good. Nothing is
// sold for it.
func TestGatewayKilledBeforePublish(t *testing.T) {
	testenv.SkipShort(t, "a fault test: kills the gateway before its publish")
	cfg := realConfig(t, "redisstream")
	proxy := newFaultProxy(t, cfg.Redis.Addr)
	bin := buildBinary(t)
	c := startFrontEnd(t, cfg)
	startRole(t, bin, "worker", processEnv(cfg))
	doomedCfg := cfg
	doomedCfg.Redis.Addr = proxy.addr()
	// Its publish waits on the held XADD until it is killed; the worker
	// settings it must validate with that follow.
	doomed := startRole(t, bin, "gateway", append(processEnv(doomedCfg), "FLASHSALE_GATEWAY_PUBLISH_TIMEOUT=1m",
		"FLASHSALE_WORKER_NOT_ENQUEUED_GRACE=3m", "FLASHSALE_WORKER_MAX_QUEUE_DELAY=5m"))

	campaign := testenv.Name(t, "gwkill-")
	c.openCampaign(campaign, 1000, 1)
	if code, _ := c.buyWithKey(campaign, "warm", "w"); code != http.StatusAccepted {
		t.Fatalf("purchase before the fault: got %d, want 202", code)
	}
	c.settle(campaign, 30*time.Second)

	proxy.mode.Store(proxyHoldPublish)
	answered := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://"+doomed.addr+"/api/v1/campaigns/"+campaign+"/purchases", strings.NewReader(`{"quantity":1}`))
		req.Header.Set("Authorization", "Bearer "+c.token("ann"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "a")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			err = fmt.Errorf("answered %d", resp.StatusCode)
		}
		answered <- err
	}()
	select {
	case <-proxy.held:
	case err := <-answered:
		t.Fatalf("the doomed gateway answered before its publish was held: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no publish held within 30 s")
	}
	doomed.kill()
	if err := <-answered; err == nil || strings.HasPrefix(err.Error(), "answered") {
		t.Fatalf("the shopper's request to the killed gateway: got %v, want no answer", err)
	}

	code, ann := c.buyWithKey(campaign, "ann", "a")
	if code != http.StatusOK || ann.RequestID == "" {
		t.Fatalf("retry with the key at another gateway: got %d %+v, want 200 naming the stored request", code, ann)
	}
	if code, r := c.poll("ann", ann.RequestID); code != http.StatusOK || r.Status != "queued" {
		t.Fatalf("not enqueued, before the sweep: got %d %+v, want queued", code, r)
	}
	r, n, err := c.movePast(campaign, "ann", ann.RequestID)
	if err != nil || r.Status != "rejected" || r.Reason != "not_enqueued" {
		t.Fatalf("not enqueued: pushed %+v, %v; want rejected/not_enqueued", r, err)
	}
	st := c.settle(campaign, 30*time.Second)
	if st.Admitted != int64(2+n) || st.Sold != int64(1+n) || st.FinishedByStatus["rejected"] != 1 || st.OrdersInDB != int64(1+n) {
		t.Fatalf("stats: got %+v, want %d admitted, %d sold and in MySQL, 1 rejected", st, 2+n, 1+n)
	}
	if _, ok := c.ordersInDB(campaign)[ann.RequestID]; ok {
		t.Fatalf("the request rejected as not enqueued has an order")
	}
}
