package redisstream

import (
	"context"
	"log/slog"
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

// TestLeaseLost takes a consumer's lease away behind its back, as another
// consumer would after the holder stalled past its TTL, and publishes at
// once: the consumer must not deliver the message while the other tenure
// holds the partition (the fence, not the timing of its renewal, stops it),
// must notice that it lost the lease, and must resume once it can take the
// lease again, with the message still a first attempt.
func TestLeaseLost(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			dial := srv.dial(t)
			rdb := dial(t)
			opts := testOptions(t)
			opts.Partitions = 1
			lostLogged := make(chan struct{})
			opts.Logger = slog.New(&watchHandler{Handler: opts.Logger.Handler(), substr: "lease lost", seen: sync.OnceFunc(func() { close(lostLogged) })})
			var leases events
			opts.Observer = &leases
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

			testenv.Eventually(t, 10*time.Second, "the consumer to take the lease", func() (bool, string) {
				holder := rdb.Get(ctx, lk).Val()
				return strings.HasPrefix(holder, "victim-"), "held by " + holder
			})

			// Another tenure takes the lease (no TTL: it lasts until the
			// test frees it) and a message arrives at once.
			if err := rdb.Set(ctx, lk, "intruder#0", 0).Err(); err != nil {
				t.Fatalf("SET %s: %v", lk, err)
			}
			mustPublish(t, q, topic, queue.Message{ID: "m1", Key: "k", Body: []byte("x")})
			select {
			case <-lostLogged:
			case <-time.After(10 * time.Second):
				t.Fatalf("the consumer did not report its lease lost within 10s")
			}
			freed := time.Now()
			if err := rdb.Del(ctx, lk).Err(); err != nil {
				t.Fatalf("DEL %s: %v", lk, err)
			}

			testenv.Eventually(t, 10*time.Second, "a delivery once the lease is free", func() (bool, string) {
				_, calls := c.snapshot()
				return len(calls) > 0, "none"
			})
			if _, calls := c.snapshot(); calls[0].Before(freed) {
				t.Errorf("got a delivery %v before the other tenure let go of the lease, want none", freed.Sub(calls[0]))
			}
			if msgs, _ := c.snapshot(); msgs[0].ID != "m1" || msgs[0].Attempt != 1 {
				t.Errorf("got message %s attempt %d, want m1 attempt 1 (never delivered while fenced out)", msgs[0].ID, msgs[0].Attempt)
			}
			// Taken, lost to the other tenure, taken again: each counted.
			if a, l := leases.count(queue.PartitionAcquired), leases.count(queue.PartitionLost); a != 2 || l != 1 {
				t.Errorf("lease events: got %d acquired and %d lost (%v), want 2 and 1", a, l, leases.log)
			}
		})
	}
}

// watchHandler passes records on and calls seen for the first whose message
// contains substr: tests wait for what the consumer logs instead of for time.
type watchHandler struct {
	slog.Handler
	substr string
	seen   func()
}

func (h *watchHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.substr) {
		h.seen()
	}
	return h.Handler.Handle(ctx, r)
}

func (h *watchHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &watchHandler{Handler: h.Handler.WithAttrs(attrs), substr: h.substr, seen: h.seen}
}

func (h *watchHandler) WithGroup(name string) slog.Handler {
	return &watchHandler{Handler: h.Handler.WithGroup(name), substr: h.substr, seen: h.seen}
}
