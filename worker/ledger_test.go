package worker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/memqueue"
)

// holdCountingStock counts the deliveries held.
type holdCountingStock struct {
	Stock
	holds atomic.Int32
}

func (c *holdCountingStock) Deduct(ctx context.Context, campaignID string, batch []model.Deduction) (model.DeductReply, error) {
	r, err := c.Stock.Deduct(ctx, campaignID, batch)
	if errors.Is(err, model.ErrHeld) {
		c.holds.Add(1)
	}
	return r, err
}

// attemptsSeen records the highest delivery attempt the worker was given.
func attemptsSeen(seen *atomic.Int32, h queue.PipelineHandler) queue.PipelineHandler {
	return func(ctx context.Context, msgs []queue.Message) (queue.Finish, error) {
		for _, m := range msgs {
			for {
				cur := seen.Load()
				if int32(m.Attempt) <= cur || seen.CompareAndSwap(cur, int32(m.Attempt)) {
					break
				}
			}
		}
		return h(ctx, msgs)
	}
}

// TestHoldBeyondMaxAttempts: a campaign that lost its Redis state, or is
// paused, holds its messages for more deliveries than MaxAttempts without
// deciding or rejecting any (a hold is not a failed attempt: the Attempt
// stays 1), and they are decided once it is back.
func TestHoldBeyondMaxAttempts(t *testing.T) {
	for _, tc := range []struct {
		name        string
		hold, clear func(t *testing.T, f *fixture)
	}{
		{
			name: "lost",
			hold: mustForget,
			clear: func(t *testing.T, f *fixture) {
				if _, err := reconcile.Load(t.Context(), f.db, f.st, f.campaign.ID); err != nil {
					t.Fatalf("load: %v", err)
				}
			},
		},
		{
			name: "paused",
			hold: func(t *testing.T, f *fixture) { mustSetPaused(t, f, true) },
			clear: func(t *testing.T, f *fixture) {
				mustSetPaused(t, f, false)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 10, 1)
			msgs := f.admit(t, 16, 12) // 12 users, 4 of them twice; stock 10
			tc.hold(t, f)
			stock := &holdCountingStock{Stock: f.st}
			w := New(discard(), stock, f.db, metrics.New(), Options{MaxAttempts: 2})
			q := memqueue.New(memqueue.Options{Partitions: 1, BatchSize: 8, RedeliveryDelay: time.Millisecond})
			t.Cleanup(func() { _ = q.Close() })
			topic := "hold"
			if err := q.Publish(t.Context(), topic, msgs...); err != nil {
				t.Fatal(err)
			}
			var seen atomic.Int32
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- queue.ConsumePipelined(ctx, q.Consumer("w"), topic, attemptsSeen(&seen, w.Decide)) }()

			testenv.Eventually(t, 20*time.Second, "more than 4 deliveries held (twice MaxAttempts)", func() (bool, string) {
				n := stock.holds.Load()
				return n > 4, fmt.Sprintf("%d held", n)
			})
			// Not one of them counted as a failed attempt (queue.ErrHeld).
			if got := seen.Load(); got != 1 {
				t.Errorf("held deliveries reached Attempt %d, want 1", got)
			}
			for _, m := range msgs {
				if r, err := f.st.Result(t.Context(), m.ID); err == nil && r.Status.Final() {
					t.Fatalf("%s decided while held: %+v", m.ID, r)
				}
			}
			// The driver is told it is a hold, not a failure (RocketMQ
			// would dead-letter failures).
			if _, err := w.Decide(t.Context(), msgs[:1]); !errors.Is(err, queue.ErrHeld) {
				t.Fatalf("Decide while held: got %v, want an error wrapping queue.ErrHeld", err)
			}
			tc.clear(t, f)
			waitDecided(t, f, msgs)
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("consume: %v", err)
			}

			s := f.snapshot(t, msgs)
			for rid, r := range s.results {
				if r.Status == model.StatusRejected {
					t.Errorf("%s rejected (%s) after a hold: want it decided", rid, r.Reason)
				}
			}
			checkSoldOut(t, s, 10)
			if stock.holds.Load() == 0 {
				t.Errorf("no delivery was held")
			}
		})
	}
}

