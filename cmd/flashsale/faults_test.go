package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

// shopPaced sends n purchases from n distinct users, spread over workers
// goroutines with a pause between requests, so that a fault injected while it
// runs hits a sale in progress. It returns the admitted request ids (with
// their users) and the count of each status code.
func shopPaced(t *testing.T, c *client, campaign string, n, workers int, gap time.Duration) (map[string]string, map[int]int) {
	t.Helper()
	var mu sync.Mutex
	admitted, codes := map[string]string{}, map[int]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				user := fmt.Sprintf("f%05d", i)
				var p purchaseBody
				code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(user), `{"quantity":1}`, nil, &p)
				mu.Lock()
				codes[code]++
				if code == http.StatusAccepted {
					admitted[p.RequestID] = user
				}
				mu.Unlock()
				time.Sleep(gap)
			}
		}()
	}
	wg.Wait()
	return admitted, codes
}

// proxy forwards TCP to a backend and can cut it off: while down it resets
// every connection and refuses new ones, as an unreachable server would.
type proxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	down    bool
	conns   map[net.Conn]bool
}

func newProxy(t *testing.T, backend string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &proxy{ln: ln, backend: backend, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.setDown(true) })
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.backend, 2*time.Second)
		if err != nil {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		p.conns[in], p.conns[out] = true, true
		p.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
		go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
	}
}

func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			_ = c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

// TestMySQLOutage: MariaDB is unreachable for 10 s mid-sale. Workers must not
// acknowledge unpersisted successes, readiness must say so, and after
// recovery every success is in MySQL exactly once. On RocketMQ (`flashsale
// serve` against the broker double, max_reconsume_times at its least and
// suspend_time 10 ms) the held batches must not reach the dead-letter
// topic either: an outage is a hold, not a failure.
func TestMySQLOutage(t *testing.T) {
	testenv.SkipShort(t, "a fault test: MySQL down for 10 s mid-sale")
	// Each variant has its own proxy in front of MySQL: they run side by
	// side.
	t.Run("redisstream", func(t *testing.T) {
		t.Parallel()
		mysqlOutage(t, realConfig(t, "redisstream"), startSystem)
	})
	t.Run("rocketmq", func(t *testing.T) {
		t.Parallel()
		cfg := realConfig(t, "rocketmq")
		srv := startBrokerDouble(t, rmqtest.Options{})
		createTopics(srv, cfg)
		bin := buildBinary(t)
		mysqlOutage(t, cfg, func(t *testing.T, cfg config.Config) *client {
			env := append(rocketMQEnv(cfg, srv.Addr()),
				fmt.Sprintf("FLASHSALE_QUEUE_ROCKETMQ_MAX_RECONSUME_TIMES=%d", cfg.Worker.MaxAttempts),
				"FLASHSALE_QUEUE_ROCKETMQ_SUSPEND_TIME=10ms")
			return startRole(t, bin, "serve", env).client(t, cfg)
		})
		if dlq := srv.DLQ(cfg.Queue.Group); len(dlq) != 0 {
			t.Errorf("dead-letter topic: got %d messages, want none", len(dlq))
		}
	})
}

