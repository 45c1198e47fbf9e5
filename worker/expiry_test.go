package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/lifecycle"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/memqueue"
)

var (
	_ Lifecycle            = (*lifecycle.Service)(nil)
	_ Orders               = (*sqlstore.DB)(nil)
	_ queue.DelayPublisher = (*delayRecorder)(nil)
)

// delayRecorder is a DelayPublisher that keeps what it is given instead of
// delivering it (a lost message, unless the test delivers it), or fails.
type delayRecorder struct {
	mu    sync.Mutex
	calls []delayedCall
	fail  error
}

type delayedCall struct {
	topic string
	delay time.Duration
	msgs  []queue.Message
}

func (r *delayRecorder) Publish(ctx context.Context, topic string, msgs ...queue.Message) error {
	return r.PublishDelayed(ctx, topic, 0, msgs...)
}

func (r *delayRecorder) PublishDelayed(_ context.Context, topic string, delay time.Duration, msgs ...queue.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.calls = append(r.calls, delayedCall{topic: topic, delay: delay, msgs: msgs})
	return nil
}

func (r *delayRecorder) recorded() []delayedCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delayedCall(nil), r.calls...)
}

// countingStock counts, per order, the releases that gave units back.
type countingStock struct {
	lifecycle.Stock
	mu       sync.Mutex
	released map[string]int
}

func (c *countingStock) Release(ctx context.Context, campaignID, orderID, userID string, units int64) (bool, error) {
	ok, err := c.Stock.Release(ctx, campaignID, orderID, userID, units)
	if ok {
		c.mu.Lock()
		c.released[orderID]++
		c.mu.Unlock()
	}
	return ok, err
}

func (c *countingStock) releases(orderID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.released[orderID]
}

// lifecycleBundle is a priced campaign with a one-second payment window on
// the test Redis and MariaDB, its worker scheduling expiry on a recorder,
// and the order lifecycle on the same stores.
type lifecycleBundle struct {
	*fixture
	worker    *Worker
	scheduled *delayRecorder
	stock     *countingStock
	svc       *lifecycle.Service
}

func newLifecycleBundle(t *testing.T, stock int64) *lifecycleBundle {
	t.Helper()
	st := store.New(testenv.Redis(t))
	db, err := sqlstore.Open(t.Context(), sqlstore.DriverMySQL, testenv.MySQLDSN(t))
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	c, err := db.CreateCampaign(t.Context(), model.Campaign{ID: testenv.Name(t, "we-"), Name: "w", Stock: stock, PerUserLimit: 1,
		Price: 250, PaymentWindow: time.Second, StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("create campaign: %v", err)
	}
	if c, err = reconcile.Load(t.Context(), db, st, c.ID); err != nil {
		t.Fatalf("load: %v", err)
	}
	b := &lifecycleBundle{fixture: &fixture{st: st, db: db, campaign: c}, scheduled: &delayRecorder{},
		stock: &countingStock{Stock: st, released: map[string]int{}}}
	b.worker = New(discard(), st, db, metrics.New(), Options{Expiry: b.scheduled, ExpiryTopic: "expiry"})
	b.svc = lifecycle.New(db, b.stock, lifecycle.Options{Provider: lifecycle.ProviderFake,
		WebhookSecret: "whsec_worker_test", Grace: time.Millisecond}, discard())
	return b
}

// sell decides n purchases of one unit from n users and returns their
// orders as stored.
func (b *lifecycleBundle) sell(t *testing.T, n int) []model.Order {
	t.Helper()
	msgs := b.admit(t, n, n)
	if err := queue.Serial(b.worker.Decide)(t.Context(), msgs); err != nil {
		t.Fatalf("decide: %v", err)
	}
	orders, err := b.db.CampaignOrders(t.Context(), b.campaign.ID)
	if err != nil || len(orders) != n {
		t.Fatalf("orders: got %d, %v; want %d", len(orders), err, n)
	}
	return orders
}

// TestOrdersCarryTerms: a stored order costs the campaign's price times
// its quantity and expires a payment window after it was made, and its
// expiry is scheduled once, delayed by the window, on the expiry topic.
func TestOrdersCarryTerms(t *testing.T) {
	b := newLifecycleBundle(t, 10)
	before := time.Now()
	orders := b.sell(t, 4)
	after := time.Now()
	for _, o := range orders {
		if o.Amount != 250 || o.Status != model.OrderPendingPayment {
			t.Errorf("order %s: got amount %d, %s; want 250, pending_payment", o.ID, o.Amount, o.Status)
		}
		// MySQL keeps microseconds.
		if lo, hi := before.Add(time.Second).Truncate(time.Millisecond), after.Add(time.Second); o.ExpiresAt.Before(lo) || o.ExpiresAt.After(hi) {
			t.Errorf("order %s: expires at %v, want between %v and %v", o.ID, o.ExpiresAt, lo, hi)
		}
	}
	calls := b.scheduled.recorded()
	if len(calls) != 1 || calls[0].topic != "expiry" || len(calls[0].msgs) != 4 {
		t.Fatalf("scheduled: got %+v, want one call of 4 messages on topic expiry", calls)
	}
	if d := calls[0].delay; d <= 0 || d > time.Second {
		t.Errorf("delay: got %v, want the window (1s) less the time since the order was made", d)
	}
	want := map[string]bool{}
	for _, o := range orders {
		want[o.ID] = true
	}
	for _, m := range calls[0].msgs {
		if !want[m.ID] || m.Key != b.campaign.ID {
			t.Errorf("message %q keyed %q: want an order id of the batch, keyed by its campaign", m.ID, m.Key)
		}
		delete(want, m.ID)
	}
}

// TestScheduleFailureIsNotFatal: a failed schedule leaves the batch
// acknowledged and its orders stored; the sweeper covers their expiry.
func TestScheduleFailureIsNotFatal(t *testing.T) {
	b := newLifecycleBundle(t, 10)
	b.scheduled.fail = errors.New("broker refuses delayed messages")
	b.sell(t, 3)
}

// TestExpiryMessageDropped (issue test 2): the expiry messages are lost, and
// the sweeper expires every order once its window and the grace have
// passed, giving each unit back once.
func TestExpiryMessageDropped(t *testing.T) {
	b := newLifecycleBundle(t, 10)
	orders := b.sell(t, 10)
	exp := NewExpiry(discard(), b.svc, ExpiryOptions{Topic: "expiry", Publisher: b.scheduled})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	sweeper := Sweeper{Log: discard(), Tasks: []Task{exp.SweepTask(20 * time.Millisecond)}}
	go func() { done <- sweeper.Run(ctx) }()
	b.waitExpired(t, orders, 20*time.Second)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("sweep: %v", err)
	}
	b.checkReleasedOnce(t, orders)
}

