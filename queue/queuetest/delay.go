package queuetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/flashsale/flashsale/queue"
)

// needDelay skips the test if the driver does not delay.
func needDelay(t *testing.T, f Factory) {
	t.Helper()
	if !f.Features.Delay {
		t.Skip("driver does not support delayed delivery (Features.Delay is false)")
	}
}

// delayPublisher returns b's publisher as a DelayPublisher.
func delayPublisher(t *testing.T, b Backend) queue.DelayPublisher {
	t.Helper()
	dp, ok := b.Publisher().(queue.DelayPublisher)
	if !ok {
		t.Fatalf("Features.Delay is set but the publisher (%T) does not implement queue.DelayPublisher", b.Publisher())
	}
	return dp
}

// testDelay: a delayed message is stored at once but not delivered before
// its delay has passed; a message published without delay meanwhile is
// delivered at once, and a zero delay is a plain publish.
func testDelay(t *testing.T, f Factory) {
	needDelay(t, f)
	b := f.New(t)
	dp := delayPublisher(t, b)
	topic := newTopic(t)
	const delay = time.Second

	rec := newRecorder()
	startConsumer(t, b.NewConsumer(t, "c"), topic, rec.handle)

	// Wait until the consumer is running, so arrival times measure the delay
	// and not the consumer's start.
	mustPublish(t, b.Publisher(), topic, newMsg("warmup", 0))
	rec.waitDistinct(t, 1)

	delayed := []queue.Message{newMsg("late", 0), newMsg("late", 1)}
	now, zero := newMsg("now", 0), newMsg("zero", 0)
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	sent := time.Now()
	if err := dp.PublishDelayed(ctx, topic, delay, delayed...); err != nil {
		t.Fatalf("PublishDelayed %v: got %v, want nil", delay, err)
	}
	if err := dp.PublishDelayed(ctx, topic, 0, zero); err != nil {
		t.Fatalf("PublishDelayed 0: got %v, want nil", err)
	}
	mustPublish(t, b.Publisher(), topic, now)

	rec.waitDistinct(t, 1+len(delayed)+2)
	for _, m := range delayed {
		if got := rec.arrival(m.ID).at.Sub(sent); got < delay {
			t.Errorf("delayed message %s: got it %v after publishing, want >= %v", m.ID, got, delay)
		}
	}
	for _, m := range []queue.Message{now, zero} {
		if rec.arrival(m.ID).at.After(rec.arrival(delayed[0].ID).at) {
			t.Errorf("message %s published without delay: got it after the delayed ones, want it first", m.ID)
		}
	}
}

// testDelayMany: one publisher per key publishes messages with many
// different delays while three consumers run (on a driver whose consumers
// schedule delayed messages, that is three schedulers at once). Each message
// arrives exactly once and no earlier than its delay after its publish
// began; with per-key order, a key's messages published with the same delay
// arrive in publish order.
func testDelayMany(t *testing.T, f Factory) {
	needDelay(t, f)
	b := f.New(t)
	dp := delayPublisher(t, b)
	topic := newTopic(t)
	const keys, perKey, consumers, delays = 4, 24, 3, 8
	// 100ms to 1.15s, shuffled, each delay three times per key.
	delayOf := func(seq int) time.Duration {
		return 100*time.Millisecond + time.Duration(seq*5%delays)*150*time.Millisecond
	}

	rec := newRecorder()
	for i := range consumers {
		startConsumer(t, b.NewConsumer(t, fmt.Sprintf("c%d", i)), topic, rec.handle)
	}
	mustPublish(t, b.Publisher(), topic, newMsg("warmup", 0))
	rec.waitDistinct(t, 1)

	var mu sync.Mutex
	sent := make(map[string]time.Time)
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	var g errgroup.Group
	for k := range keys {
		g.Go(func() error {
			for seq := range perKey {
				m := newMsg(fmt.Sprintf("k%d", k), seq)
				mu.Lock()
				sent[m.ID] = time.Now()
				mu.Unlock()
				if err := dp.PublishDelayed(ctx, topic, delayOf(seq), m); err != nil {
					return fmt.Errorf("publish %s: %w", m.ID, err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("PublishDelayed: got %v, want nil", err)
	}

	rec.waitDistinct(t, 1+keys*perKey)
	time.Sleep(quiet) // a message moved twice would arrive again meanwhile
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		last := make(map[time.Duration]int) // rank of the key's last arrival per delay
		for seq := range perKey {
			id, d := newMsg(key, seq).ID, delayOf(seq)
			if n := len(rec.deliveries(id)); n != 1 {
				t.Errorf("message %s: got %d deliveries, want 1", id, n)
			}
			a := rec.arrival(id)
			if got := a.at.Sub(sent[id]); got < d {
				t.Errorf("message %s delayed %v: got it %v after publishing, want >= %v", id, d, got, d)
			}
			if prev, ok := last[d]; ok && f.Features.PerKeyOrder && a.rank < prev {
				t.Errorf("message %s delayed %v: got it before the message of key %s published earlier with the same delay, want publish order", id, d, key)
			}
			last[d] = a.rank
		}
	}
}

// testDelayRestart: delayed messages outlive the consumer that ran when they
// were published. It dies (is killed if the backend can kill it, stopped
// otherwise), the messages fall due while no consumer runs, and the next
// consumer gets each of them once.
func testDelayRestart(t *testing.T, f Factory) {
	needDelay(t, f)
	b := f.New(t)
	dp := delayPublisher(t, b)
	topic := newTopic(t)
	const delay = time.Second

	first := newRecorder()
	var stop func()
	if cr, ok := b.(Crasher); ok {
		c, crash := cr.NewCrashableConsumer(t, "dying")
		r := startConsumer(t, c, topic, first.handle)
		stop = func() {
			r.crashed.Store(true)
			crash()
		}
	} else {
		r := startConsumer(t, b.NewConsumer(t, "first"), topic, first.handle)
		stop = func() {
			if err := r.stop(t); err != nil {
				t.Fatalf("Consume after cancel: got %v, want nil", err)
			}
		}
	}
	mustPublish(t, b.Publisher(), topic, newMsg("warmup", 0))
	first.waitDistinct(t, 1)

	msgs := []queue.Message{newMsg("a", 0), newMsg("b", 0), newMsg("a", 1)}
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	sent := time.Now()
	if err := dp.PublishDelayed(ctx, topic, delay, msgs...); err != nil {
		t.Fatalf("PublishDelayed %v: got %v, want nil", delay, err)
	}
	stop()
	if time.Since(sent) >= delay {
		t.Fatalf("stopping the first consumer took %v, want it stopped before the messages fall due (%v)", time.Since(sent), delay)
	}
	// Let the messages fall due with no consumer running.
	time.Sleep(time.Until(sent.Add(delay + quiet)))
	if n := first.distinct(); n != 1 {
		t.Fatalf("the first consumer got %d delayed messages, want 0 (it stopped before they were due)", n-1)
	}

	next := newRecorder()
	startConsumer(t, b.NewConsumer(t, "next"), topic, next.handle)
	next.waitDistinct(t, len(msgs))
	time.Sleep(quiet)
	for _, m := range msgs {
		if n := len(next.deliveries(m.ID)); n != 1 {
			t.Errorf("message %s: got %d deliveries, want 1", m.ID, n)
		}
	}
}
