package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/lifecycle"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// TestExpiryKilledBeforeRelease is issue #13's crash test 4 for the expiry
// path: a `flashsale worker` child process, its Redis behind a stallProxy,
// expires unpaid orders in MySQL, then hangs on the frozen proxy before
// the Redis release and is SIGKILLed there. A fresh worker completes the
// releases; every expired order's unit comes back exactly once, is resold
// to the shoppers waiting, and Redis = MySQL.
func TestExpiryKilledBeforeRelease(t *testing.T) {
	testenv.SkipShort(t, "a fault test: kills the process before a release")
	cfg := realConfig(t, "redisstream")
	cfg.Queue.LeaseTTL = time.Second
	// The sweeper picks the due orders up at once: with the zombie's Redis
	// frozen, its delayed expiry messages never reach it, so the sweeper is
	// the one that moves the orders in MySQL and then blocks on the release.
	cfg.Payment.Grace = 100 * time.Millisecond
	cfg.Payment.SweepInterval = 100 * time.Millisecond
	bin := buildBinary(t)

	c := startFrontEnd(t, cfg)

	db, err := sqlstore.Open(context.Background(), cfg.Database.Driver, cfg.Database.DSN)
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
	t.Cleanup(func() { _ = rdb.Close() })

	proxy := newStallProxy(t, cfg.Redis.Addr)
	stalled := cfg
	stalled.Redis.Addr = proxy.addr()
	zombie := startWorkerProcess(t, bin, processEnv(stalled))
	t.Cleanup(zombie.kill)

	campaign := testenv.Name(t, "killexp-")
	const stock, buyers, waiting int64 = 5, 4, 3
	c.openCampaignOf(campaignBody{ID: campaign, Name: "kill expiry", Stock: stock, PerUserLimit: 1, Price: 500,
		PaymentWindow: "2s", StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)})

	// The first buyers take every unit: all but one never pay.
	abandoned := buyAndAbandon(t, c, campaign, buyers)
	mustBuyAndPay(t, c, campaign, "p0")
	// Freeze the zombie's Redis before the orders come due (a 2 s window):
	// its sweeper can still move them in MySQL, but not give units back.
	testenv.Eventually(t, 10*time.Second, "the buyers' orders in MySQL", func() (bool, string) {
		orders := mustOrders(t, db, campaign)
		return int64(len(orders)) == buyers+1, describeOrders(orders)
	})
	proxy.stall()

	// Stuck between the transition and the release: an order expired in
	// MySQL, its release not applied, and the zombie's Redis traffic held.
	killStuckAndTakeOver(t, bin, cfg, c, db, rdb, campaign, stock, waiting, abandoned, zombie, proxy)
}

// buyAndAbandon has n buyers buy one unit each and never pay; it returns
// their order ids.
func buyAndAbandon(t *testing.T, c *client, campaign string, n int64) map[string]bool {
	t.Helper()
	abandoned := map[string]bool{}
	for i := range int(n) {
		user := fmt.Sprintf("b%d", i)
		tok := c.token(user)
		var p purchaseBody
		if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", tok, `{"quantity":1}`, nil, &p); code != http.StatusAccepted {
			t.Fatalf("%s: purchase got %d %q, want 202", user, code, p.Code)
		}
		r, ok := c.awaitResult(tok, p.RequestID)
		if !ok || r.Status != "success" {
			t.Fatalf("%s: result %+v, want success", user, r)
		}
		abandoned[r.OrderID] = true
	}
	return abandoned
}

// mustBuyAndPay has user buy one unit and pay for it.
func mustBuyAndPay(t *testing.T, c *client, campaign, user string) {
	t.Helper()
	paid, done := make(chan string, 1), make(chan struct{})
	defer time.AfterFunc(20*time.Second, func() { close(done) }).Stop()
	buyAndPay(t, c, campaign, user, done, paid)
	select {
	case <-paid:
	default:
		t.Fatalf("%s: could not buy and pay", user)
	}
}

