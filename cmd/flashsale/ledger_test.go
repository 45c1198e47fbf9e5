package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
)

// The ledger end to end: Redis loses everything while MySQL keeps the
// orders, and the operator's preload rebuilds the sale from them.

// tryBuy sends one purchase and returns its status code and request id.
func (c *client) tryBuy(campaign, user string) (int, string) {
	c.t.Helper()
	var p purchaseBody
	code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(user), `{"quantity":1}`, nil, &p)
	return code, p.RequestID
}

// waitFinal polls rid until its result is final.
func (c *client) waitFinal(user, rid string, timeout time.Duration) resultBody {
	c.t.Helper()
	var r resultBody
	testenv.Eventually(c.t, timeout, "a final result for "+rid, func() (bool, string) {
		var code int
		code, r = c.poll(user, rid)
		return code == http.StatusOK && r.Status != "queued", fmt.Sprintf("%d %+v", code, r)
	})
	return r
}

// preload preloads a campaign and returns the outcome.
func (c *client) preload(campaign string) string {
	c.t.Helper()
	var out struct {
		Outcome string `json:"outcome"`
	}
	if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/preload", c.admin, nil, nil, &out); code != http.StatusOK {
		c.t.Fatalf("preload: got %d, want 200", code)
	}
	return out.Outcome
}

// unitsByUser reads the campaign's orders from MySQL: units per user and in
// all.
func unitsByUser(t *testing.T, cfg config.Database, campaign string) (map[string]int64, int64) {
	t.Helper()
	db, err := sqlstore.Open(context.Background(), cfg.Driver, cfg.DSN)
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	defer db.Close()
	orders, err := db.CampaignOrders(context.Background(), campaign)
	if err != nil {
		t.Fatalf("orders: %v", err)
	}
	perUser, total := map[string]int64{}, int64(0)
	for _, o := range orders {
		perUser[o.UserID] += o.Quantity
		total += o.Quantity
	}
	return perUser, total
}

func flushAll(t *testing.T, addr string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
}

// checkReconciled compares Redis with MySQL as `flashsale reconcile` does.
func checkReconciled(t *testing.T, redisAddr string, db config.Database, campaign string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	sdb, err := sqlstore.Open(context.Background(), db.Driver, db.DSN)
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	defer sdb.Close()
	rep, err := reconcile.New(store.New(rdb), sdb).Check(context.Background(), campaign)
	if err != nil || !rep.Consistent() {
		t.Fatalf("Redis vs MySQL: %+v, %v", rep.Differences, err)
	}
}

// TestPreloadAfterRedisLoss is the reproduction: stock 3, 2 sold,
// Redis flushed, preload, 3 more shoppers and a repeat buyer. Preload used
// to answer "loaded" with the full stock again (5 units sold of 3) and the
// per-user limit forgotten; it rebuilds now. The preload comes before any
// purchase: a purchase would have the gateway restore the campaign itself
// (TestRedisRestartEmpty).
func TestPreloadAfterRedisLoss(t *testing.T) {
	rs := startRedisServer(t)
	cfg := realConfig(t, "memqueue")
	cfg.Redis.Addr = rs.addr()
	c := startSystem(t, cfg)
	campaign := testenv.Name(t, "repro-")
	c.openCampaign(campaign, 3, 1)
	for _, user := range []string{"u1", "u2"} {
		code, rid := c.tryBuy(campaign, user)
		if code != http.StatusAccepted {
			t.Fatalf("buy %s: got %d", user, code)
		}
		if r := c.waitFinal(user, rid, 10*time.Second); r.Status != "success" {
			t.Fatalf("buy %s: got %s, want success", user, r.Status)
		}
	}
	c.settle(campaign, 10*time.Second)

	flushAll(t, rs.addr())
	if got := c.preload(campaign); got != "rebuilt" {
		t.Errorf("preload after the loss: got %q, want rebuilt", got)
	}
	sold := 0
	for _, user := range []string{"u1", "u3", "u4", "u5"} {
		code, rid := c.tryBuy(campaign, user)
		if code == http.StatusGone {
			continue
		}
		if code != http.StatusAccepted {
			t.Fatalf("buy %s: got %d", user, code)
		}
		r := c.waitFinal(user, rid, 10*time.Second)
		if r.Status == "success" {
			sold++
		}
		if user == "u1" && r.Status != "limit_exceeded" {
			t.Errorf("u1 again, limit 1: got %s, want limit_exceeded", r.Status)
		}
	}
	c.settle(campaign, 10*time.Second)
	perUser, total := unitsByUser(t, cfg.Database, campaign)
	if sold != 1 || total != 3 {
		t.Errorf("after the rebuild: %d more sold, %d units in orders; want 1 more, 3 of stock 3", sold, total)
	}
	for user, n := range perUser {
		if n > 1 {
			t.Errorf("%s holds %d units, limit 1", user, n)
		}
	}
	checkReconciled(t, rs.addr(), cfg.Database, campaign)
}