func mysqlOutage(t *testing.T, cfg config.Config, start func(*testing.T, config.Config) *client) {
	dsn, err := mysql.ParseDSN(cfg.Database.DSN)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, dsn.Addr)
	dsn.Addr = px.addr()
	cfg.Database.DSN = dsn.FormatDSN()
	c := start(t, cfg)
	campaign := testenv.Name(t, "mysqlout-")
	soak := testenv.Soak()
	stock, limit := int64(150*soak), int64(1)
	c.openCampaign(campaign, stock, limit)

	outage := make(chan struct{})
	readyDown := make(chan bool, 1)
	go func() {
		c.saleUnderway(campaign, stock)
		px.setDown(true)
		close(outage)
		sawDown := false
		deadline := time.Now().Add(time.Duration(soak) * 10 * time.Second)
		for time.Now().Before(deadline) {
			var body map[string]string
			if code := c.do("GET", "/readyz", "", nil, nil, &body); code == http.StatusServiceUnavailable && body["mysql"] == "down" {
				sawDown = true
			}
			time.Sleep(200 * time.Millisecond)
		}
		// Up again before the answer: the test reads stats through the
		// proxy as soon as it has it.
		px.setDown(false)
		readyDown <- sawDown
	}()
	admitted, codes := shopPaced(t, c, campaign, 600*soak, 20, 100*time.Millisecond)
	<-outage
	if !<-readyDown {
		t.Errorf("/readyz never reported mysql down during the outage")
	}
	// c reads orders through the proxy, now up again: the recovered path.
	st := c.settle(campaign, 60*time.Second)
	byStatus := verifySettled(t, c, campaign, stock, limit, admitted, st)
	if st.Sold != stock {
		t.Errorf("sold %d, want %d: demand (%d admitted) exceeded stock, so nothing may be undersold", st.Sold, stock, len(admitted))
	}
	held := c.metric("flashsale_worker_held_batches_total")
	if held == 0 {
		t.Errorf("flashsale_worker_held_batches_total: 0, want the outage's batches held")
	}
	t.Logf("codes %v, results %v, %v held deliveries", codes, byStatus, held)
}

// saleUnderway waits until a tenth of campaign's stock is sold, so that a
// fault falls mid-sale however slow the machine, or 30 s pass, and returns
// what remains. It runs beside the shoppers, off the test's goroutine: the
// caller checks what it returns.
func (c *client) saleUnderway(campaign string, stock int64) (remaining int64) {
	end := time.Now().Add(30 * time.Second)
	for {
		st := c.stats(campaign)
		if st.Sold >= max(stock/10, 1) || time.Now().After(end) {
			return st.Remaining
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisServer runs a redis-server of the test's own on a free port, with AOF
// fsynced on every write, so that a SIGKILL loses nothing acknowledged.
type redisServer struct {
	t    *testing.T
	port int
	dir  string
	cmd  *exec.Cmd
}

func startRedisServer(t *testing.T) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if testenv.InCI() {
			t.Fatalf("CI=true and redis-server is not installed: %v", err)
		}
		t.Skip("redis-server not installed")
	}
	// A port below the kernel's ephemeral range (32768 on) and the test
	// clusters' (20000 on): a free one there is not taken by an outgoing
	// connection before redis-server binds it.
	port := 0
	for tries := 0; port == 0; tries++ {
		if tries == 1000 {
			t.Fatal("no free port for a redis-server")
		}
		p := 12000 + rand.IntN(8000)
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			_ = ln.Close()
			port = p
		}
	}
	rs := &redisServer{t: t, port: port, dir: t.TempDir()}
	rs.start()
	t.Cleanup(func() { rs.kill() })
	return rs
}

func (rs *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(rs.port) }

