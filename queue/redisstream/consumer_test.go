package redisstream

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
)

// collector records handler calls for the tests below.
type collector struct {
	mu    sync.Mutex
	msgs  []queue.Message
	calls []time.Time
}

func (c *collector) handle(_ context.Context, msgs []queue.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, msgs...)
	c.calls = append(c.calls, time.Now())
	return nil
}

func (c *collector) snapshot() ([]queue.Message, []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]queue.Message(nil), c.msgs...), append([]time.Time(nil), c.calls...)
}

// TestShutdownDuringRead publishes while a cancelled consumer is still in its
// blocking read: the entries it reads then must not reach the handler, and
// the next consumer must see them as first attempts.
func TestShutdownDuringRead(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			dial := srv.dial(t)
			opts := testOptions(t)
			opts.Block = time.Second // a long read, so the publish lands inside it
			q := New(dial(t), opts)
			topic := testenv.Topic(t)
			t.Cleanup(func() {
				_ = q.Close()
				(&topicLog{topics: map[string]bool{topic: true}}).deleteKeys(t, dial(t), q.opts.Partitions)
			})

			var late collector
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- q.Consumer("old").Consume(ctx, topic, late.handle) }()
			time.Sleep(300 * time.Millisecond) // leases taken, reads blocked
			cancel()
			mustPublish(t, q, topic, queue.Message{ID: "m1", Key: "k", Body: []byte("x")})
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Consume after cancel: got %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Consume did not return within 10s of cancel")
			}
			if msgs, _ := late.snapshot(); len(msgs) != 0 {
				t.Fatalf("handler calls after cancel: got %d messages, want 0", len(msgs))
			}

			got := consumeUntil(t, q.Consumer("new"), topic, 1)
			if got[0].ID != "m1" || got[0].Attempt != 1 {
				t.Errorf("got message %s attempt %d, want m1 attempt 1", got[0].ID, got[0].Attempt)
			}
		})
	}
}

// TestLeaseLost takes a consumer's lease away behind its back: the consumer
// must stop reading the partition as soon as its renewal fails, and resume
// once it can take the lease again.
func TestLeaseLost(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			dial := srv.dial(t)
			rdb := dial(t)
			opts := testOptions(t)
			opts.Partitions = 1
			q := New(rdb, opts)
			topic := testenv.Topic(t)
			lk := leaseKey(topic, 0)
			t.Cleanup(func() {
				_ = q.Close()
				(&topicLog{topics: map[string]bool{topic: true}}).deleteKeys(t, rdb, q.opts.Partitions)
			})
			ctx := context.Background()

			var c collector
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- q.Consumer("victim").Consume(cctx, topic, c.handle) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Consume after cancel: got %v, want nil", err)
				}
			})

			deadline := time.Now().Add(5 * time.Second)
			for !strings.HasPrefix(rdb.Get(ctx, lk).Val(), "victim-") {
				if time.Now().After(deadline) {
					t.Fatalf("consumer did not take the lease within 5s")
				}
				time.Sleep(10 * time.Millisecond)
			}

			// An intruder takes the lease; within one renewal period
			// (TTL/3) the victim notices and stops reading.
			const intruderTTL = 2 * time.Second
			if err := rdb.Set(ctx, lk, "intruder", intruderTTL).Err(); err != nil {
				t.Fatalf("SET %s: %v", lk, err)
			}
			stolen := time.Now()
			time.Sleep(opts.LeaseTTL/3 + opts.Block + 100*time.Millisecond)
			mustPublish(t, q, topic, queue.Message{ID: "m1", Key: "k", Body: []byte("x")})

			deadline = time.Now().Add(10 * time.Second)
			for {
				if _, calls := c.snapshot(); len(calls) > 0 {
					if calls[0].Before(stolen.Add(intruderTTL)) {
						t.Errorf("got a delivery %v after the lease was taken, want none before the intruder's lease expired (%v)",
							calls[0].Sub(stolen), intruderTTL)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("got no delivery within 10s, want one after the intruder's lease expired")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if msgs, _ := c.snapshot(); msgs[0].ID != "m1" || msgs[0].Attempt != 1 {
				t.Errorf("got message %s attempt %d, want m1 attempt 1", msgs[0].ID, msgs[0].Attempt)
			}
		})
	}
}
