package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue/memqueue"
)

// heldOrders holds every insert until release is closed, and closes
// entered at the first.
type heldOrders struct {
	Orders
	entered, release chan struct{}
	once             atomic.Bool
}

func (o *heldOrders) InsertOrders(ctx context.Context, orders []model.Order, epochs model.Epochs) error {
	if o.once.CompareAndSwap(false, true) {
		close(o.entered)
	}
	select {
	case <-o.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return o.Orders.InsertOrders(ctx, orders, epochs)
}

// TestSuccessShownOnceDurable: while a batch's orders are not in MySQL, its
// successes read as queued, without an order id (what a poll answers); once
// the worker stored them and raised the durable mark they read as
// successes, each with its order in MySQL.
func TestSuccessShownOnceDurable(t *testing.T) {
	f := newFixture(t, 5, 1)
	msgs := f.admit(t, 3, 3)
	orders := &heldOrders{Orders: f.db, entered: make(chan struct{}), release: make(chan struct{})}
	w := New(discard(), f.st, orders, metrics.New(), Options{PersistAttempts: 1})
	stop := runOnMemqueue(t, w, msgs, memqueue.Options{BatchSize: 16, RedeliveryDelay: 5 * time.Millisecond})
	defer stop()
	select {
	case <-orders.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("no insert within 20s")
	}
	for _, m := range msgs {
		r, err := f.st.Result(t.Context(), m.ID)
		if err != nil || r.Status != model.StatusQueued || r.OrderID != "" {
			t.Errorf("%s while its order is not stored: got %+v, %v; want queued without an order id", m.ID, r, err)
		}
		if _, err := f.db.Order(t.Context(), model.OrderIDOf(m.ID)); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("order of %s before the insert: got %v, want %v", m.ID, err, model.ErrNotFound)
		}
	}
	close(orders.release)
	waitDecided(t, f, msgs)
	for _, m := range msgs {
		r, err := f.st.Result(t.Context(), m.ID)
		if err != nil || r.Status != model.StatusSuccess || r.OrderID != model.OrderIDOf(m.ID) {
			t.Errorf("%s once stored: got %+v, %v; want success %s", m.ID, r, err, model.OrderIDOf(m.ID))
		}
		if o, err := f.db.Order(t.Context(), r.OrderID); err != nil || o.RequestID != m.ID {
			t.Errorf("order of %s: got %+v, %v", m.ID, o, err)
		}
	}
}

// unmarkedStock fails its first fails MarkDurable calls.
type unmarkedStock struct {
	Stock
	fails atomic.Int32
}

func (s *unmarkedStock) MarkDurable(ctx context.Context, tag string, made int64, epoch model.Epoch) error {
	if s.fails.Add(-1) >= 0 {
		return errors.New("redis down")
	}
	return s.Stock.MarkDurable(ctx, tag, made, epoch)
}

// TestMarkDurableHolds: a batch whose durable mark was not raised is not
// acknowledged; its redelivery replays the same decisions and raises it.
// One batch: no later batch's mark uncovers it.
func TestMarkDurableHolds(t *testing.T) {
	f := newFixture(t, 20, 1)
	msgs := f.admit(t, 30, 30)
	stock := &unmarkedStock{Stock: f.st}
	stock.fails.Store(2)
	w := New(discard(), stock, f.db, metrics.New(), Options{PersistAttempts: 1})
	stop := runOnMemqueue(t, w, msgs, memqueue.Options{BatchSize: 64, RedeliveryDelay: 5 * time.Millisecond})
	waitDecided(t, f, msgs)
	stop()
	if n := stock.fails.Load(); n >= 0 {
		t.Errorf("%d injected failures did not happen", n+1)
	}
	checkSoldOut(t, f.snapshot(t, msgs), 20)
}
