package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

var (
	_ DB    = (*sqlstore.DB)(nil)
	_ Stock = (*store.Store)(nil)
)

const testSecret = "whsec_test"

// testBundle is one test's service on a real ledger and a real Redis, with
// the Redis side wrapped to count releases and inject failures.
type testBundle struct {
	svc      *Service
	db       *sqlstore.DB
	st       *store.Store
	stock    *faultyStock
	campaign model.Campaign
	late     prometheus.Counter // the service's LatePayments
}

// env is a pair of stores the service runs on: MariaDB and Redis in
// production, SQLite and miniredis in the embedded default.
type env struct {
	name string
	open func(t *testing.T) (*sqlstore.DB, *store.Store)
}

func envs() []env {
	return []env{
		{name: "mysql+redis", open: func(t *testing.T) (*sqlstore.DB, *store.Store) {
			return mustOpen(t, sqlstore.DriverMySQL, testenv.MySQLDSN(t)), store.New(testenv.Redis(t))
		}},
		{name: "sqlite+miniredis", open: func(t *testing.T) (*sqlstore.DB, *store.Store) {
			m := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { _ = c.Close() })
			return mustOpen(t, sqlstore.DriverSQLite, ":memory:"), store.New(c)
		}},
	}
}

// forEachEnv runs fn as one subtest per env, each with a fresh bundle.
func forEachEnv(t *testing.T, fn func(t *testing.T, b *testBundle)) {
	t.Helper()
	for _, e := range envs() {
		t.Run(e.name, func(t *testing.T) {
			db, st := e.open(t)
			fn(t, newBundle(t, db, st))
		})
	}
}

func mustOpen(t *testing.T, driver, dsn string) *sqlstore.DB {
	t.Helper()
	db, err := sqlstore.Open(t.Context(), driver, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", driver, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// newBundle creates an open campaign of 10 units, 3 per shopper, at 500
// a unit, stored and loaded.
func newBundle(t *testing.T, db *sqlstore.DB, st *store.Store) *testBundle {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Millisecond)
	c, err := db.CreateCampaign(t.Context(), model.Campaign{ID: testenv.Name(t, "lc"), Name: "lifecycle", Stock: 10,
		PerUserLimit: 3, Price: 500, PaymentWindow: time.Minute, StartAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)})
	if err != nil {
		t.Fatalf("create campaign: %v", err)
	}
	if c, err = reconcile.Load(t.Context(), db, st, c.ID); err != nil {
		t.Fatalf("load: %v", err)
	}
	stock := &faultyStock{Stock: st, released: map[string]int{}}
	late := prometheus.NewCounter(prometheus.CounterOpts{Name: "late"})
	svc := New(db, stock, Options{Provider: ProviderFake, WebhookSecret: testSecret, LatePayments: late},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	return &testBundle{svc: svc, db: db, st: st, stock: stock, campaign: c, late: late}
}

// sell makes an order as the worker does: units deducted in Redis, the
// order stored with its amount and expiry.
func (b *testBundle) sell(t *testing.T, user string, units int64, expiresAt time.Time) model.Order {
	t.Helper()
	rid := model.FormatRequestID(b.campaign.ID, randomHex(16))
	r, err := b.st.Deduct(t.Context(), b.campaign.ID, []model.Deduction{{RequestID: rid, UserID: user, Quantity: units, OrderID: testenv.Name(t, "o")}})
	if err != nil || r.Results[0].Status != model.StatusSuccess {
		t.Fatalf("deduct %d for %s: %+v, %v", units, user, r, err)
	}
	o := model.Order{ID: r.Results[0].OrderID, RequestID: rid, CampaignID: b.campaign.ID, UserID: user, Quantity: units,
		Amount: units * b.campaign.Price, Status: model.OrderPendingPayment, ExpiresAt: expiresAt}
	if err := b.db.InsertOrders(t.Context(), []model.Order{o}, model.Epochs{b.campaign.ID: r.Epoch}); err != nil {
		t.Fatalf("insert order: %v", err)
	}
	return b.order(t, o.ID)
}

func (b *testBundle) order(t *testing.T, id string) model.Order {
	t.Helper()
	o, err := b.db.Order(t.Context(), id)
	if err != nil {
		t.Fatalf("order %s: %v", id, err)
	}
	return o
}

// redis is the campaign's Redis state a release changes.
type redisState struct {
	remaining int64
	soldOut   bool
	units     map[string]int64
}

func (b *testBundle) redis(t *testing.T, users ...string) redisState {
	t.Helper()
	st, err := b.st.Stats(t.Context(), b.campaign.ID)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	out := redisState{remaining: st.Remaining, soldOut: st.SoldOut, units: map[string]int64{}}
	snap, err := b.st.Snapshot(t.Context(), b.campaign.ID)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for _, u := range users {
		out.units[u] = snap.Units[u]
	}
	return out
}

func (b *testBundle) payments(t *testing.T) []model.Payment {
	t.Helper()
	ps, _, err := b.db.Payments(t.Context(), "", "", 1000)
	if err != nil {
		t.Fatalf("payments: %v", err)
	}
	return ps
}

// webhook signs body as the provider would at now.
func webhook(orderID, paymentID string, status model.PaymentStatus, amount int64) []byte {
	return fmt.Appendf(nil, `{"payment_id":%q,"order_id":%q,"status":%q,"amount":%d}`, paymentID, orderID, status, amount)
}

// faultyStock counts the releases that gave units back, per order, and
// fails the next Release calls on request: failBefore before the script
// runs (a crash after the MySQL transition), failAfter after it (a crash
// before MarkReturned).
type faultyStock struct {
	Stock
	mu         sync.Mutex
	failBefore int
	failAfter  int
	released   map[string]int
	events     int
}

var errCrash = errors.New("injected crash")

func (f *faultyStock) Release(ctx context.Context, campaignID, orderID, userID string, units int64) (bool, error) {
	f.mu.Lock()
	if f.failBefore > 0 {
		f.failBefore--
		f.mu.Unlock()
		return false, errCrash
	}
	f.mu.Unlock()
	ok, err := f.Stock.Release(ctx, campaignID, orderID, userID, units)
	f.mu.Lock()
	defer f.mu.Unlock()
	if ok {
		f.released[orderID]++
	}
	if err == nil && f.failAfter > 0 {
		f.failAfter--
		return false, errCrash
	}
	return ok, err
}

func (f *faultyStock) StockReturned(ctx context.Context, campaignID string) error {
	f.mu.Lock()
	f.events++
	f.mu.Unlock()
	return f.Stock.StockReturned(ctx, campaignID)
}

func (f *faultyStock) releases(orderID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.released[orderID]
}

func (f *faultyStock) fail(before, after int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failBefore, f.failAfter = before, after
}
