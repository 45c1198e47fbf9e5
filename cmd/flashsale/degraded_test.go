package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// TestDegradedSale (issue 28): the test's own Redis is SIGKILLed with about
// 30 % of the stock sold and started again, from its AOF or empty, once
// MySQL holds about 70 %. With degrade: mysql the sale goes on meanwhile:
// purchases are decided in MySQL (202, then their result by poll), and
// when Redis is back the campaign is handed back to it (rebuilt from
// MySQL under a new epoch) before it decides anything. Every unit is sold
// exactly once, nobody passes the limit, every 202 ends final, and Redis
// agrees with MySQL at the end.
func TestDegradedSale(t *testing.T) {
	testenv.SkipShort(t, "a fault test: Redis killed mid-sale, the sale goes on in MySQL")
	for _, driver := range []string{"memqueue", "redisstream", "rocketmq"} {
		for _, restart := range []string{"aof", "empty"} {
			t.Run(driver+"/"+restart, func(t *testing.T) {
				t.Parallel()
				testDegradedSale(t, driver, restart == "empty")
			})
		}
	}
}

func testDegradedSale(t *testing.T, driver string, empty bool) {
	rs, cfg := degradedConfig(t, driver)
	c := startOn(t, cfg)
	campaign := testenv.Name(t, "degraded-")
	const stock, limit, users, tries = 300, 2, 400, 3
	c.openCampaign(campaign, stock, limit)
	// A first sale decided end to end: the workers consume (on RocketMQ
	// only once the broker's rebalance gave them the queues).
	if code, rid := c.tryBuy(campaign, "warm"); code != http.StatusAccepted {
		t.Fatalf("first purchase: got %d, want 202", code)
	} else if r := c.waitFinal("warm", rid, 60*time.Second); r.Status != "success" {
		t.Fatalf("first purchase: got %+v, want success", r)
	}

	var (
		mu       sync.Mutex
		admitted = map[string]string{}
		codes    = map[string]map[int]int{"before": {}, "outage": {}, "after": {}}
		phase    = "before"
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.soldAtLeast(campaign, stock*3/10)
		rs.kill()
		mu.Lock()
		phase = "outage"
		mu.Unlock()
		deadline := time.Now().Add(60 * time.Second)
		for {
			if _, total := unitsByUser(t, cfg.Database, campaign); total >= stock*7/10 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if empty {
			rs.wipe()
		}
		rs.start()
		mu.Lock()
		phase = "after"
		mu.Unlock()
	}()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < users; i += 16 {
				user := fmt.Sprintf("d%05d", i)
				for done := 0; done < tries; {
					code, rid := c.tryBuy(campaign, user)
					mu.Lock()
					codes[phase][code]++
					if code == http.StatusAccepted {
						admitted[rid] = user
					}
					mu.Unlock()
					if code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests {
						done++
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	<-done
	if codes["outage"][http.StatusAccepted] == 0 {
		t.Errorf("no purchase admitted while Redis was down (codes %v): the sale did not go on in MySQL", codes)
	}
	if n := c.metricSum("flashsale_degraded_decisions_total", `result="success"`); n == 0 {
		t.Errorf("flashsale_degraded_decisions_total{result=\"success\"} is 0: nothing was decided in MySQL")
	}

	byStatus, total := checkDegradedSettled(t, cfg, campaign, stock, limit, admitted, func(string) *client { return c })
	t.Logf("codes by phase %v; results %v; %d units in orders", codes, byStatus, total)
}

// degradedConfig is the config of a sale through Redis outages, on a
// Redis of the test's own, with degrade: mysql. The lost rule's bound is
// short: with the queue in a Redis that restarts empty, requests queued at
// the kill died with it, and end rejected (lost) once it passed.
func degradedConfig(t *testing.T, driver string) (*redisServer, config.Config) {
	t.Helper()
	rs := startRedisServer(t)
	cfg := faultConfig(t, driver, rs.addr())
	cfg.Degrade = config.DegradeMySQL
	cfg.Worker.MaxQueueDelay = 10 * time.Second
	return rs, cfg
}

// soldAtLeast waits until Redis says campaign sold n units.
func (c *client) soldAtLeast(campaign string, n int64) {
	c.t.Helper()
	testenv.Eventually(c.t, 60*time.Second, fmt.Sprintf("%d sold", n), func() (bool, string) {
		st := c.stats(campaign)
		return st.Sold >= n, fmt.Sprintf("%+v", st)
	})
}

// TestDegradedFlapping (issue 28): Redis goes down and up three times
// during one sale (killed, started again from its AOF a second or two
// later), on Redis Streams in the same Redis, the embedded default's
// shape: each outage hands the campaign to MySQL and each return hands it
// back, with purchases in flight on both sides of every switch. Exactly
// the stock is sold, nobody passes the limit, every 202 ends final, and
// Redis agrees with MySQL at the end.
func TestDegradedFlapping(t *testing.T) {
	testenv.SkipShort(t, "a fault test: Redis flapping mid-sale, the sale goes on in MySQL")
	t.Parallel()
	rs, cfg := degradedConfig(t, "redisstream")
	c := startOn(t, cfg)
	campaign := testenv.Name(t, "flapping-")
	// Sized to sell out only after the third outage, at this machine's
	// pace (about 500 purchases a second from 16 shoppers).
	const stock, limit, users = 1500, 2, 1000
	c.openCampaign(campaign, stock, limit)

	var (
		down   atomic.Bool
		outage = map[int]int{} // codes while Redis was down
	)
	flapped := make(chan struct{})
	go func() {
		defer close(flapped)
		for range 3 {
			time.Sleep(700 * time.Millisecond)
			rs.kill()
			down.Store(true)
			time.Sleep(time.Second)
			rs.start()
			down.Store(false)
		}
	}()
	// Until Redis has flapped three times and the sale is sold out (demand,
	// two units for each of 1,000 users, outlasts the stock; the per-user
	// limit decides who gets more).
	admitted, codes := shopUntilOver(campaign, "f", users, flapped, func(int) *client { return c },
		func(code int, _ string, _ *client) {
			if down.Load() {
				outage[code]++
			}
		})
	if outage[http.StatusAccepted] == 0 {
		t.Errorf("no purchase admitted while Redis was down (codes then %v)", outage)
	}
	_, total := checkDegradedSettled(t, cfg, campaign, stock, limit, admitted, func(string) *client { return c })
	t.Logf("codes %v (while down %v); %d admitted; %d units in orders", codes, outage, len(admitted), total)
}

// TestLoadtestDegraded: `flashsale loadtest` against a system whose Redis
// is killed part way and started again (degrade: mysql): the purchases
// decided in MySQL are answered at once, and the report counts their
// results apart (results_by_channel "answer"); every invariant holds.
func TestLoadtestDegraded(t *testing.T) {
	testenv.SkipShort(t, "a fault test: the load test through a Redis outage")
	t.Parallel()
	rs := startRedisServer(t)
	cfg := faultConfig(t, "memqueue", rs.addr())
	cfg.Degrade = config.DegradeMySQL
	cfg.Gateway.UserRate, cfg.Gateway.UserBurst = 1000, 1000
	c := startOn(t, cfg)
	go func() {
		time.Sleep(time.Second)
		rs.kill()
		time.Sleep(2 * time.Second)
		rs.start()
	}()
	out, err := runLoadtestCmd(t, "--url", c.base, "--admin-token", testAdminToken, "--jwt-secret", testJWTSecret,
		"--campaign", testenv.Name(t, "ltdegraded-"), "--results", "poll", "--shoppers", "3000", "--stock", "2000",
		"--per-user-limit", "1", "--rate", "600", "--repeat", "0", "--idempotent-share", "0", "--settle", "30s", "--json")
	if err != nil {
		t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	if rep.ByChannel["answer"] == 0 || rep.Delivered != rep.Admitted {
		t.Errorf("results by channel %v, %d delivered for %d admitted: want some decided at once (in MySQL), one result each",
			rep.ByChannel, rep.Delivered, rep.Admitted)
	}
	if !rep.InvariantsHolding {
		t.Errorf("invariants: %+v", rep.Invariants)
	}
	t.Logf("results by channel %v, by status %v", rep.ByChannel, rep.ByStatus)
}

// TestLoadtestSaleInMySQL (issue 28): the whole sale of a campaign
// preloaded before its Redis died, by `flashsale loadtest --existing`
// (the degraded stage of .ci/bench.sh): every purchase is decided in MySQL
// and answered with its result, the admin's stats come from MySQL, and the
// invariants hold. A campaign bought from already is refused.
func TestLoadtestSaleInMySQL(t *testing.T) {
	testenv.SkipShort(t, "a fault test: a sale while Redis is down")
	t.Parallel()
	rs := startRedisServer(t)
	cfg := faultConfig(t, "redisstream", rs.addr()) // the queue dies with Redis: the gateway decides
	cfg.Degrade = config.DegradeMySQL
	cfg.Gateway.UserRate, cfg.Gateway.UserBurst = 1000, 1000
	c := startOn(t, cfg)
	campaign, bought := testenv.Name(t, "ltmysql-"), testenv.Name(t, "ltbought-")
	c.openCampaign(campaign, 400, 1)
	c.openCampaign(bought, 10, 1)
	if code, rid := c.tryBuy(bought, "early"); code != http.StatusAccepted {
		t.Fatalf("purchase before the outage: got %d, want 202", code)
	} else if r := c.waitFinal("early", rid, 30*time.Second); r.Status != "success" {
		t.Fatalf("purchase before the outage: got %+v, want success", r)
	}
	rs.kill()
	testenv.Eventually(t, 30*time.Second, "the system to notice Redis is gone", func() (bool, string) {
		n := c.metricSum("flashsale_redis_up", "")
		return n == 0, fmt.Sprint(n)
	})
	args := []string{"--url", c.base, "--admin-token", testAdminToken, "--jwt-secret", testJWTSecret, "--existing",
		"--results", "poll", "--shoppers", "500", "--repeat", "0", "--idempotent-share", "0", "--settle", "30s", "--json"}
	if out, err := runLoadtestCmd(t, append(args, "--campaign", bought)...); err == nil || !strings.Contains(err.Error(), "nobody bought from") {
		t.Errorf("a campaign bought from: got %v, want refused; output:\n%s", err, out)
	}
	out, err := runLoadtestCmd(t, append(args, "--campaign", campaign)...)
	if err != nil {
		t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	// Past the stock the sold-out flag refuses (410), not admitted.
	if rep.Stock != 400 || rep.ByChannel["answer"] != rep.Admitted || rep.Admitted < 400 || rep.ByStatus["success"] != 400 {
		t.Errorf("stock %d, admitted %d, results by channel %v, by status %v: want stock 400 read from the campaign, each admitted request answered at once, 400 successes",
			rep.Stock, rep.Admitted, rep.ByChannel, rep.ByStatus)
	}
	if !rep.InvariantsHolding {
		t.Errorf("invariants: %+v", rep.Invariants)
	}
	if cpu := rep.ServerCPUPerRequest; cpu == nil || *cpu <= 0 {
		t.Errorf("server CPU per request: got %v, want a figure read from the server's metrics", cpu)
	}
	if st := c.stats(campaign); st.DecidedIn != "mysql" || st.Sold != 400 || st.UnitsInDB != 400 || st.Admitted != int64(rep.Admitted) || st.Queued != 0 {
		t.Errorf("stats while Redis is down: got %+v, want MySQL's: 400 sold and stored, %d admitted, none queued", st, rep.Admitted)
	}
}

// TestDegradedTwoSystems (issue 28): two systems (each a gateway and a
// worker) share MySQL, the campaign and a Redis-Streams queue in a Redis
// of its own, and reach the stock's Redis each through a proxy of its
// own, cut and restored at different moments: for a while one decides in
// MySQL while the other still reaches Redis, and the campaign goes back
// and forth between them, each move fenced by the ledger's epoch. Every
// unit is sold once, nobody passes the limit, every 202 ends final, and
// Redis agrees with MySQL at the end.
func TestDegradedTwoSystems(t *testing.T) {
	testenv.SkipShort(t, "a fault test: two systems lose Redis at different moments")
	t.Parallel()
	rs, cfg := degradedConfig(t, "redisstream-own")
	var proxies [2]*proxy
	var systems [2]*client
	for i := range systems {
		proxies[i] = newProxy(t, rs.addr())
		c := cfg
		c.Redis.Addr = proxies[i].addr()
		systems[i] = startOn(t, c)
	}
	campaign := testenv.Name(t, "twosys-")
	const stock, limit, users = 1200, 2, 900
	systems[0].openCampaign(campaign, stock, limit)

	by := map[string]*client{} // the system a request was admitted by
	cuts := make(chan struct{})
	go func() {
		defer close(cuts)
		step := func(i int, down bool) {
			time.Sleep(700 * time.Millisecond)
			proxies[i].setDown(down)
		}
		step(0, true)  // A out, B in
		step(1, true)  // both out
		step(0, false) // A in, B out
		step(1, false) // both in
		step(1, true)  // B out, A in
		step(1, false)
	}()
	admitted, codes := shopUntilOver(campaign, "t", users, cuts, func(shopper int) *client { return systems[shopper%2] },
		func(code int, rid string, c *client) {
			if code == http.StatusAccepted {
				by[rid] = c
			}
		})
	_, total := checkDegradedSettled(t, cfg, campaign, stock, limit, admitted, func(rid string) *client { return by[rid] })
	var decided float64
	for _, c := range systems {
		decided += c.metricSum("flashsale_degraded_decisions_total", `result="success"`)
	}
	if decided == 0 {
		t.Errorf("no success decided in MySQL")
	}
	t.Logf("codes %v; %d admitted; %.0f successes decided in MySQL; %d units in orders", codes, len(admitted), decided, total)
}

// shopUntilOver runs 16 shoppers over a pool of users (prefix and a
// number below users), shopper w buying through via(w) as users w, w+16,
// … in turn, 30 ms apart, until a minute has passed or, once faultsDone is
// closed, it is answered 410 (the sale is over): so purchases are in
// flight through every fault, and demand that outlasts the stock sells it
// out. note is told each answer (code, request id, the system it came
// from), one at a time. It returns the admitted requests (request id →
// user) and the count of each status code.
func shopUntilOver(campaign, prefix string, users int, faultsDone <-chan struct{}, via func(shopper int) *client,
	note func(code int, rid string, c *client)) (admitted map[string]string, codes map[int]int) {
	var mu sync.Mutex
	admitted, codes = map[string]string{}, map[int]int{}
	var wg sync.WaitGroup
	deadline := time.Now().Add(60 * time.Second)
	for w := range 16 {
		wg.Go(func() {
			c := via(w)
			for i := w; time.Now().Before(deadline); i = (i + 16) % users {
				user := fmt.Sprintf("%s%05d", prefix, i)
				code, rid := c.tryBuy(campaign, user)
				mu.Lock()
				codes[code]++
				if code == http.StatusAccepted {
					admitted[rid] = user
				}
				note(code, rid, c)
				mu.Unlock()
				select {
				case <-faultsDone:
					if code == http.StatusGone {
						return
					}
				default:
				}
				time.Sleep(30 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return admitted, codes
}

// checkDegradedSettled checks a sale through Redis outages once it is
// over. Every 202 ends final: success, sold_out or limit_exceeded, or
// rejected (not_enqueued, or lost once a load dropped its queued marker)
// for a purchase whose publish met a kill, answered 202 with the outcome
// unknown and its message never stored (restarted empty, Redis also took
// the refusals it decided). Each poll agrees with MySQL's orders, exactly
// the stock is sold (demand outlasts it), nobody passes the limit, and
// Redis agrees with MySQL. via names the system a request was admitted
// by. It returns the results by status and reason, and the units sold.
func checkDegradedSettled(t *testing.T, cfg config.Config, campaign string, stock, limit int64, admitted map[string]string,
	via func(rid string) *client) (map[string]int, int64) {
	t.Helper()
	byStatus := map[string]int{}
	var c *client
	systems := map[*client]bool{}
	for rid, user := range admitted {
		c = via(rid)
		systems[c] = true
		r := c.waitFinal(user, rid, cfg.Worker.MaxQueueDelay+60*time.Second)
		byStatus[r.Status+"/"+r.Reason]++
		switch {
		case r.Status == "success", r.Status == "sold_out", r.Status == "limit_exceeded":
		case r.Status == "rejected" && (r.Reason == model.ReasonLost || r.Reason == model.ReasonNotEnqueued):
		default:
			t.Errorf("request %s: got %s (%s), want success, sold_out, limit_exceeded or rejected (not enqueued)", rid, r.Status, r.Reason)
		}
	}
	perUser, total := unitsByUser(t, cfg.Database, campaign)
	if total != stock {
		t.Errorf("orders hold %d units, stock %d: demand outlasted the stock, so want exactly the stock", total, stock)
	}
	for user, n := range perUser {
		if n > limit {
			t.Errorf("%s holds %d units, limit %d", user, n, limit)
		}
	}
	if c == nil {
		t.Fatal("nothing admitted")
	}
	orders := c.ordersInDB(campaign)
	for rid, user := range admitted {
		if _, r := via(rid).poll(user, rid); (r.Status == "success") != (orders[rid] != "") || (r.Status == "success" && r.OrderID != orders[rid]) {
			t.Errorf("request %s: polled %s (order %q), MySQL's order %q", rid, r.Status, r.OrderID, orders[rid])
		}
	}
	testenv.Eventually(t, 30*time.Second, "Redis agrees with MySQL", func() (bool, string) {
		st := c.stats(campaign)
		return st.DecidedIn == "redis" && st.Sold == total && st.UnitsInDB == total && st.Remaining == stock-total, fmt.Sprintf("%+v", st)
	})
	// Once Redis answers, no process counts a campaign decided in MySQL,
	// bought from since or not.
	for sys := range systems {
		testenv.Eventually(t, 30*time.Second, "the degraded gauge back to 0", func() (bool, string) {
			n := sys.metricSum("flashsale_degraded_campaigns", "")
			return n == 0, fmt.Sprint(n)
		})
	}
	return byStatus, total
}