// buyAndPay buys one unit, retrying while the sale is sold out, and pays
// for it; an order that expired before the payment is bought again. It
// sends the user on paid once the payment is answered.
func buyAndPay(t *testing.T, c *client, campaign, user string, done <-chan struct{}, paid chan<- string) {
	tok := c.token(user)
	pause := func() bool {
		select {
		case <-done:
			return false
		case <-time.After(200 * time.Millisecond):
			return true
		}
	}
	for {
		var p purchaseBody
		switch code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", tok, `{"quantity":1}`, nil, &p); code {
		case http.StatusAccepted:
		case http.StatusGone, http.StatusTooManyRequests:
			if !pause() {
				return
			}
			continue
		default:
			t.Errorf("%s: purchase got %d %q, want 202, 410 or 429", user, code, p.Code)
			return
		}
		r, ok := c.awaitResult(tok, p.RequestID)
		if !ok {
			return
		}
		if r.Status != "success" {
			if !pause() {
				return
			}
			continue
		}
		switch code, errCode := c.orderAction(tok, r.OrderID, "pay"); {
		case code == http.StatusOK:
			paid <- user
			return
		case code == http.StatusConflict && errCode == "order_not_payable":
			// Expired first: buy again.
		default:
			t.Errorf("%s: pay got %d %q, want 200", user, code, errCode)
			return
		}
	}
}

func mustOrders(t *testing.T, db *sqlstore.DB, campaign string) []model.Order {
	t.Helper()
	orders, err := db.CampaignOrders(context.Background(), campaign)
	if err != nil {
		t.Fatalf("orders: %v", err)
	}
	return orders
}

func findOrder(orders []model.Order, id string) model.Order {
	for _, o := range orders {
		if o.ID == id {
			return o
		}
	}
	return model.Order{}
}

// TestExpiryConsumerKilledBeforeRelease is issue #13's crash test 4 for
// the expiry consumer: a `flashsale worker` child process with its Redis
// and its MySQL each behind a stallProxy, the sweeper out of the way (an
// hour's grace and interval). The consumer takes an expiry message and
// reads the order from a frozen MySQL; Redis freezes, MySQL thaws: the
// consumer expires the order in MySQL and hangs on the Redis release, and
// is SIGKILLed there, its message unacknowledged. A fresh worker gets the
// message again (redelivery after the lease) and completes the release:
// the units come back exactly once, are resold, and Redis = MySQL.
func TestExpiryConsumerKilledBeforeRelease(t *testing.T) {
	testenv.SkipShort(t, "a fault test: kills the expiry consumer before a release")
	cfg := realConfig(t, "redisstream")
	cfg.Queue.LeaseTTL = time.Second
	cfg.Payment.Grace = time.Hour
	cfg.Payment.SweepInterval = time.Hour
	// The not-enqueued sweep reads its campaigns from MySQL every tenth of
	// this: once at the start, then not within the test.
	cfg.Worker.MaxQueueDelay = 10 * time.Minute
	bin := buildBinary(t)

	c := startFrontEnd(t, cfg)

	db, err := sqlstore.Open(context.Background(), cfg.Database.Driver, cfg.Database.DSN)
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
	t.Cleanup(func() { _ = rdb.Close() })

	dsn, err := mysql.ParseDSN(cfg.Database.DSN)
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	mproxy := newStallProxy(t, dsn.Addr)
	rproxy := newStallProxy(t, cfg.Redis.Addr)
	dsn.Addr = mproxy.addr()
	stalled := cfg
	stalled.Database.DSN = dsn.FormatDSN()
	stalled.Redis.Addr = rproxy.addr()
	zombie := startWorkerProcess(t, bin, processEnv(stalled))
	t.Cleanup(zombie.kill)

	campaign := testenv.Name(t, "killcons-")
	const stock, buyers, waiting int64 = 3, 2, 2
	c.openCampaignOf(campaignBody{ID: campaign, Name: "kill consumer", Stock: stock, PerUserLimit: 1, Price: 500,
		PaymentWindow: "2s", StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)})
	// The buyers take every unit: all but the last never pay. The payer's
	// order comes due last, so the consumer meets an abandoned one first.
	abandoned := buyAndAbandon(t, c, campaign, buyers)
	mustBuyAndPay(t, c, campaign, "p0")
	var due time.Time // when the first order comes due
	testenv.Eventually(t, 10*time.Second, "the buyers' orders in MySQL", func() (bool, string) {
		orders := mustOrders(t, db, campaign)
		for _, o := range orders {
			if due.IsZero() || o.ExpiresAt.Before(due) {
				due = o.ExpiresAt
			}
		}
		return int64(len(orders)) == buyers+1, describeOrders(orders)
	})
	// With the sweeper idle, the only MySQL traffic left is the expiry
	// consumer reading a due order.
	mproxy.stall()
	testenv.Eventually(t, 20*time.Second, "the expiry consumer reading an order", func() (bool, string) {
		return mproxy.held() > 0, "nothing held"
	})
	if now := time.Now(); now.Before(due) {
		t.Fatalf("the worker read MySQL at %v, before any order was due (%v): not the expiry consumer", now, due)
	}
	rproxy.stall()
	mproxy.release()

	// Stuck between the transition and the release.
	killStuckAndTakeOver(t, bin, cfg, c, db, rdb, campaign, stock, waiting, abandoned, zombie, rproxy)
}