// TestExpiryMessageAndSweeperAtOnce (issue test 2): the expiry messages,
// delivered twice through a real consumer, and the sweeper expire the same
// orders at the same time; each order's units come back once.
func TestExpiryMessageAndSweeperAtOnce(t *testing.T) {
	b := newLifecycleBundle(t, 40)
	orders := b.sell(t, 40)
	// Every order is due: the clock runs an hour ahead.
	later := func() time.Time { return time.Now().Add(time.Hour) }
	exp := NewExpiry(discard(), b.svc, ExpiryOptions{Topic: "expiry", Publisher: b.scheduled, Now: later})

	q := memqueue.New(memqueue.Options{Partitions: 2, BatchSize: 8})
	t.Cleanup(func() { _ = q.Close() })
	topic := testenv.Topic(t)
	for range 2 {
		for _, c := range b.scheduled.recorded() {
			if err := q.Publish(t.Context(), topic, c.msgs...); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	sweeper := Sweeper{Log: discard(), Tasks: []Task{exp.SweepTask(time.Millisecond)}}
	wg.Go(func() { errs <- sweeper.Run(ctx) })
	for i := range 2 {
		consumer := NewExpiry(discard(), b.svc, ExpiryOptions{Topic: topic, Publisher: b.scheduled, Now: later})
		wg.Go(func() { errs <- consumer.Run(ctx, q.Consumer(fmt.Sprintf("c%d", i))) })
	}
	b.waitExpired(t, orders, 20*time.Second)
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("expiry: %v", err)
		}
	}
	b.checkReleasedOnce(t, orders)
	if calls := b.scheduled.recorded(); len(calls) != 1 {
		t.Errorf("got %d schedules, want the worker's one: no due order is delayed again", len(calls))
	}
}

