package queuetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/queue"
)

// The pipeline tests run on every driver through queue.ConsumePipelined: a
// driver without Features.Pipeline runs both steps in one handler call and
// must keep the same promises, short of the overlap.

// startPipelined runs queue.ConsumePipelined(c, topic, h) like startConsumer.
func startPipelined(t *testing.T, c queue.Consumer, topic string, h queue.PipelineHandler) *runner {
	t.Helper()
	return startRun(t, func(ctx context.Context) error { return queue.ConsumePipelined(ctx, c, topic, h) })
}

// keyRun is one key's messages in a batch: seqs from..to-1, contiguous.
type keyRun struct{ from, to int }

// runsOf splits batch by key; a gap or a reordering within a key is
// reported through violate.
func runsOf(batch []queue.Message, violate func(string, ...any)) map[string]keyRun {
	out := make(map[string]keyRun)
	for _, m := range batch {
		seq, err := seqOf(m.ID)
		if err != nil {
			violate("message %q: cannot parse sequence: %v", m.ID, err)
			continue
		}
		r, ok := out[m.Key]
		switch {
		case !ok:
			r = keyRun{from: seq, to: seq + 1}
		case seq != r.to:
			violate("key %s: batch has seq %d after %d, want %d", m.Key, seq, r.to-1, r.to)
			r.to = seq + 1
		default:
			r.to++
		}
		out[m.Key] = r
	}
	return out
}

// testPipelineOrder: with three consumers and failures in both steps, each
// key's batches are decided one at a time and acknowledged in publish order,
// exactly once each; a batch starts where the last decided one ended or at
// the first unacknowledged message (a redelivery); a Finish runs only after
// the batches ahead were acknowledged, and never while its messages are in a
// first step again.
func testPipelineOrder(t *testing.T, f Factory) {
	if !f.Features.PerKeyOrder {
		t.Skip("driver does not promise per-key order (Features.PerKeyOrder is false)")
	}
	b := f.New(t)
	topic := newTopic(t)
	const keys, perKey, consumers = 4, 80, 3

	type keyState struct {
		acked     int // first unacknowledged seq
		decided   int // where the next batch continues after a decided one
		deciding  int // first steps running
		finishing int // Finish steps running
		finRun    keyRun
	}
	var (
		mu         sync.Mutex
		state      = make(map[string]*keyState)
		ackedOrder = make(map[string][]int) // seqs in the order Finish acknowledged them
		violations []string
		firstCalls atomic.Int64
		finCalls   atomic.Int64
	)
	for k := range keys {
		state[fmt.Sprintf("k%d", k)] = &keyState{}
	}
	violate := func(format string, args ...any) {
		if len(violations) < 20 {
			violations = append(violations, fmt.Sprintf(format, args...))
		}
	}

	h := func(_ context.Context, batch []queue.Message) (queue.Finish, error) {
		mu.Lock()
		runs := runsOf(batch, violate)
		for key, r := range runs {
			s := state[key]
			if s == nil {
				violate("got unknown key %q", key)
				continue
			}
			s.deciding++
			if s.deciding > 1 {
				violate("key %s: got %d first steps at once, want 1", key, s.deciding)
			}
			if r.from != s.acked && r.from != s.decided {
				violate("key %s: batch starts at seq %d, want %d (after the last decided batch) or %d (the first unacknowledged)",
					key, r.from, s.decided, s.acked)
			}
			if s.finishing > 0 && r.from < s.finRun.to && s.finRun.from < r.to {
				violate("key %s: seqs %d-%d in a first step while a Finish of %d-%d runs", key, r.from, r.to-1, s.finRun.from, s.finRun.to-1)
			}
		}
		mu.Unlock()

		time.Sleep(time.Millisecond) // widen the window in which overlaps would show
		fail := firstCalls.Add(1)%7 == 0

		mu.Lock()
		defer mu.Unlock()
		for key, r := range runs {
			if s := state[key]; s != nil {
				s.deciding--
				if !fail {
					s.decided = r.to
				}
			}
		}
		if fail {
			return nil, errHandler
		}
		return func(context.Context) error {
			mu.Lock()
			for key, r := range runs {
				s := state[key]
				s.finishing++
				s.finRun = r
				if s.finishing > 1 {
					violate("key %s: got %d Finish steps at once, want 1", key, s.finishing)
				}
				if r.from != s.acked {
					violate("key %s: Finish of seqs %d-%d runs while %d is unacknowledged", key, r.from, r.to-1, s.acked)
				}
			}
			mu.Unlock()

			time.Sleep(time.Millisecond)
			fail := finCalls.Add(1)%5 == 0

			mu.Lock()
			defer mu.Unlock()
			for key, r := range runs {
				s := state[key]
				s.finishing--
				if fail {
					continue
				}
				s.acked = r.to
				for seq := r.from; seq < r.to; seq++ {
					ackedOrder[key] = append(ackedOrder[key], seq)
				}
			}
			if fail {
				return errHandler
			}
			return nil
		}, nil
	}
	for i := range consumers {
		startPipelined(t, b.NewConsumer(t, fmt.Sprintf("c%d", i)), topic, h)
	}
	mustPublish(t, b.Publisher(), topic, newMsgs(keys, perKey)...)

	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, v := range violations {
			t.Error(v)
		}
	}()
	waitUntil(t, deliveryTimeout, "every key acknowledged", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		done := 0
		for _, s := range state {
			if s.acked >= perKey {
				done++
			}
		}
		return done == keys, fmt.Sprintf("got %d of %d keys done", done, keys)
	})
	time.Sleep(quiet) // a stray redelivery would show up here
	mu.Lock()
	defer mu.Unlock()
	for key, seqs := range ackedOrder {
		for i, seq := range seqs {
			if seq != i {
				t.Errorf("key %s: acknowledgement %d was seq %d, want %d (each once, in order)", key, i, seq, i)
				break
			}
		}
		if len(seqs) != perKey {
			t.Errorf("key %s: got %d acknowledged messages, want %d", key, len(seqs), perKey)
		}
	}
	if n := finCalls.Load(); n < 5 {
		t.Errorf("got %d Finish calls, want >= 5 so that one failed", n)
	}
}