// TestRedisLostMidSale (issue test 5): a sale under load through real HTTP
// loses all of Redis (FLUSHALL on the test's own redis-server) part way.
// Meanwhile gateways answer 503 and workers hold until the first of them
// restores the campaign from MySQL; the operator's preload that follows
// finds it rebuilt (or rebuilds it, if it comes first), and the sale goes
// on to the end. No unit is
// oversold or undersold, nobody passes the limit, the results of orders
// stored before the loss read the same after it, every admitted request
// ends with a final result (or, decided without an order before the loss,
// lost with Redis), and Redis agrees with MySQL at the end.
func TestRedisLostMidSale(t *testing.T) {
	rs := startRedisServer(t)
	cfg := realConfig(t, "memqueue") // the queue must not live in the Redis that is lost
	cfg.Redis.Addr = rs.addr()
	c := startSystem(t, cfg)
	db := cfg.Database
	campaign := testenv.Name(t, "lost-")
	soak := testenv.Soak()
	stock, limit := int64(150*soak), int64(2)
	users, tries := 200*soak, 3 // 600 tries of a unit for 150: demand outlasts the stock
	c.openCampaign(campaign, stock, limit)

	type request struct {
		user         string
		afterPreload bool
	}
	var (
		mu        sync.Mutex
		admitted  = map[string]*request{}
		codes     = map[int]int{}
		outage    = map[int]int{} // codes between the flush and the preload
		flushed   atomic.Bool
		preloaded atomic.Bool
	)
	shop := func(user string) {
		// A shopper told 503 (or 429, retrying that fast) tries again:
		// only answers count as tries, or the outage's quick 503s would use
		// the demand up and leave the rebuilt stock unsold.
		for done, attempts := 0, 0; done < tries && attempts < 200; attempts++ {
			code, rid := c.tryBuy(campaign, user)
			if code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests {
				done++
			}
			mu.Lock()
			codes[code]++
			if flushed.Load() && !preloaded.Load() {
				outage[code]++
			}
			if code == http.StatusAccepted {
				admitted[rid] = &request{user: user, afterPreload: preloaded.Load()}
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}
	wg := c.shopUntilSold(campaign, users, stock/3, shop)
	before := c.ordersInDB(campaign) // stored before the loss: request -> order
	flushed.Store(true)
	flushAll(t, rs.addr())
	lostAt := time.Now()
	// The operator notices after half a second or more: shoppers are
	// refused meanwhile, unless the system restored the campaign first.
	// It does when a batch or a purchase meets the loss; while the
	// gateway's sold-out flag answers every purchase (admissions fill the
	// stock), the worker's batch may be the first to meet it.
	refused, restoredBySystem := 0, false
	for (refused == 0 && !restoredBySystem) || time.Since(lostAt) < 500*time.Millisecond {
		if time.Since(lostAt) > 30*time.Second {
			t.Fatalf("no purchase refused and no restore within 30 s of the loss")
		}
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		refused = outage[http.StatusServiceUnavailable]
		mu.Unlock()
		var st statsBody
		restoredBySystem = restoredBySystem || c.do("GET", "/admin/v1/campaigns/"+campaign+"/stats", c.admin, nil, nil, &st) == http.StatusOK && st.Preloaded
	}

	preloadAt := time.Now()
	if got := c.preload(campaign); got != "rebuilt" && got != "unchanged" {
		t.Fatalf("preload after the loss: got %q, want rebuilt or unchanged (restored)", got)
	}
	preloaded.Store(true)
	rebuiltSold := c.stats(campaign).Sold
	var firstSale time.Duration
	for firstSale == 0 {
		if st := c.stats(campaign); st.Sold > rebuiltSold || st.Remaining == 0 {
			firstSale = time.Since(preloadAt)
		}
		if time.Since(preloadAt) > 30*time.Second {
			t.Fatalf("no sale within 30 s of the rebuild")
		}
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	st := c.settle(campaign, 60*time.Second)

	var finished int64
	for _, n := range st.FinishedByStatus {
		finished += n
	}
	if st.Admitted != finished {
		t.Errorf("Redis counts %d admitted, %d final results: want one final result per admitted request", st.Admitted, finished)
	}
	perUser, total := unitsByUser(t, db, campaign)
	if total != stock || st.Sold != stock || st.Remaining != 0 {
		t.Errorf("units in orders %d, Redis sold %d, remaining %d; want %d sold (demand outlasted the stock), none left",
			total, st.Sold, st.Remaining, stock)
	}
	for user, n := range perUser {
		if n > limit {
			t.Errorf("%s holds %d units, limit %d", user, n, limit)
		}
	}
	if len(before) == 0 || int64(len(before)) >= stock {
		t.Errorf("%d orders stored before the loss, want some but not all", len(before))
	}
	if (outage[http.StatusServiceUnavailable] == 0 && !restoredBySystem) || outage[http.StatusConflict] != 0 {
		t.Errorf("answers between the loss and the preload: %v (restored before the preload: %v); want 503s or a restore, and no 409 not_loaded",
			outage, restoredBySystem)
	}
	for code := range codes {
		switch code {
		case http.StatusAccepted, http.StatusGone, http.StatusServiceUnavailable, http.StatusTooManyRequests:
		default:
			t.Errorf("unexpected status %d (codes %v)", code, codes)
		}
	}

	orders := c.ordersInDB(campaign)
	for rid, oid := range before {
		if orders[rid] != oid {
			t.Errorf("order %s of %s stored before the loss: now %q", oid, rid, orders[rid])
		}
	}
	lost, final := 0, map[string]int{}
	for rid, r := range admitted {
		code, res := c.pollDecided(r.user, rid)
		oid, ordered := orders[rid]
		switch {
		case code == http.StatusOK && res.Status != "queued":
			final[res.Status]++
			if (res.Status == "success") != ordered || (ordered && res.OrderID != oid) {
				t.Errorf("%s: result %s (order %q), MySQL order %q", rid, res.Status, res.OrderID, oid)
			}
		case code == http.StatusOK && res.Status == "queued" && !r.afterPreload && !ordered:
			// Decided before the loss, not a success: its result was only
			// in Redis. Never 404: it reads queued until the queue has
			// passed it (a purchase admitted worker.not_enqueued_grace
			// later decided; sold out, max_queue_delay after it), then
			// rejected (lost).
			lost++
		default:
			t.Errorf("%s (admitted %s the preload): got %d %+v, want a final result", rid,
				map[bool]string{false: "before", true: "after"}[r.afterPreload], code, res)
		}
	}
	checkReconciled(t, rs.addr(), db, campaign)
	t.Logf("stock %d: %d orders stored before the loss; %d admitted, final %v, %d results lost with Redis; "+
		"outage %s (answers %v, restored before the preload: %v); first sale %s after the preload; codes %v",
		stock, len(before), len(admitted), final, lost, preloadAt.Sub(lostAt).Round(time.Millisecond), outage, restoredBySystem,
		firstSale.Round(time.Millisecond), codes)
}

// TestPauseResume: a paused sale answers 409 paused and its queued
// requests wait; resumed, it sells again.
func TestPauseResume(t *testing.T) {
	c := startSystem(t, realConfig(t, "memqueue"))
	campaign := testenv.Name(t, "pause-")
	c.openCampaign(campaign, 10, 1)
	pause := func(action string, want bool) {
		t.Helper()
		var out struct {
			Paused bool `json:"paused"`
		}
		if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/"+action, c.admin, nil, nil, &out); code != http.StatusOK || out.Paused != want {
			t.Fatalf("%s: got %d paused=%v, want 200 paused=%v", action, code, out.Paused, want)
		}
	}
	code, rid := c.tryBuy(campaign, "ann")
	if code != http.StatusAccepted || c.waitFinal("ann", rid, 10*time.Second).Status != "success" {
		t.Fatalf("buy before the pause: got %d", code)
	}
	pause("pause", true)
	var refusal purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("bob"), `{"quantity":1}`, nil, &refusal); code != http.StatusConflict || refusal.Code != "paused" {
		t.Fatalf("buy while paused: got %d %q, want 409 paused", code, refusal.Code)
	}
	if got := c.preload(campaign); got != "unchanged" {
		t.Errorf("preload while paused: got %q, want unchanged", got)
	}
	pause("pause", true)
	pause("resume", false)
	code, rid = c.tryBuy(campaign, "bob")
	if code != http.StatusAccepted || c.waitFinal("bob", rid, 10*time.Second).Status != "success" {
		t.Fatalf("buy after resume: got %d", code)
	}
	if st := c.settle(campaign, 10*time.Second); st.Sold != 2 {
		t.Fatalf("sold %d, want 2", st.Sold)
	}
}