func (rs *redisServer) start() {
	rs.t.Helper()
	rs.cmd = exec.Command("redis-server", "--port", strconv.Itoa(rs.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", rs.dir)
	rs.cmd.Stdout, rs.cmd.Stderr = io.Discard, io.Discard
	if err := rs.cmd.Start(); err != nil {
		rs.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer c.Close()
	testenv.Eventually(rs.t, 10*time.Second, "redis-server on "+rs.addr()+" up", func() (bool, string) {
		err := c.Ping(context.Background()).Err()
		return err == nil, fmt.Sprint(err)
	})
}

func (rs *redisServer) kill() {
	if rs.cmd != nil && rs.cmd.Process != nil {
		_ = rs.cmd.Process.Signal(os.Kill)
		_ = rs.cmd.Wait()
		rs.cmd = nil
	}
}

// faultConfig is realConfig on the test's own Redis at stockAddr. The
// driver redisstream-own is redisstream with the queue in a private
// redis-server of its own (queue.redis), which the faults leave alone.
func faultConfig(t *testing.T, driver, stockAddr string) config.Config {
	t.Helper()
	cfg := realConfig(t, strings.TrimSuffix(driver, "-own"))
	cfg.Redis.Addr = stockAddr
	if driver == "redisstream-own" {
		cfg.Queue.Redis.Mode, cfg.Queue.Redis.Addr = "server", startRedisServer(t).addr()
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	return cfg
}

// TestRedisRestartWithAOF: the test's own Redis (AOF, appendfsync always) is
// SIGKILLed mid-sale and restarted from its AOF; no acknowledged request or
// success is lost, and every invariant holds once the system settles. With
// redisstream-own only the stock's Redis is killed, not the queue's.
func TestRedisRestartWithAOF(t *testing.T) {
	testenv.SkipShort(t, "a fault test: Redis killed mid-sale")
	for _, driver := range []string{"redisstream", "redisstream-own", "memqueue", "rocketmq"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			testRedisRestart(t, driver)
		})
	}
}

func testRedisRestart(t *testing.T, driver string) {
	rs := startRedisServer(t)
	cfg := faultConfig(t, driver, rs.addr())
	c := startOn(t, cfg)
	campaign := testenv.Name(t, "redisout-")
	const stock, limit = 300, 1
	c.openCampaign(campaign, stock, limit)

	restarted := make(chan struct{})
	var remainingAtKill int64
	var told map[string]resultBody
	go func() {
		defer close(restarted)
		remainingAtKill = c.saleUnderway(campaign, stock)
		told = c.toldSuccesses(campaign, 10)
		rs.kill()
		time.Sleep(time.Second)
		rs.start()
	}()
	admitted, codes := shopPaced(t, c, campaign, 500, 10, 100*time.Millisecond)
	<-restarted
	if remainingAtKill == 0 || remainingAtKill == stock {
		t.Errorf("Redis was killed with %d of %d left: want mid-sale", remainingAtKill, stock)
	}
	for code := range codes {
		if code != http.StatusAccepted && code != http.StatusGone && code != http.StatusServiceUnavailable {
			t.Errorf("unexpected status %d during a Redis restart (codes %v)", code, codes)
		}
	}
	st := c.settle(campaign, 60*time.Second)
	byStatus := verifySettled(t, c, campaign, stock, limit, admitted, st)
	if st.Sold != stock {
		t.Errorf("sold %d, want %d: demand exceeded stock, so nothing may be undersold", st.Sold, stock)
	}
	c.checkStillTold(told)
	t.Logf("killed with %d left; codes %v, results %v; %d successes polled before the kill", remainingAtKill, codes, byStatus, len(told))
}

// toldSuccesses polls up to n of campaign's orders in MySQL as their
// shoppers would, and returns the successes read, by request id: what
// shoppers were told, which no fault may take back (checkStillTold).
func (c *client) toldSuccesses(campaign string, n int) map[string]resultBody {
	c.t.Helper()
	orders := c.campaignOrders(campaign)
	told := map[string]resultBody{}
	for _, o := range orders[:min(n, len(orders))] {
		if code, r := c.poll(o.UserID, o.RequestID); code == http.StatusOK && r.Status == "success" {
			r.UserID = o.UserID
			told[o.RequestID] = r
		}
	}
	return told
}

// checkStillTold fails the test for each success of told (toldSuccesses)
// that its shopper's poll no longer reads the same.
func (c *client) checkStillTold(told map[string]resultBody) {
	c.t.Helper()
	for rid, was := range told {
		if _, r := c.poll(was.UserID, rid); r.Status != was.Status || r.OrderID != was.OrderID {
			c.t.Errorf("request %s: polled success (order %s) before the fault, %s (%s, order %q) after: a success taken back",
				rid, was.OrderID, r.Status, r.Reason, r.OrderID)
		}
	}
}
