package worker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/memqueue"
)

// replicaSwitch deducts through a store that waits for a replica the test
// Redis does not have until the replica "arrives" (back), then through one
// that does not wait.
type replicaSwitch struct {
	Stock
	waiting *store.Store
	back    atomic.Bool
}

func (s *replicaSwitch) Deduct(ctx context.Context, campaignID string, batch []model.Deduction) (model.DeductReply, error) {
	if s.back.Load() {
		return s.Stock.Deduct(ctx, campaignID, batch)
	}
	return s.waiting.Deduct(ctx, campaignID, batch)
}

// TestReplicaShortfallHoldsBatch: a deduction that fewer than
// min_replicas_ack replicas acknowledged is neither published, stored in
// MySQL nor acknowledged, for as many deliveries as it takes, and never
// given up on; once the replica acknowledges, the batch is decided again
// with the same results (deduct.lua answers from its stored ones), stored
// and published once.
func TestReplicaShortfallHoldsBatch(t *testing.T) {
	f := newFixture(t, 10, 1)
	msgs := f.admit(t, 16, 12) // 12 users, 4 of them twice; stock 10
	stock := &replicaSwitch{Stock: f.st,
		waiting: store.New(testenv.Redis(t), store.WithReplicaAck(store.ReplicaAck{Replicas: 1, Timeout: 5 * time.Millisecond}))}
	m := metrics.New()
	w := New(discard(), stock, f.db, m, Options{MaxAttempts: 2})

	var mu sync.Mutex
	published := map[string]int{}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ready := make(chan struct{})
	go func() {
		_ = f.st.SubscribeResults(ctx, f.campaign.ID, sync.OnceFunc(func() { close(ready) }), func(r model.Result) {
			mu.Lock()
			defer mu.Unlock()
			published[r.RequestID]++
		})
	}()
	<-ready

	q := memqueue.New(memqueue.Options{Partitions: 1, BatchSize: 8, RedeliveryDelay: time.Millisecond})
	t.Cleanup(func() { _ = q.Close() })
	const topic = "replicas"
	if err := q.Publish(t.Context(), topic, msgs...); err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int32
	done := make(chan error, 1)
	go func() { done <- queue.ConsumePipelined(ctx, q.Consumer("w"), topic, attemptsSeen(&seen, w.Decide)) }()

	testenv.Eventually(t, 20*time.Second, "held deliveries beyond twice MaxAttempts", func() (bool, string) {
		n := testutil.ToFloat64(m.HeldBatches)
		return n > 4, fmt.Sprintf("%v held", n)
	})
	if got := seen.Load(); got != 1 {
		t.Errorf("held deliveries reached Attempt %d, want 1 (a hold is not a failed attempt)", got)
	}
	mu.Lock()
	early := len(published)
	mu.Unlock()
	if early != 0 {
		t.Errorf("%d results published without their replica acknowledgement, want none", early)
	}
	if orders, err := f.db.CampaignOrders(t.Context(), f.campaign.ID); err != nil || len(orders) != 0 {
		t.Errorf("got %d orders in MySQL (%v) without a replica acknowledgement, want none", len(orders), err)
	}
	if got := testutil.ToFloat64(m.PoisonMessages); got != 0 {
		t.Errorf("%v requests given up on for a replica shortfall, want none", got)
	}
	stock.back.Store(true)
	waitDecided(t, f, msgs)
	testenv.Eventually(t, 10*time.Second, "every result published", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(published) == len(msgs), ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consume: %v", err)
	}
	s := f.snapshot(t, msgs)
	for rid, r := range s.results {
		if r.Status == model.StatusRejected {
			t.Errorf("%s rejected (%s) after a replica shortfall: want it decided", rid, r.Reason)
		}
	}
	checkSoldOut(t, s, 10)
}