// testPipelineOverlaps: a pipelining driver starts a partition's next batch
// while the previous batch's Finish runs, and still finishes both.
func testPipelineOverlaps(t *testing.T, f Factory) {
	if !f.Features.Pipeline {
		t.Skip("driver does not pipeline (Features.Pipeline is false)")
	}
	b := f.New(t)
	topic := newTopic(t)
	msgs := newMsgs(1, 3*f.BatchSize) // one key: one partition, several batches
	mustPublish(t, b.Publisher(), topic, msgs...)

	rec := newRecorder()
	secondStarted := make(chan struct{})
	var calls atomic.Int32
	var overlapped atomic.Bool
	h := func(_ context.Context, batch []queue.Message) (queue.Finish, error) {
		rec.record(batch)
		n := calls.Add(1)
		if n == 2 {
			close(secondStarted)
		}
		return func(context.Context) error {
			if n == 1 {
				select {
				case <-secondStarted:
					overlapped.Store(true)
				case <-time.After(deliveryTimeout / 4):
				}
			}
			rec.ack(batch)
			return nil
		}, nil
	}
	startPipelined(t, b.NewConsumer(t, "c"), topic, h)
	waitUntil(t, deliveryTimeout, "every message acknowledged", func() (bool, string) {
		n := rec.ackedCount()
		return n == len(msgs), fmt.Sprintf("got %d acknowledged, want %d", n, len(msgs))
	})
	if !overlapped.Load() {
		t.Errorf("the second batch's first step did not start while the first batch's Finish ran, want it to")
	}
	if got := rec.total(); got != len(msgs) {
		t.Errorf("got %d deliveries, want %d (each message once)", got, len(msgs))
	}
}