// TestWebhookKilledMidPayment is issue #13's crash test 4 for the payment
// path: a `flashsale gateway` child process, its MySQL behind a
// stallProxy, receives a provider's webhook and hangs mid-payment on the
// frozen database; it is SIGKILLed there. The provider retries the same
// webhook against a live gateway: the payment is recorded once, the order
// paid once, nothing given back, Redis = MySQL.
func TestWebhookKilledMidPayment(t *testing.T) {
	testenv.SkipShort(t, "a fault test: kills the process mid-payment")
	cfg := realConfig(t, "redisstream")
	bin := buildBinary(t)
	c := startSystem(t, cfg)
	db, err := sqlstore.Open(context.Background(), cfg.Database.Driver, cfg.Database.DSN)
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
	t.Cleanup(func() { _ = rdb.Close() })

	campaign := testenv.Name(t, "killpay-")
	const stock, price = 3, 700
	c.openCampaignOf(campaignBody{ID: campaign, Name: "kill payment", Stock: stock, PerUserLimit: 1, Price: price,
		PaymentWindow: "1m", StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)})
	o := c.buy("payer", campaign)

	dsn, err := mysql.ParseDSN(cfg.Database.DSN)
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	proxy := newStallProxy(t, dsn.Addr)
	dsn.Addr = proxy.addr()
	stalled := cfg
	stalled.Database.DSN = dsn.FormatDSN()
	zombie := startRole(t, bin, "gateway", processEnv(stalled))
	t.Cleanup(zombie.kill)

	body := webhookBody("pay-"+o.ID, o.ID, "succeeded", price)
	header := lifecycle.SignWebhook(testWebhookSecret, time.Now(), []byte(body))
	proxy.stall()
	answered := make(chan int, 1)
	go func() {
		req, err := http.NewRequest("POST", "http://"+zombie.addr+gateway.WebhookPath, strings.NewReader(body))
		if err != nil {
			answered <- 0
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(gateway.SignatureHeader, header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0 // killed mid-request
			return
		}
		_ = resp.Body.Close()
		answered <- resp.StatusCode
	}()
	// Stuck mid-payment: the webhook reached the database, which holds it.
	testenv.Eventually(t, 20*time.Second, "the webhook's MySQL traffic held", func() (bool, string) {
		select {
		case code := <-answered:
			t.Fatalf("the stalled gateway answered the webhook: %d", code)
		default:
		}
		return proxy.held() > 0, "nothing held"
	})
	zombie.kill()
	if code := <-answered; code != 0 {
		t.Fatalf("the killed gateway answered the webhook: %d", code)
	}
	// The zombie is dead; whatever it sent may still reach MySQL, as
	// through a network that thaws. The payment id makes it count once.
	proxy.release()

	// The provider retries, twice, against the live gateway.
	for i := range 2 {
		code, p := c.webhook(testWebhookSecret, time.Now(), body)
		if code != http.StatusOK || p.Status != string(model.PaymentSucceeded) {
			t.Fatalf("retry %d: got %d %+v, want 200 succeeded", i, code, p)
		}
	}

	payments, _, err := db.Payments(context.Background(), "", "", 1000)
	if err != nil {
		t.Fatalf("payments: %v", err)
	}
	var mine []model.Payment
	for _, p := range payments {
		if p.OrderID == o.ID {
			mine = append(mine, p)
		}
	}
	if len(mine) != 1 || mine[0].Status != model.PaymentSucceeded || mine[0].Amount != price {
		t.Errorf("payments of order %s: got %+v, want one succeeded of %d", o.ID, mine, price)
	}
	orders := mustOrders(t, db, campaign)
	if len(orders) != 1 || orders[0].Status != model.OrderPaid || orders[0].Returned {
		t.Errorf("got %s, want the one order paid and holding its unit", describeOrders(orders))
	}
	released, err := rdb.HLen(context.Background(), "fs:{"+campaign+"}:released").Result()
	if err != nil {
		t.Fatalf("released: %v", err)
	}
	if released != 0 {
		t.Errorf("got %d releases in Redis, want none", released)
	}
	if st := c.stats(campaign); st.Remaining != stock-1 || st.Sold != 1 {
		t.Errorf("redis: got remaining %d, sold %d; want %d, 1", st.Remaining, st.Sold, stock-1)
	}
	rep, err := reconcile.New(store.New(rdb), db).Check(context.Background(), campaign)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if !rep.Consistent() {
		t.Errorf("redis and mysql disagree: %+v", rep.Differences)
	}
	t.Logf("%d bytes held by the frozen proxy", proxy.held())
}

