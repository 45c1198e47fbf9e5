package queuetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/flashsale/flashsale/queue"
)

var errHandler = errors.New("queuetest: handler asks for redelivery")

// testDeliversEverything: every message published by many concurrent
// publishers reaches one of two consumers intact.
func testDeliversEverything(t *testing.T, f Factory) {
	b := f.New(t)
	topic := newTopic(t)
	const keys, perKey, publishers = 5, 100, 10
	all := newMsgs(keys, perKey)
	want := make(map[string]queue.Message, len(all))
	for _, m := range all {
		want[m.ID] = m
	}

	rec := newRecorder()
	for i := range 2 {
		startConsumer(t, b.NewConsumer(t, fmt.Sprintf("c%d", i)), topic, rec.handle)
	}

	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	var g errgroup.Group
	for p := range publishers {
		g.Go(func() error {
			var mine []queue.Message
			for i := p; i < len(all); i += publishers {
				mine = append(mine, all[i])
			}
			// Mix single-message and multi-message calls.
			for len(mine) > 0 {
				n := min(len(mine), 1+len(mine)%7)
				if err := b.Publisher().Publish(ctx, topic, mine[:n]...); err != nil {
					return fmt.Errorf("publisher %d: %w", p, err)
				}
				mine = mine[n:]
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("publish: got %v, want nil", err)
	}

	rec.waitDistinct(t, len(all))
	got := rec.snapshot()
	for _, id := range sortedIDs(got) {
		w, ok := want[id]
		if !ok {
			t.Errorf("got message %q, which was never published", id)
			continue
		}
		for _, d := range got[id] {
			if d.Key != w.Key || string(d.Body) != string(w.Body) {
				t.Errorf("message %s: got key %q body %q, want key %q body %q", id, d.Key, d.Body, w.Key, w.Body)
			}
			if d.Attempt < 1 {
				t.Errorf("message %s: got Attempt %d, want >= 1", id, d.Attempt)
			}
		}
	}
}

// testAckedNotRedelivered: a batch whose handler returned nil is not
// delivered again, neither to the same consumer nor to a new one.
func testAckedNotRedelivered(t *testing.T, f Factory) {
	b := f.New(t)
	topic := newTopic(t)
	msgs := newMsgs(2, 10)
	mustPublish(t, b.Publisher(), topic, msgs...)

	rec := newRecorder()
	r := startConsumer(t, b.NewConsumer(t, "first"), topic, rec.handle)
	rec.waitDistinct(t, len(msgs))
	time.Sleep(quiet)
	for _, id := range ids(msgs) {
		if n := len(rec.deliveries(id)); n != 1 {
			t.Errorf("message %s: got %d deliveries, want 1", id, n)
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume after cancel: got %v, want nil", err)
	}

	// A new consumer takes over whatever the first left unacknowledged:
	// there must be nothing. Sentinels published behind the old messages,
	// with the same keys, show that it is running (some drivers take seconds
	// to start) and would arrive after any redelivery.
	again := newRecorder()
	startConsumer(t, b.NewConsumer(t, "second"), topic, again.handle)
	sentinels := []queue.Message{newMsg("k0", 10), newMsg("k1", 10)}
	mustPublish(t, b.Publisher(), topic, sentinels...)
	again.waitDistinct(t, len(sentinels))
	time.Sleep(quiet)
	got := again.snapshot()
	for _, m := range sentinels {
		delete(got, m.ID)
	}
	if len(got) != 0 {
		t.Errorf("new consumer after all were acknowledged: got redeliveries of %v, want none", sortedIDs(got))
	}
}

// refuseFirst publishes msgs on a fresh backend to a handler that answers
// err to a batch holding a message delivered n times or fewer, and returns
// the deliveries once every message was acknowledged.
func refuseFirst(t *testing.T, f Factory, msgs []queue.Message, n int, err error) *recorder {
	t.Helper()
	b := f.New(t)
	topic := newTopic(t)
	rec := newRecorder()
	h := func(_ context.Context, batch []queue.Message) error {
		rec.record(batch)
		for _, m := range batch {
			if len(rec.deliveries(m.ID)) <= n {
				return err
			}
		}
		rec.ack(batch)
		return nil
	}
	startConsumer(t, b.NewConsumer(t, "c"), topic, h)
	mustPublish(t, b.Publisher(), topic, msgs...)
	waitUntil(t, deliveryTimeout, "every message acknowledged", func() (bool, string) {
		acked := rec.ackedCount()
		return acked == len(msgs), fmt.Sprintf("got %d acknowledged, want %d", acked, len(msgs))
	})
	return rec
}

// testRedeliversOnError: a batch whose handler fails comes back with a larger
// Attempt until the handler accepts it.
func testRedeliversOnError(t *testing.T, f Factory) {
	msgs := newMsgs(2, 5)
	const failures = 2 // each message is refused this many times
	rec := refuseFirst(t, f, msgs, failures, errHandler)
	for _, id := range ids(msgs) {
		ds := rec.deliveries(id)
		if len(ds) < failures+1 {
			t.Errorf("message %s: got %d deliveries, want >= %d", id, len(ds), failures+1)
			continue
		}
		if ds[0].Attempt < 1 {
			t.Errorf("message %s: first delivery got Attempt %d, want >= 1", id, ds[0].Attempt)
		}
		for i := 1; i < len(ds); i++ {
			if ds[i].Attempt <= ds[i-1].Attempt {
				t.Errorf("message %s: delivery %d after a failure got Attempt %d, want > %d", id, i+1, ds[i].Attempt, ds[i-1].Attempt)
			}
		}
		if last := ds[len(ds)-1]; last.Attempt < 2 {
			t.Errorf("message %s: redelivery got Attempt %d, want >= 2", id, last.Attempt)
		}
	}
}

// testHeldIsNotAFailure: a batch its handler holds (an error wrapping
// queue.ErrHeld) comes back until the handler takes it, with the Attempt it
// had: a hold does not count as a failed delivery, so a driver that gives
// failing messages up never gives a held one up, however long it lasts.
func testHeldIsNotAFailure(t *testing.T, f Factory) {
	msgs := newMsgs(1, 3)
	const holds = 4 // each message is held this many times
	rec := refuseFirst(t, f, msgs, holds, fmt.Errorf("campaign paused: %w", queue.ErrHeld))
	for _, id := range ids(msgs) {
		ds := rec.deliveries(id)
		if len(ds) < holds+1 {
			t.Errorf("message %s: got %d deliveries, want >= %d", id, len(ds), holds+1)
		}
		for i, d := range ds {
			if d.Attempt != ds[0].Attempt {
				t.Errorf("message %s: delivery %d after %d holds got Attempt %d, want %d as the first", id, i+1, i, d.Attempt, ds[0].Attempt)
			}
		}
	}
}

// answered is a delivery's Attempt and the error of the step that refused
// it, nil if none did (taken, or its Finish dropped because a batch ahead
// failed).
type answered struct {
	attempt int
	refused error
}

func (a answered) String() string {
	switch {
	case a.refused == nil:
		return fmt.Sprintf("%d:taken", a.attempt)
	case errors.Is(a.refused, queue.ErrHeld):
		return fmt.Sprintf("%d:held", a.attempt)
	}
	return fmt.Sprintf("%d:failed", a.attempt)
}

// testAttemptsCountFailuresNotHolds: through queue.ConsumePipelined, a
// delivery that a step fails is followed by one with a larger Attempt, and
// one that a step holds (its first step or its Finish) by one with the same
// Attempt, whatever the holds and failures before it.
func testAttemptsCountFailuresNotHolds(t *testing.T, f Factory) {
	type answer struct {
		finish bool  // answered by the Finish, else by the first step
		err    error // nil: take the batch
	}
	held := fmt.Errorf("queuetest: waiting: %w", queue.ErrHeld)
	// A batch's answer is the one at the count of deliveries its first
	// message had before; past the script, it is taken.
	script := []answer{{false, held}, {true, errHandler}, {true, held}, {false, errHandler}, {true, held}, {false, held}}
	b := f.New(t)
	topic := newTopic(t)
	msgs := newMsgs(2, 4)
	var (
		mu    sync.Mutex
		seen  = make(map[string][]answered)
		acked = make(map[string]bool)
	)
	refuse := func(batch []queue.Message, from []int, err error) error {
		mu.Lock()
		defer mu.Unlock()
		for i, m := range batch {
			seen[m.ID][from[i]].refused = err
		}
		return err
	}
	h := func(_ context.Context, batch []queue.Message) (queue.Finish, error) {
		mu.Lock()
		step := answer{}
		if k := len(seen[batch[0].ID]); k < len(script) {
			step = script[k]
		}
		from := make([]int, len(batch))
		for i, m := range batch {
			from[i] = len(seen[m.ID])
			seen[m.ID] = append(seen[m.ID], answered{attempt: m.Attempt})
		}
		mu.Unlock()
		if step.err != nil && !step.finish {
			return nil, refuse(batch, from, step.err)
		}
		return func(context.Context) error {
			if step.err != nil {
				return refuse(batch, from, step.err)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, m := range batch {
				acked[m.ID] = true
			}
			return nil
		}, nil
	}
	startPipelined(t, b.NewConsumer(t, "c"), topic, h)
	mustPublish(t, b.Publisher(), topic, msgs...)
	waitUntil(t, deliveryTimeout, "every message acknowledged", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == len(msgs), fmt.Sprintf("got %d acknowledged, want %d", len(acked), len(msgs))
	})

	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids(msgs) {
		ds := seen[id]
		if len(ds) < len(script)+1 {
			t.Errorf("message %s: got %d deliveries, want >= %d", id, len(ds), len(script)+1)
		}
		for i := 1; i < len(ds); i++ {
			prev, got := ds[i-1], ds[i].attempt
			switch {
			case errors.Is(prev.refused, queue.ErrHeld) && got != prev.attempt:
				t.Errorf("message %s: delivery %d after a hold got Attempt %d, want %d as before (deliveries %v)", id, i+1, got, prev.attempt, ds)
			case prev.refused != nil && !errors.Is(prev.refused, queue.ErrHeld) && got <= prev.attempt:
				t.Errorf("message %s: delivery %d after a failure got Attempt %d, want > %d (deliveries %v)", id, i+1, got, prev.attempt, ds)
			case got < prev.attempt:
				t.Errorf("message %s: delivery %d got Attempt %d, want >= %d (deliveries %v)", id, i+1, got, prev.attempt, ds)
			}
		}
	}
}

// testHoldOutlivesConsumer: a batch held when its consumer stops (in its
// first step or its Finish) reaches the next consumer with the Attempt it
// had: handing a held batch over does not count either.
func testHoldOutlivesConsumer(t *testing.T, f Factory) {
	held := fmt.Errorf("queuetest: waiting: %w", queue.ErrHeld)
	for _, finish := range []bool{false, true} {
		t.Run(map[bool]string{false: "first step", true: "finish"}[finish], func(t *testing.T) {
			b := f.New(t)
			topic := newTopic(t)
			msgs := newMsgs(1, 3)
			rec := newRecorder()
			hold := func(_ context.Context, batch []queue.Message) (queue.Finish, error) {
				rec.record(batch)
				if !finish {
					return nil, held
				}
				return func(context.Context) error { return held }, nil
			}
			first := startPipelined(t, b.NewConsumer(t, "first"), topic, hold)
			mustPublish(t, b.Publisher(), topic, msgs...)
			waitUntil(t, deliveryTimeout, "every message held twice", func() (bool, string) {
				for _, id := range ids(msgs) {
					if n := len(rec.deliveries(id)); n < 2 {
						return false, fmt.Sprintf("message %s delivered %d times", id, n)
					}
				}
				return true, ""
			})
			if err := first.stop(t); err != nil {
				t.Fatalf("first consumer's Consume after cancel: got %v, want nil", err)
			}
			heldBy := rec.snapshot()

			startConsumer(t, b.NewConsumer(t, "next"), topic, rec.handle)
			waitUntil(t, deliveryTimeout, "every message acknowledged", func() (bool, string) {
				acked := rec.ackedCount()
				return acked == len(msgs), fmt.Sprintf("got %d acknowledged, want %d", acked, len(msgs))
			})
			for _, id := range ids(msgs) {
				was := heldBy[id][0].Attempt
				for i, d := range rec.deliveries(id) {
					if d.Attempt != was {
						t.Errorf("message %s: delivery %d got Attempt %d, want %d as when first held (%d held by the first consumer)", id, i+1, d.Attempt, was, len(heldBy[id]))
					}
				}
			}
		})
	}
}

// testPerKeyOrder: with three consumers on a topic, each key's messages reach
// the handlers in publish order, a failed batch comes back before anything
// after it, and no two batches holding one key are ever handled at once.
func testPerKeyOrder(t *testing.T, f Factory) {
	if !f.Features.PerKeyOrder {
		t.Skip("driver does not promise per-key order (Features.PerKeyOrder is false)")
	}
	b := f.New(t)
	topic := newTopic(t)
	const keys, perKey, consumers = 6, 60, 3

	var (
		mu         sync.Mutex
		next       = make(map[string]int) // next expected seq per key, advanced on ack
		violations []string
		inFlight   = make(map[string]*atomic.Int32)
		calls      atomic.Int64
	)
	for k := range keys {
		inFlight[fmt.Sprintf("k%d", k)] = new(atomic.Int32)
	}
	violate := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(violations) < 20 {
			violations = append(violations, fmt.Sprintf(format, args...))
		}
	}

	h := func(_ context.Context, batch []queue.Message) error {
		seen := make(map[string]bool)
		for _, m := range batch {
			if seen[m.Key] {
				continue
			}
			seen[m.Key] = true
			c, ok := inFlight[m.Key]
			if !ok {
				violate("got unknown key %q", m.Key)
				continue
			}
			if n := c.Add(1); n > 1 {
				violate("key %s: got %d batches in flight at once, want 1", m.Key, n)
			}
			defer c.Add(-1)
		}

		// Each key's messages in the batch must continue exactly where the
		// last acknowledged batch of that key stopped.
		mu.Lock()
		cursor := make(map[string]int)
		for _, m := range batch {
			want, ok := cursor[m.Key]
			if !ok {
				want = next[m.Key]
			}
			seq, err := seqOf(m.ID)
			if err != nil {
				mu.Unlock()
				violate("message %q: cannot parse sequence: %v", m.ID, err)
				return nil
			}
			if seq != want {
				violations = append(violations, fmt.Sprintf("key %s: got seq %d, want %d", m.Key, seq, want))
			}
			cursor[m.Key] = seq + 1
		}
		mu.Unlock()

		// Widen the window in which an overlapping batch would be caught.
		time.Sleep(time.Millisecond)
		if calls.Add(1)%5 == 0 {
			return errHandler
		}
		mu.Lock()
		for k, c := range cursor {
			next[k] = c
		}
		mu.Unlock()
		return nil
	}
	for i := range consumers {
		startConsumer(t, b.NewConsumer(t, fmt.Sprintf("c%d", i)), topic, h)
	}

	// One publisher per key, each publishing its key's messages in order.
	var g errgroup.Group
	for k := range keys {
		g.Go(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
			defer cancel()
			key := fmt.Sprintf("k%d", k)
			for seq := 0; seq < perKey; {
				n := min(perKey-seq, 1+seq%4)
				batch := make([]queue.Message, n)
				for i := range n {
					batch[i] = newMsg(key, seq+i)
				}
				if err := b.Publisher().Publish(ctx, topic, batch...); err != nil {
					return fmt.Errorf("publish %s: %w", key, err)
				}
				seq += n
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("publish: got %v, want nil", err)
	}

	// Deferred so the violations are reported even if the wait times out.
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, v := range violations {
			t.Error(v)
		}
	}()
	waitUntil(t, deliveryTimeout, "every key fully acknowledged", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		done := 0
		for _, n := range next {
			if n >= perKey {
				done++
			}
		}
		return done == keys, fmt.Sprintf("got %d of %d keys done (%v)", done, keys, next)
	})
}

// testDeadConsumerRedelivered: the messages a consumer held when it died
// reach another consumer, with Attempt >= 2.
func testDeadConsumerRedelivered(t *testing.T, f Factory) {
	b := f.New(t)
	cr, ok := b.(Crasher)
	if !ok {
		t.Skip("backend does not implement queuetest.Crasher")
	}
	topic := newTopic(t)
	msgs := newMsgs(2, 10)
	mustPublish(t, b.Publisher(), topic, msgs...)

	dead := newRecorder()
	release := make(chan struct{})
	a, crash := cr.NewCrashableConsumer(t, "dying")
	ra := startConsumer(t, a, topic, func(_ context.Context, batch []queue.Message) error {
		dead.record(batch)
		<-release // stuck until the test ends, like a hung process
		return errHandler
	})
	t.Cleanup(sync.OnceFunc(func() { close(release) }))
	waitUntil(t, deliveryTimeout, "the dying consumer to get a batch", func() (bool, string) {
		n := dead.distinct()
		return n > 0, fmt.Sprintf("got %d messages", n)
	})
	ra.crashed.Store(true)
	crash()

	rec := newRecorder()
	startConsumer(t, b.NewConsumer(t, "survivor"), topic, rec.handle)
	rec.waitDistinct(t, len(msgs))

	// Read what the dead consumer got only now: a delivery that raced the
	// crash must come back too.
	held := dead.snapshot()
	for _, id := range sortedIDs(held) {
		ds := rec.deliveries(id)
		if len(ds) == 0 {
			t.Errorf("message %s held by the dead consumer: got no redelivery, want one", id)
			continue
		}
		if ds[0].Attempt < 2 {
			t.Errorf("message %s held by the dead consumer: got Attempt %d on redelivery, want >= 2", id, ds[0].Attempt)
		}
	}
}

// testBatchSizeRespected: with a backlog, batches are formed but never exceed
// the configured size.
func testBatchSizeRespected(t *testing.T, f Factory) {
	b := f.New(t)
	topic := newTopic(t)
	msgs := newMsgs(1, 3*f.BatchSize+5) // one key, so one partition holds the whole backlog
	mustPublish(t, b.Publisher(), topic, msgs...)

	rec := newRecorder()
	startConsumer(t, b.NewConsumer(t, "c"), topic, rec.handle)
	rec.waitDistinct(t, len(msgs))

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.maxBatch > f.BatchSize {
		t.Errorf("got a batch of %d messages, want at most %d", rec.maxBatch, f.BatchSize)
	}
	if f.BatchSize > 1 && rec.maxBatch < 2 {
		t.Errorf("got largest batch %d from a backlog of %d, want batches of more than one message", rec.maxBatch, len(msgs))
	}
}

// testShutdownFinishesInFlightBatch: after ctx is cancelled, Consume waits for
// the handler in flight (whose context stays alive), acknowledges its batch,
// starts no new batch and returns nil.
func testShutdownFinishesInFlightBatch(t *testing.T, f Factory) {
	b := f.New(t)
	topic := newTopic(t)
	msgs := newMsgs(1, 5)
	mustPublish(t, b.Publisher(), topic, msgs...)

	started := make(chan []queue.Message, 1)
	release := make(chan struct{})
	handlerCtxErr := make(chan error, 1)
	var cancelled atomic.Bool
	var callsAfterCancel atomic.Int32
	var firstTaken atomic.Bool
	h := func(ctx context.Context, batch []queue.Message) error {
		if cancelled.Load() {
			callsAfterCancel.Add(1)
		}
		if firstTaken.CompareAndSwap(false, true) {
			started <- batch
			<-release
			handlerCtxErr <- ctx.Err()
		}
		return nil
	}
	r := startConsumer(t, b.NewConsumer(t, "c"), topic, h)
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)

	var inFlight []queue.Message
	select {
	case inFlight = <-started:
	case <-time.After(deliveryTimeout):
		t.Fatalf("got no batch within %v, want one", deliveryTimeout)
	}
	cancelled.Store(true)
	r.cancel()
	time.Sleep(quiet)
	if r.returned() {
		t.Fatalf("Consume returned while its handler was still running, want it to wait")
	}
	releaseOnce()
	if err := r.wait(t); err != nil {
		t.Errorf("Consume after cancel: got %v, want nil", err)
	}
	if err := <-handlerCtxErr; err != nil {
		t.Errorf("handler context after Consume's was cancelled: got %v, want nil", err)
	}
	if n := callsAfterCancel.Load(); n != 0 {
		t.Errorf("got %d handler calls started after cancel, want 0", n)
	}

	// The batch that finished during shutdown was acknowledged: a new
	// consumer gets only the rest, then a sentinel published behind them
	// (which also shows it is running when the rest is empty).
	rec := newRecorder()
	startConsumer(t, b.NewConsumer(t, "next"), topic, rec.handle)
	sentinel := newMsg("k0", len(msgs))
	mustPublish(t, b.Publisher(), topic, sentinel)
	rec.waitDistinct(t, len(msgs)-len(inFlight)+1)
	time.Sleep(quiet)
	for _, m := range inFlight {
		if n := len(rec.deliveries(m.ID)); n != 0 {
			t.Errorf("message %s, acknowledged during shutdown: got %d redeliveries, want 0", m.ID, n)
		}
	}
	if got, want := rec.distinct(), len(msgs)-len(inFlight)+1; got != want {
		t.Errorf("new consumer: got %d distinct messages, want %d (the rest and the sentinel)", got, want)
	}
}

// testPublishFails: Publish, and PublishDelayed where the driver delays,
// refuse with a cancelled context and after Close.
func testPublishFails(t *testing.T, f Factory) {
	tests := []struct {
		name  string
		setup func(t *testing.T, b Backend) context.Context
		want  error
	}{
		{
			name: "cancelled context",
			setup: func(t *testing.T, b Backend) context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			},
			want: context.Canceled,
		},
		{
			name: "after close",
			setup: func(t *testing.T, b Backend) context.Context {
				if err := b.Close(); err != nil {
					t.Fatalf("Close: got %v, want nil", err)
				}
				return context.Background()
			},
			want: queue.ErrClosed,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := f.New(t)
			ctx := tc.setup(t, b)
			err := b.Publisher().Publish(ctx, newTopic(t), newMsg("k", 0))
			if !errors.Is(err, tc.want) {
				t.Errorf("Publish: got %v, want an error wrapping %v", err, tc.want)
			}
			if !f.Features.Delay {
				return
			}
			err = delayPublisher(t, b).PublishDelayed(ctx, newTopic(t), time.Second, newMsg("k", 1))
			if !errors.Is(err, tc.want) {
				t.Errorf("PublishDelayed: got %v, want an error wrapping %v", err, tc.want)
			}
		})
	}
}

// testPublishNothing: publishing no messages is a no-op, not an error.
func testPublishNothing(t *testing.T, f Factory) {
	b := f.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	if err := b.Publisher().Publish(ctx, newTopic(t)); err != nil {
		t.Errorf("Publish with no messages: got %v, want nil", err)
	}
}

// testConsumeAfterClose: Consume refuses to start after Close.
func testConsumeAfterClose(t *testing.T, f Factory) {
	b := f.New(t)
	c := b.NewConsumer(t, "late")
	if err := b.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	err := c.Consume(ctx, newTopic(t), func(context.Context, []queue.Message) error { return nil })
	if !errors.Is(err, queue.ErrClosed) {
		t.Errorf("Consume after Close: got %v, want an error wrapping %v", err, queue.ErrClosed)
	}
}

// testPing: a publisher that can ping its backend reports it reachable.
func testPing(t *testing.T, f Factory) {
	b := f.New(t)
	p, ok := b.Publisher().(queue.Pinger)
	if !ok {
		t.Skip("publisher does not implement queue.Pinger")
	}
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	if err := p.Ping(ctx); err != nil {
		t.Errorf("Ping: got %v, want nil", err)
	}
}