// testPipelineShutdown: after ctx is cancelled, Consume waits for a running
// Finish, and for the Finish of a batch decided behind it, acknowledges both
// and starts nothing new.
func testPipelineShutdown(t *testing.T, f Factory) {
	b := f.New(t)
	topic := newTopic(t)
	msgs := newMsgs(1, 4*f.BatchSize)
	mustPublish(t, b.Publisher(), topic, msgs...)

	finishing := make(chan struct{})
	release := make(chan struct{})
	var cancelled atomic.Bool
	var callsAfterCancel atomic.Int32
	var calls atomic.Int32
	var mu sync.Mutex
	var finished []queue.Message // acknowledged batches' messages
	h := func(_ context.Context, batch []queue.Message) (queue.Finish, error) {
		if cancelled.Load() {
			callsAfterCancel.Add(1)
		}
		n := calls.Add(1)
		return func(context.Context) error {
			if n == 1 {
				close(finishing)
				<-release
			}
			mu.Lock()
			finished = append(finished, batch...)
			mu.Unlock()
			return nil
		}, nil
	}
	r := startPipelined(t, b.NewConsumer(t, "c"), topic, h)
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	select {
	case <-finishing:
	case <-time.After(deliveryTimeout):
		t.Fatalf("got no Finish within %v, want one", deliveryTimeout)
	}
	time.Sleep(quiet) // a pipelining driver decides the next batch meanwhile
	cancelled.Store(true)
	r.cancel()
	time.Sleep(quiet)
	if r.returned() {
		t.Fatalf("Consume returned while a Finish was still running, want it to wait")
	}
	releaseOnce()
	if err := r.wait(t); err != nil {
		t.Errorf("Consume after cancel: got %v, want nil", err)
	}
	if n := callsAfterCancel.Load(); n != 0 {
		t.Errorf("got %d first steps started after cancel, want 0", n)
	}
	mu.Lock()
	done := len(finished)
	mu.Unlock()
	if int(calls.Load()) > 1 && done <= f.BatchSize && f.Features.Pipeline {
		t.Errorf("got %d messages finished from %d decided batches, want the decided batch behind the blocked one finished too", done, calls.Load())
	}

	// What was finished was acknowledged: a new consumer gets exactly the rest.
	rec := newRecorder()
	startConsumer(t, b.NewConsumer(t, "next"), topic, rec.handle)
	rec.waitDistinct(t, len(msgs)-done)
	time.Sleep(quiet)
	mu.Lock()
	defer mu.Unlock()
	for _, m := range finished {
		if n := len(rec.deliveries(m.ID)); n != 0 {
			t.Errorf("message %s, finished during shutdown: got %d redeliveries, want 0", m.ID, n)
		}
	}
	if got := rec.distinct(); got != len(msgs)-done {
		t.Errorf("new consumer: got %d distinct messages, want %d", got, len(msgs)-done)
	}
}

// testPipelineDeadConsumer: a consumer that dies with a Finish stuck and the
// next batch decided leaves both batches to another consumer.
func testPipelineDeadConsumer(t *testing.T, f Factory) {
	b := f.New(t)
	cr, ok := b.(Crasher)
	if !ok {
		t.Skip("backend does not implement queuetest.Crasher")
	}
	topic := newTopic(t)
	msgs := newMsgs(1, 3*f.BatchSize)
	mustPublish(t, b.Publisher(), topic, msgs...)

	dead := newRecorder()
	release := make(chan struct{})
	a, crash := cr.NewCrashableConsumer(t, "dying")
	ra := startPipelined(t, a, topic, func(_ context.Context, batch []queue.Message) (queue.Finish, error) {
		dead.record(batch)
		return func(context.Context) error {
			<-release // stuck until the test ends, like a hung process
			return nil
		}, nil
	})
	t.Cleanup(sync.OnceFunc(func() { close(release) }))
	waitUntil(t, deliveryTimeout, "the dying consumer to decide a batch", func() (bool, string) {
		n := dead.distinct()
		return n > 0, fmt.Sprintf("got %d messages", n)
	})
	time.Sleep(quiet) // a pipelining driver decides the next batch meanwhile
	ra.crashed.Store(true)
	crash()

	rec := newRecorder()
	startPipelined(t, b.NewConsumer(t, "survivor"), topic, queue.OneStep(rec.handle))
	rec.waitDistinct(t, len(msgs))
	for id := range dead.snapshot() {
		ds := rec.deliveries(id)
		if len(ds) == 0 {
			t.Errorf("message %s decided by the dead consumer: got no redelivery, want one", id)
			continue
		}
		if ds[0].Attempt < 2 {
			t.Errorf("message %s decided by the dead consumer: got Attempt %d on redelivery, want >= 2", id, ds[0].Attempt)
		}
	}
}