// killStuckAndTakeOver waits until an order is expired in MySQL while the
// zombie worker's release is held in redisProxy (nothing given back yet),
// SIGKILLs the zombie there, lets what it left in the proxy through (as a
// network that thaws would: whether it lands or not, a release is once per
// order id), and has a fresh worker take over (takeOverAndResell).
func killStuckAndTakeOver(t *testing.T, bin string, cfg config.Config, c *client, db *sqlstore.DB, rdb *redis.Client,
	campaign string, stock, waiting int64, abandoned map[string]bool, zombie *roleProcess, redisProxy *stallProxy) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "an order expired but not released", func() (bool, string) {
		orders := mustOrders(t, db, campaign)
		for _, o := range orders {
			if o.Status == model.OrderExpired && !o.Returned && redisProxy.held() > 0 {
				return true, ""
			}
		}
		return false, describeOrders(orders)
	})
	if st := c.stats(campaign); st.Remaining != 0 || !st.SoldOut {
		t.Fatalf("before the kill: remaining %d, sold out %v; want 0, true (nothing released yet)", st.Remaining, st.SoldOut)
	}
	atKill := describeOrders(mustOrders(t, db, campaign))
	zombie.kill()
	redisProxy.release()
	orders := takeOverAndResell(t, bin, cfg, c, db, rdb, campaign, stock, 1, waiting, abandoned)
	t.Logf("at the kill: %s; at the end: %s; %d bytes held by the frozen Redis", atKill, describeOrders(orders), redisProxy.held())
}

