package memqueue

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/queuetest"
)

// backend adapts a Queue to the contract suite. It lives in the internal test
// package so it can crash consumers through the unexported hook.
type backend struct{ q *Queue }

var _ queuetest.Crasher = backend{}

func (b backend) Publisher() queue.Publisher { return b.q }

func (b backend) NewConsumer(_ *testing.T, name string) queue.Consumer { return b.q.Consumer(name) }

func (b backend) Close() error { return b.q.Close() }

func (b backend) NewCrashableConsumer(_ *testing.T, name string) (queue.Consumer, func()) {
	c := b.q.Consumer(name)
	return c, c.crash
}

func TestContract(t *testing.T) {
	const batchSize = 16
	queuetest.Run(t, queuetest.Factory{
		Features:  Features(),
		BatchSize: batchSize,
		New: func(t *testing.T) queuetest.Backend {
			q := New(Options{Partitions: 4, BatchSize: batchSize, RedeliveryDelay: 10 * time.Millisecond})
			t.Cleanup(func() { _ = q.Close() })
			return backend{q: q}
		},
	})
}

// TestDelayDueOrder checks that delayed messages join their partition in due
// order, not publish order, and ahead of a message published after they fell
// due, even when no consumer looked in between.
func TestDelayDueOrder(t *testing.T) {
	q := New(Options{Partitions: 1})
	t.Cleanup(func() { _ = q.Close() })
	ctx := context.Background()
	const topic = "t"
	msg := func(id string) queue.Message { return queue.Message{ID: id, Key: "k", Body: []byte(id)} }
	for _, p := range []struct {
		id    string
		delay time.Duration
	}{{"d3", 60 * time.Millisecond}, {"d1", 20 * time.Millisecond}, {"d2", 40 * time.Millisecond}, {"now", 0}} {
		if err := q.PublishDelayed(ctx, topic, p.delay, msg(p.id)); err != nil {
			t.Fatalf("PublishDelayed %s: got %v, want nil", p.id, err)
		}
	}
	time.Sleep(80 * time.Millisecond) // all three fall due; no consumer runs yet
	if err := q.Publish(ctx, topic, msg("after")); err != nil {
		t.Fatalf("Publish: got %v, want nil", err)
	}

	var got []string
	done := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(done)
		_ = q.Consumer("c").Consume(cctx, topic, func(_ context.Context, msgs []queue.Message) error {
			for _, m := range msgs {
				got = append(got, m.ID)
			}
			if len(got) == 5 {
				cancel()
			}
			return nil
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("got %v within 10s, want 5 messages", got)
	}
	want := []string{"now", "d1", "d2", "d3", "after"}
	if !slices.Equal(got, want) {
		t.Errorf("got order %v, want %v", got, want)
	}
}

// TestCloseDropsDelayed checks that Close does not wait for delayed messages
// and stops a consumer waiting for one.
func TestCloseDropsDelayed(t *testing.T) {
	q := New(Options{})
	if err := q.PublishDelayed(context.Background(), "t", time.Hour, queue.Message{ID: "m", Key: "k"}); err != nil {
		t.Fatalf("PublishDelayed: got %v, want nil", err)
	}
	done := make(chan error, 1)
	go func() {
		done <- q.Consumer("c").Consume(context.Background(), "t", func(context.Context, []queue.Message) error {
			t.Errorf("got a delivery, want none before Close")
			return nil
		})
	}()
	closed := make(chan struct{})
	go func() {
		_ = q.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("Close did not return within 10s with a delayed message pending")
	}
	if err := <-done; err != nil && !errors.Is(err, queue.ErrClosed) {
		t.Errorf("Consume after Close: got %v, want nil or ErrClosed", err)
	}
}