// TestEarlyExpiryIsDelayedAgain: a message that comes before its order is
// due is published again for the rest of the window; one whose order was
// paid, or is unknown, is done with.
func TestEarlyExpiryIsDelayedAgain(t *testing.T) {
	b := newLifecycleBundle(t, 10)
	orders := b.sell(t, 2)
	pending, paid := orders[0], orders[1]
	if _, err := b.svc.Pay(t.Context(), paid.UserID, paid.ID); err != nil {
		t.Fatalf("pay: %v", err)
	}
	redelay := &delayRecorder{}
	now := pending.ExpiresAt.Add(-300 * time.Millisecond)
	exp := NewExpiry(discard(), b.svc, ExpiryOptions{Topic: "expiry", Publisher: redelay, Now: func() time.Time { return now }})
	msgs := []queue.Message{expiryMessage(pending), expiryMessage(paid), {ID: "no-such-order", Key: b.campaign.ID, Attempt: 1}}
	if err := exp.Handle(t.Context(), msgs); err != nil {
		t.Fatalf("handle: %v", err)
	}
	calls := redelay.recorded()
	if len(calls) != 1 || len(calls[0].msgs) != 1 || calls[0].msgs[0].ID != pending.ID || calls[0].delay != 300*time.Millisecond {
		t.Fatalf("delayed again: got %+v, want the pending order's message alone, due in 300ms", calls)
	}
	if o := b.order(t, pending.ID); o.Status != model.OrderPendingPayment {
		t.Errorf("early: got %s, want pending_payment", o.Status)
	}
	now = pending.ExpiresAt
	if err := exp.Handle(t.Context(), calls[0].msgs); err != nil {
		t.Fatalf("handle when due: %v", err)
	}
	if o := b.order(t, pending.ID); o.Status != model.OrderExpired || !o.Returned {
		t.Errorf("due: got %s (returned %v), want expired and returned", o.Status, o.Returned)
	}
	if o := b.order(t, paid.ID); o.Status != model.OrderPaid {
		t.Errorf("paid order: got %s, want paid", o.Status)
	}
	if len(redelay.recorded()) != 1 {
		t.Errorf("got %d re-delays, want 1", len(redelay.recorded()))
	}
}

// failingLifecycle fails every Expire.
type failingLifecycle struct{ Lifecycle }

func (failingLifecycle) Expire(context.Context, string, time.Time) (model.Order, error) {
	return model.Order{}, errors.New("redis unreachable")
}

// TestExpiryFailureRedelivers: a failing expiry asks for redelivery until
// the message's attempts run out; then it is dropped for the sweeper.
func TestExpiryFailureRedelivers(t *testing.T) {
	exp := NewExpiry(discard(), failingLifecycle{}, ExpiryOptions{Topic: "expiry", MaxAttempts: 3})
	for attempt, wantErr := range map[int]bool{1: true, 2: true, 3: false} {
		err := exp.Handle(t.Context(), []queue.Message{{ID: "o1", Key: "c", Attempt: attempt}})
		if (err != nil) != wantErr {
			t.Errorf("attempt %d: got %v, want an error %v", attempt, err, wantErr)
		}
	}
}

func (b *lifecycleBundle) order(t *testing.T, id string) model.Order {
	t.Helper()
	o, err := b.db.Order(t.Context(), id)
	if err != nil {
		t.Fatalf("order %s: %v", id, err)
	}
	return o
}

// waitExpired waits until every order is expired and returned.
func (b *lifecycleBundle) waitExpired(t *testing.T, orders []model.Order, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, "every order expired and returned", func() (bool, string) {
		for _, o := range orders {
			if got := b.order(t, o.ID); got.Status != model.OrderExpired || !got.Returned {
				return false, fmt.Sprintf("order %s: %s (returned %v)", o.ID, got.Status, got.Returned)
			}
		}
		return true, ""
	})
}

// checkReleasedOnce: every order's units came back exactly once, and Redis
// holds the whole stock again with nobody's units left.
func (b *lifecycleBundle) checkReleasedOnce(t *testing.T, orders []model.Order) {
	t.Helper()
	for _, o := range orders {
		if n := b.stock.releases(o.ID); n != 1 {
			t.Errorf("order %s: released %d times, want 1", o.ID, n)
		}
	}
	snap, err := b.st.Snapshot(t.Context(), b.campaign.ID)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if snap.Remaining != b.campaign.Stock || snap.Sold != 0 || snap.SoldOut {
		t.Errorf("redis: got remaining %d, sold %d, sold out %v; want %d, 0, false", snap.Remaining, snap.Sold, snap.SoldOut, b.campaign.Stock)
	}
	for u, n := range snap.Units {
		if n != 0 {
			t.Errorf("user %s: %d units left, want 0", u, n)
		}
	}
}