// takeOverAndResell starts a fresh worker process (direct Redis and MySQL)
// and waiting shoppers who buy and pay, with kept units paid for before.
// Then it checks, once every
// order is paid or ended and released, that each expired order (the
// abandoned ones among them) gave its units back exactly once, that the
// waiting shoppers bought them, and that Redis = MySQL. A unit given back
// twice shows in remaining: the units paid before the kill keep it below
// the stock, where release.lua stops adding.
func takeOverAndResell(t *testing.T, bin string, cfg config.Config, c *client, db *sqlstore.DB, rdb *redis.Client,
	campaign string, stock, kept, waiting int64, abandoned map[string]bool) []model.Order {
	t.Helper()
	// Shoppers wait for units while a fresh worker takes over.
	var wg sync.WaitGroup
	done := make(chan struct{})
	paid := make(chan string, waiting)
	for i := range int(waiting) {
		wg.Go(func() { buyAndPay(t, c, campaign, fmt.Sprintf("w%d", i), done, paid) })
	}
	startWorkerProcess(t, bin, processEnv(cfg))

	for range waiting {
		select {
		case <-paid:
		case <-time.After(60 * time.Second):
			close(done)
			wg.Wait()
			t.Fatalf("waiting shoppers not served after 60s: %s", describeOrders(mustOrders(t, db, campaign)))
		}
	}
	close(done)
	wg.Wait()

	// Settled: every order paid or ended and released.
	var orders []model.Order
	testenv.Eventually(t, 20*time.Second, "every order paid or released", func() (bool, string) {
		orders = mustOrders(t, db, campaign)
		for _, o := range orders {
			if o.Status == model.OrderPendingPayment || (o.Status.Final() && !o.Returned) {
				return false, describeOrders(orders)
			}
		}
		return c.stats(campaign).Queued == 0, describeOrders(orders)
	})

	released, err := rdb.HGetAll(context.Background(), "fs:{"+campaign+"}:released").Result()
	if err != nil {
		t.Fatalf("released: %v", err)
	}
	units, err := rdb.HGetAll(context.Background(), "fs:{"+campaign+"}:users").Result()
	if err != nil {
		t.Fatalf("users: %v", err)
	}
	var active, ended int64
	activeOf := map[string]int64{}
	for _, o := range orders {
		_, rel := released[o.ID]
		switch {
		case o.Status == model.OrderPaid:
			active += o.Quantity
			activeOf[o.UserID] += o.Quantity
			if rel {
				t.Errorf("paid order %s released", o.ID)
			}
		case o.Status == model.OrderExpired:
			ended++
			if !rel {
				t.Errorf("expired order %s not released", o.ID)
			}
		default:
			t.Errorf("order %s is %s, want paid or expired", o.ID, o.Status)
		}
	}
	for id := range abandoned {
		if o := findOrder(orders, id); o.Status != model.OrderExpired {
			t.Errorf("abandoned order %s is %s, want expired", id, o.Status)
		}
	}
	if int64(len(released)) != ended {
		t.Errorf("got %d releases in Redis, want one per expired order (%d)", len(released), ended)
	}
	if active != kept+waiting {
		t.Errorf("got %d paid units, want %d: the waiting shoppers bought the units given back", active, kept+waiting)
	}
	for user, n := range units {
		if _, ok := activeOf[user]; !ok && n != "0" {
			t.Errorf("user %s: got %s units in Redis, want 0 (no active order)", user, n)
		}
	}
	for user, want := range activeOf {
		got, _ := strconv.ParseInt(units[user], 10, 64)
		if got != want {
			t.Errorf("user %s: got %d units in Redis, want %d (active orders)", user, got, want)
		}
	}
	if st := c.stats(campaign); st.Remaining != stock-active || st.Sold != active {
		t.Errorf("redis: got remaining %d, sold %d; want %d, %d (stock - active units)", st.Remaining, st.Sold, stock-active, active)
	}
	rep, err := reconcile.New(store.New(rdb), db).Check(context.Background(), campaign)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if !rep.Consistent() {
		t.Errorf("redis and mysql disagree: %+v", rep.Differences)
	}
	return orders
}