// mustForget deletes the campaign's keys, as FLUSHALL would.
func mustForget(t *testing.T, f *fixture) {
	t.Helper()
	rdb := testenv.Redis(t)
	keys, err := rdb.Keys(t.Context(), "fs:{"+f.campaign.ID+"}:*").Result()
	if err == nil && len(keys) > 0 {
		err = rdb.Del(t.Context(), keys...).Err()
	}
	if err != nil {
		t.Fatal(err)
	}
}

func mustSetPaused(t *testing.T, f *fixture, paused bool) {
	t.Helper()
	c, err := f.db.SetPaused(t.Context(), f.campaign.ID, paused)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := f.st.SetPaused(t.Context(), c); err != nil || !ok {
		t.Fatalf("SetPaused in Redis: %v, %v", ok, err)
	}
}

// waitDecided waits until every message has a final result and MySQL holds
// the units Redis sold.
func waitDecided(t *testing.T, f *fixture, msgs []queue.Message) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "every message decided and its orders stored", func() (bool, string) {
		final := 0
		for _, m := range msgs {
			if r, err := f.st.Result(t.Context(), m.ID); err == nil && r.Status.Final() {
				final++
			}
		}
		st, err := f.st.Stats(t.Context(), f.campaign.ID)
		if err != nil {
			t.Fatal(err)
		}
		os, err := f.db.CampaignOrderStats(t.Context(), f.campaign.ID)
		return err == nil && final == len(msgs) && os.Units == st.Sold, fmt.Sprintf("%d of %d decided, %+v", final, len(msgs), st)
	})
}

// TestLoadBetweenDecideAndFinish: a load that moves the epoch after a batch
// was decided and before its orders are stored makes the insert fail; the
// batch is decided again against the rebuilt state and stored once. No
// unit is counted twice or missed, and a request that succeeds both times
// keeps the order id of its first decision.
func TestLoadBetweenDecideAndFinish(t *testing.T) {
	f := newFixture(t, 5, 1)
	msgs := f.admit(t, 8, 8)
	var decided []model.Result
	w := New(discard(), f.st, f.db, metrics.New(), Options{PersistAttempts: 3,
		AfterDeduct: func(_ string, rs []model.Result) error { decided = rs; return nil }})
	early := msgs[:3]
	if err := queue.Serial(w.Decide)(t.Context(), early); err != nil {
		t.Fatalf("first batch: %v", err)
	}
	finish, err := w.Decide(t.Context(), msgs[3:])
	if err != nil {
		t.Fatalf("decide: %v", err)
	}
	firstOrderIDs := map[string]string{} // request id -> order id, as first decided
	for _, r := range decided {
		if r.Status == model.StatusSuccess {
			firstOrderIDs[r.RequestID] = r.OrderID
		}
	}
	if len(firstOrderIDs) == 0 {
		t.Fatalf("no success in the batch decided before the load")
	}
	if _, err := reconcile.Load(t.Context(), f.db, f.st, f.campaign.ID); err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := finish(t.Context()); !errors.Is(err, model.ErrLedgerMoved) || !errors.Is(err, queue.ErrHeld) {
		t.Fatalf("finish after the load: got %v, want %v, held (the batch waits for Redis to be rebuilt)", err, model.ErrLedgerMoved)
	}
	if err := queue.Serial(w.Decide)(t.Context(), msgs[3:]); err != nil {
		t.Fatalf("redelivery: %v", err)
	}
	s := f.snapshot(t, msgs)
	checkSoldOut(t, s, 5)
	for _, m := range early {
		if s.results[m.ID].Status != model.StatusSuccess {
			t.Errorf("%s, stored before the load: got %s, want success", m.ID, s.results[m.ID].Status)
		}
	}
	for rid, first := range firstOrderIDs {
		if r := s.results[rid]; r.Status == model.StatusSuccess && r.OrderID != first {
			t.Errorf("%s decided again: order id %s, first %s; want the same", rid, r.OrderID, first)
		}
	}
	rep, err := reconcile.New(f.st, f.db).Check(t.Context(), f.campaign.ID)
	if err != nil || !rep.Consistent() {
		t.Fatalf("Redis vs MySQL: %+v, %v", rep.Differences, err)
	}
}
