package worker

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// decideAll runs w's Decide and, unless it failed, the Finish it returns.
func decideAll(t *testing.T, w *Worker, msgs []queue.Message) error {
	t.Helper()
	finish, err := w.Decide(t.Context(), msgs)
	if err != nil {
		return err
	}
	return finish(t.Context())
}

// TestDegradedWorker (issue 28): a worker whose Redis does not answer
// decides its batches in MySQL (the campaign taken over); a worker on a
// Redis that answers again finds its old state refused by MySQL, restores
// it (the load hands the campaign back, carrying MySQL's orders and
// refusals) and decides the rest there. Exactly the stock is sold, nobody
// passes the limit, and a batch decided in MySQL delivered again reads
// the same results.
func TestDegradedWorker(t *testing.T) {
	const stock, limit = 5, 1
	f := newFixture(t, stock, limit)
	msgs := f.admit(t, 16, 8) // 8 users, two requests each: demand 16 for 5

	// A Redis that refuses every connection, under the guard every
	// process installs: its calls fail model.ErrUnavailable.
	guard := &store.Guard{Timeout: 200 * time.Millisecond}
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	down.AddHook(guard)
	t.Cleanup(func() { _ = down.Close() })
	restorer := reconcile.NewRestorer(discard(), f.db, f.st, metrics.New(), reconcile.RestorerOptions{Interval: time.Millisecond})
	dm := metrics.New()
	degraded := New(discard(), store.New(down), f.db, dm, Options{Decider: f.db, RedisDown: guard.Down, Restorer: restorer})
	gauge := func() float64 { return testutil.ToFloat64(dm.Degraded.WithLabelValues("worker")) }

	if err := decideAll(t, degraded, msgs[:10]); err != nil {
		t.Fatalf("degraded batch: %v", err)
	}
	c, err := f.db.Campaign(t.Context(), f.campaign.ID)
	if err != nil || !c.DecidedInMySQL || c.Epoch <= f.campaign.Epoch {
		t.Fatalf("campaign after the degraded batch: %+v, %v; want decided in MySQL at a later epoch than %d", c, err, f.campaign.Epoch)
	}
	inMySQL, err := f.db.Decided(t.Context(), ids(msgs[:10]))
	if err != nil || len(inMySQL) != 10 {
		t.Fatalf("Decided: got %d results, %v; want all 10", len(inMySQL), err)
	}

	degraded.RedisAnswers([]string{f.campaign.ID})
	if g := gauge(); g != 1 {
		t.Fatalf("campaign still decided in MySQL: got gauge %v, want 1", g)
	}

	// Redis answers again: its state is the old epoch's. The first batch
	// is held while the restore hands the campaign back; its delivery
	// again is decided in Redis.
	back := New(discard(), f.st, f.db, metrics.New(), Options{Decider: f.db, Restorer: restorer})
	if err := decideAll(t, back, msgs[10:]); !errors.Is(err, queue.ErrHeld) || !errors.Is(err, model.ErrLedgerMoved) {
		t.Fatalf("first batch on the old Redis: got %v, want held, the ledger moved", err)
	}
	if err := decideAll(t, back, msgs[10:]); err != nil {
		t.Fatalf("batch after the hand-back: %v", err)
	}
	if c, err := f.db.Campaign(t.Context(), f.campaign.ID); err != nil || c.DecidedInMySQL {
		t.Fatalf("campaign after Redis decided again: %+v, %v; want decided in Redis", c, err)
	}
	// The worker that decided in MySQL gets no batch of the campaign:
	// told MySQL decides it no longer, it stops counting it.
	degraded.RedisAnswers(nil)
	if g := gauge(); g != 0 {
		t.Errorf("campaign handed back: got gauge %v, want 0", g)
	}
	// The batch MySQL decided, delivered again to the worker on Redis.
	if err := decideAll(t, back, msgs[:10]); err != nil {
		t.Fatalf("redelivered degraded batch: %v", err)
	}
	for _, m := range msgs[:10] {
		got, err := f.st.Result(t.Context(), m.ID)
		if err != nil {
			t.Fatalf("result of %s: %v", m.ID, err)
		}
		if want := inMySQL[m.ID]; got.Status != want.Status || got.OrderID != want.OrderID {
			t.Errorf("request %s: Redis reads %s (%q), MySQL decided %s (%q)", m.ID, got.Status, got.OrderID, want.Status, want.OrderID)
		}
	}
	orders, err := f.db.CampaignOrders(t.Context(), f.campaign.ID)
	if err != nil {
		t.Fatal(err)
	}
	perUser := map[string]int64{}
	for _, o := range orders {
		perUser[o.UserID] += o.Quantity
	}
	if len(orders) != stock {
		t.Errorf("orders: got %d, want %d (demand outlasted the stock)", len(orders), stock)
	}
	for u, n := range perUser {
		if n > limit {
			t.Errorf("%s holds %d units, limit %d", u, n, limit)
		}
	}
	if st, err := f.st.Stats(t.Context(), f.campaign.ID); err != nil || st.Sold != stock || st.Remaining != 0 {
		t.Errorf("Redis stats: %+v, %v; want %d sold, none left", st, err, stock)
	}
}

func ids(msgs []queue.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}
