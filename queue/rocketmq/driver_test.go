package rocketmq_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/rocketmq"
	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

// consumeRecorder runs Consume in the background until the test ends and
// records what the handler saw.
type consumeRecorder struct {
	mu      sync.Mutex
	byID    map[string][]queue.Message
	batches int
	fail    func(queue.Message) bool // the handler refuses batches holding such a message
	failErr error                    // with this error; nil: a failure of its own
}

func startRecording(t *testing.T, c *rocketmq.Consumer, topic string, fail func(queue.Message) bool) *consumeRecorder {
	t.Helper()
	r := &consumeRecorder{byID: make(map[string][]queue.Message), fail: fail}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Consume(ctx, topic, r.handle) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Consume after cancel: got %v, want nil", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("Consume did not return within 15s of cancel")
		}
	})
	return r
}

func (r *consumeRecorder) handle(_ context.Context, msgs []queue.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches++
	for _, m := range msgs {
		r.byID[m.ID] = append(r.byID[m.ID], m)
	}
	for _, m := range msgs {
		if r.fail != nil && r.fail(m) {
			if r.failErr != nil {
				return r.failErr
			}
			return errors.New("refused")
		}
	}
	return nil
}

func (r *consumeRecorder) deliveries(id string) []queue.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]queue.Message(nil), r.byID[id]...)
}

func (r *consumeRecorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID)
}

func publish(t *testing.T, p queue.Publisher, topic string, msgs ...queue.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Publish(ctx, topic, msgs...); err != nil {
		t.Fatalf("publish %d messages: got %v, want nil", len(msgs), err)
	}
}

// TestPublishLayout checks what lands on the broker: the request id in
// KEYS, the key in SHARDING_KEY, one queue per key (FNV-1a, as every driver
// partitions), and a key's messages of one call stored consecutively.
func TestPublishLayout(t *testing.T) {
	t.Parallel()
	srv := startDouble(t)
	q := mustNew(t, testOptions(srv.Addr()))
	const topic = "layout"
	srv.CreateTopic(topic, 8)
	msgs := []queue.Message{
		{ID: "r1", Key: "campaign-a", Body: []byte("one")},
		{ID: "r2", Key: "campaign-a", Body: []byte{0, 1, 2, 255}},
		{ID: "r3", Key: "campaign-b", Body: []byte("three")},
		{ID: "r4", Key: "campaign-a", Body: []byte("four")},
	}
	publish(t, q, topic, msgs...)
	publish(t, q, topic, queue.Message{ID: "r5", Key: "campaign-b", Body: []byte("five")})

	byQueue := map[int][]string{}
	for qid := range 8 {
		for _, m := range srv.Messages(topic, qid) {
			byQueue[qid] = append(byQueue[qid], m.Keys())
			if want := wantQueue(m.Properties[remoting.PropShardingKey], 8); qid != want {
				t.Errorf("message %s with key %s: got queue %d, want %d", m.Keys(), m.Properties[remoting.PropShardingKey], qid, want)
			}
		}
	}
	for key, want := range map[string][]string{"campaign-a": {"r1", "r2", "r4"}, "campaign-b": {"r3", "r5"}} {
		if got := byQueue[wantQueue(key, 8)]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("queue of %s: got %v, want %v in publish order", key, got, want)
		}
	}
	if got := srv.Messages(topic, wantQueue("campaign-a", 8))[1].Body; string(got) != string([]byte{0, 1, 2, 255}) {
		t.Errorf("binary body: got %v, want it unchanged", got)
	}
	// r1 and r2 went as one batch: SEND_BATCH_MESSAGE, the rest one by one.
	if got := srv.Requests(remoting.SendBatchMessage); got != 1 {
		t.Errorf("batch sends: got %d, want 1", got)
	}
}

// TestPublishDelayedLayout: PublishDelayed rounds the delay up to a level,
// and the broker keeps the message in that level's queue of
// SCHEDULE_TOPIC_XXXX with its topic and key's queue in REAL_TOPIC and
// REAL_QID, then stores it there, without DELAY, when due.
func TestPublishDelayedLayout(t *testing.T) {
	t.Parallel()
	levels := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	srv, err := rmqtest.Start(rmqtest.Options{DelayLevels: levels})
	if err != nil {
		t.Fatalf("start double: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	opts := testOptions(srv.Addr())
	opts.DelayLevels = levels
	q := mustNew(t, opts)
	const topic = "delayed"
	srv.CreateTopic(topic, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := q.PublishDelayed(ctx, topic, 250*time.Millisecond, queue.Message{ID: "r1", Key: "campaign-a", Body: []byte("x")}); err != nil {
		t.Fatalf("PublishDelayed: %v", err)
	}
	realQueue := wantQueue("campaign-a", 8)
	sched := srv.Messages(rmqtest.ScheduleTopic, 2) // level 3, the first of at least 250ms
	if len(sched) != 1 || sched[0].Keys() != "r1" || sched[0].Properties[remoting.PropDelayLevel] != "3" ||
		sched[0].Properties[remoting.PropRealTopic] != topic || sched[0].Properties[remoting.PropRealQueueID] != fmt.Sprint(realQueue) {
		t.Fatalf("schedule queue of level 3: got %+v, want r1 with DELAY 3, REAL_TOPIC %s, REAL_QID %d", sched, topic, realQueue)
	}
	testenv.Eventually(t, 5*time.Second, "the delivery", func() (bool, string) {
		n := len(srv.Messages(topic, realQueue))
		return n == 1, fmt.Sprintf("got %d in queue %d", n, realQueue)
	})
	if m := srv.Messages(topic, realQueue)[0]; m.Keys() != "r1" || m.Properties[remoting.PropDelayLevel] != "" {
		t.Errorf("delivered: got %+v, want r1 without DELAY", m)
	}
}

func wantQueue(key string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// TestPublishOutcome checks how Publish reports failures: a send the broker
// refused is a plain error (nothing stored); a send whose answer never came
// back within the caller's deadline is queue.ErrUnknown, stored or not.
// Stored more than once, even: the library retries a send whose answer it
// has not had (Options.SendAttempts), and on a loaded machine its retries
// can reach the broker after the caller's deadline (seen once in CI: r1
// stored three times). The queue delivers at least once, and the worker
// decides each request once whatever its copies.
func TestPublishOutcome(t *testing.T) {
	tests := []struct {
		name        string
		noTopic     bool
		fault       func(srv *rmqtest.Server)
		timeout     time.Duration
		wantUnknown bool
		wantStored  int // the warm-up message included; with wantUnknown, at least
	}{
		{name: "broker refuses", fault: func(srv *rmqtest.Server) {
			srv.InjectFault(remoting.SendMessage, rmqtest.Fault{Code: remoting.SystemBusy, Remark: "busy"})
		}, timeout: 5 * time.Second, wantUnknown: false, wantStored: 1},
		{name: "answer lost", fault: func(srv *rmqtest.Server) {
			srv.InjectFault(remoting.SendMessage, rmqtest.Fault{Swallow: true})
		}, timeout: 500 * time.Millisecond, wantUnknown: true, wantStored: 2},
		{name: "broker slower than the deadline", fault: func(srv *rmqtest.Server) {
			srv.SetLatency(2 * time.Second)
		}, timeout: 300 * time.Millisecond, wantUnknown: true, wantStored: 2},
		{name: "connections dropped, broker gone", fault: func(srv *rmqtest.Server) {
			_ = srv.Close()
		}, timeout: 2 * time.Second, wantUnknown: true, wantStored: -1},
		{name: "topic missing", noTopic: true, timeout: 5 * time.Second, wantUnknown: false, wantStored: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := startDouble(t)
			q := mustNew(t, testOptions(srv.Addr()))
			const topic = "outcome"
			if !tc.noTopic {
				srv.CreateTopic(topic, 1)
				// A first send caches the route, so the fault hits the send.
				publish(t, q, topic, queue.Message{ID: "warm-up", Key: "k"})
			}
			if tc.fault != nil {
				tc.fault(srv)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			start := time.Now()
			err := q.Publish(ctx, topic, queue.Message{ID: "r1", Key: "k", Body: []byte("x")})
			if err == nil {
				t.Fatalf("Publish: got nil, want an error")
			}
			if took := time.Since(start); took > tc.timeout+time.Second {
				t.Errorf("Publish returned after %v, want within the %v deadline", took, tc.timeout)
			}
			if got := errors.Is(err, queue.ErrUnknown); got != tc.wantUnknown {
				t.Errorf("Publish: got %v (ErrUnknown %v), want ErrUnknown %v", err, got, tc.wantUnknown)
			}
			if tc.wantStored < 0 {
				return
			}
			most := tc.wantStored
			if tc.wantUnknown {
				most = 1 + rocketmq.DefaultSendAttempts // the warm-up, and r1 once per attempt
			}
			testenv.Eventually(t, 3*time.Second, "the broker to settle", func() (bool, string) {
				n := len(srv.AllMessages(topic))
				return n >= tc.wantStored && n <= most, fmt.Sprintf("got %d stored, want %d to %d", n, tc.wantStored, most)
			})
		})
	}
}

func TestPing(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, srv *rmqtest.Server, q *rocketmq.Queue)
		wantErr bool
	}{
		{name: "up", setup: func(*testing.T, *rmqtest.Server, *rocketmq.Queue) {}},
		{name: "topic in use", setup: func(t *testing.T, srv *rmqtest.Server, q *rocketmq.Queue) {
			srv.CreateTopic("used", 2)
			publish(t, q, "used", queue.Message{ID: "r", Key: "k"})
		}},
		{name: "topic in use deleted", wantErr: true, setup: func(t *testing.T, srv *rmqtest.Server, q *rocketmq.Queue) {
			srv.CreateTopic("used", 2)
			publish(t, q, "used", queue.Message{ID: "r", Key: "k"})
			if err := srv.Restart(false, 0); err != nil {
				t.Fatalf("restart: %v", err)
			}
		}},
		{name: "broker down", wantErr: true, setup: func(t *testing.T, srv *rmqtest.Server, q *rocketmq.Queue) {
			_ = srv.Close()
		}},
		{name: "broker too slow", wantErr: true, setup: func(t *testing.T, srv *rmqtest.Server, q *rocketmq.Queue) {
			srv.SetLatency(time.Second)
		}},
		{name: "broker fails requests", wantErr: true, setup: func(t *testing.T, srv *rmqtest.Server, q *rocketmq.Queue) {
			srv.CreateTopic("used", 2)
			publish(t, q, "used", queue.Message{ID: "r", Key: "k"})
			srv.InjectFault(remoting.GetMaxOffset, rmqtest.Fault{Code: remoting.ServiceNotAvailable})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := startDouble(t)
			opts := testOptions(srv.Addr())
			opts.ProbeTimeout = 300 * time.Millisecond
			q := mustNew(t, opts)
			tc.setup(t, srv, q)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := q.Ping(ctx); (err != nil) != tc.wantErr {
				t.Errorf("Ping: got %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

// startRetryCase starts a double and a queue that dead-letters a message
// after MaxReconsumeTimes 2, one message a batch, on a topic of one queue.
func startRetryCase(t *testing.T) (*rmqtest.Server, rocketmq.Options, *rocketmq.Queue, string) {
	t.Helper()
	srv := startDouble(t)
	opts := testOptions(srv.Addr())
	opts.MaxReconsumeTimes = 2
	opts.BatchSize = 1
	q := mustNew(t, opts)
	topic := testenv.Topic(t)
	srv.CreateTopic(topic, 1)
	return srv, opts, q, topic
}

// TestPoisonMessageGoesToDLQ: a batch refused more than MaxReconsumeTimes
// times leaves the queue for the group's dead-letter topic (the driver sends
// it back to its broker), and the messages behind it flow again.
// The worker never lets it come to this (it gives up first, see
// worker.Options.MaxAttempts); this is the driver's last resort.
func TestPoisonMessageGoesToDLQ(t *testing.T) {
	t.Parallel()
	srv, opts, q, topic := startRetryCase(t)
	rec := startRecording(t, q.Consumer("c"), topic, func(m queue.Message) bool { return m.ID == "poison" })
	publish(t, q, topic, queue.Message{ID: "poison", Key: "k"}, queue.Message{ID: "next", Key: "k"})

	testenv.Eventually(t, 20*time.Second, "the message behind the poison one", func() (bool, string) {
		return len(rec.deliveries("next")) > 0, fmt.Sprintf("poison delivered %d times", len(rec.deliveries("poison")))
	})
	ds := rec.deliveries("poison")
	if len(ds) != opts.MaxReconsumeTimes+2 {
		t.Errorf("poison message: got %d deliveries, want %d (the first and MaxReconsumeTimes+1 retries)", len(ds), opts.MaxReconsumeTimes+2)
	}
	for i, d := range ds {
		if d.Attempt != i+1 {
			t.Errorf("poison delivery %d: got Attempt %d, want %d", i+1, d.Attempt, i+1)
		}
	}
	dlq := srv.DLQ(opts.ConsumerGroup)
	if len(dlq) != 1 || dlq[0].Keys() != "poison" {
		t.Errorf("DLQ: got %d messages (%v), want the poison one", len(dlq), dlq)
	}
}

// TestHoldNeverDeadLetters: a batch its handler holds (queue.ErrHeld: a
// paused sale, say) for many more deliveries than MaxReconsumeTimes is not
// dead-lettered: the driver runs it again within the same delivery, so its
// Attempt does not grow, and once the hold ends it is handled and the
// messages behind it flow. (Before, a pause longer than MaxReconsumeTimes
// × SuspendTime sent the held requests to the dead-letter topic without a
// final result.)
func TestHoldNeverDeadLetters(t *testing.T) {
	t.Parallel()
	srv, opts, q, topic := startRetryCase(t)
	const holds = 10 // > MaxReconsumeTimes+2, the deliveries a failure gets
	var held atomic.Int32
	rec := startRecording(t, q.Consumer("c"), topic, func(m queue.Message) bool {
		return m.ID == "held" && held.Add(1) <= holds
	})
	rec.mu.Lock()
	rec.failErr = fmt.Errorf("campaign paused: %w", queue.ErrHeld)
	rec.mu.Unlock()
	publish(t, q, topic, queue.Message{ID: "held", Key: "k"}, queue.Message{ID: "next", Key: "k"})

	testenv.Eventually(t, 20*time.Second, "the message behind the held one", func() (bool, string) {
		return len(rec.deliveries("next")) > 0, fmt.Sprintf("held delivered %d times", len(rec.deliveries("held")))
	})
	ds := rec.deliveries("held")
	if len(ds) != holds+1 {
		t.Errorf("held message: got %d handler calls, want %d (held %d times, then handled)", len(ds), holds+1, holds)
	}
	for i, d := range ds {
		if d.Attempt != 1 {
			t.Errorf("held message, call %d: got Attempt %d, want 1 (a hold is not a failed delivery)", i+1, d.Attempt)
		}
	}
	if dlq := srv.DLQ(opts.ConsumerGroup); len(dlq) != 0 {
		t.Errorf("DLQ: got %d messages (%v), want none", len(dlq), dlq)
	}
}

// nameServers are the two kinds of name server whose route bodies the
// driver's own requests (Ping, the lock handover) must parse: 4.9.4's, which
// answers them in standard JSON, and older ones, which answer in fastjson's
// dialect whatever they are asked.
var nameServers = []struct {
	name   string
	legacy bool
}{
	{"4.9.4 name server", false},
	{"name server before 4.9.4", true},
}

// TestPingRouteDialects: Ping reads a topic's route from either kind of
// name server.
func TestPingRouteDialects(t *testing.T) {
	for _, ns := range nameServers {
		t.Run(ns.name, func(t *testing.T) {
			t.Parallel()
			srv, err := rmqtest.Start(rmqtest.Options{LegacyRoutes: ns.legacy})
			if err != nil {
				t.Fatalf("start double: %v", err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			q := mustNew(t, testOptions(srv.Addr()))
			srv.CreateTopic("used", 2)
			publish(t, q, "used", queue.Message{ID: "r", Key: "k"})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := q.Ping(ctx); err != nil {
				t.Errorf("Ping: got %v, want nil", err)
			}
		})
	}
}

// TestPoisonMessageSendBackRefused: a broker can refuse the send-back of a
// message past MaxReconsumeTimes (SYSTEM_ERROR, NO_PERMISSION,
// SUBSCRIPTION_GROUP_NOT_EXIST). v2.1.2 checks transport errors only and
// commits past such a message, which then is neither handled nor
// dead-lettered. The driver keeps it in its queue instead: it comes back,
// the messages behind it wait, and it reaches the dead-letter topic once
// the broker takes it.
func TestPoisonMessageSendBackRefused(t *testing.T) {
	t.Parallel()
	for _, code := range []int16{remoting.SystemError, remoting.NoPermission, remoting.SubscriptionGroupNotFind} {
		t.Run(fmt.Sprint("code ", code), func(t *testing.T) {
			t.Parallel()
			srv := startDouble(t)
			opts := testOptions(srv.Addr())
			opts.MaxReconsumeTimes = 1
			opts.BatchSize = 1
			q := mustNew(t, opts)
			topic := testenv.Topic(t)
			srv.CreateTopic(topic, 1)
			srv.InjectFault(remoting.ConsumerSendMsgBack, rmqtest.Fault{Code: code, Remark: "refused"})
			rec := startRecording(t, q.Consumer("c"), topic, func(m queue.Message) bool { return m.ID == "poison" })
			publish(t, q, topic, queue.Message{ID: "poison", Key: "k"}, queue.Message{ID: "next", Key: "k"})

			// The library would have sent it back after delivery
			// MaxReconsumeTimes+2; wait for two more refusals.
			refusals := func() int { return srv.Requests(remoting.ConsumerSendMsgBack) }
			testenv.Eventually(t, 20*time.Second, "the broker to refuse the send-back twice", func() (bool, string) {
				return refusals() >= 2 || len(rec.deliveries("next")) > 0,
					fmt.Sprintf("%d refusals, poison delivered %d times", refusals(), len(rec.deliveries("poison")))
			})
			if n := len(rec.deliveries("next")); n > 0 {
				t.Fatalf("the message behind the poison one was delivered (%d times) while the broker refused the poison one's send-back, "+
					"with %d in the DLQ: the poison message was committed past", n, len(srv.DLQ(opts.ConsumerGroup)))
			}
			if n, want := len(rec.deliveries("poison")), opts.MaxReconsumeTimes+3; n < want {
				t.Errorf("poison message: got %d deliveries, want at least %d while refused", n, want)
			}

			srv.ClearFaults()
			testenv.Eventually(t, 20*time.Second, "the message behind the poison one", func() (bool, string) {
				return len(rec.deliveries("next")) > 0, fmt.Sprintf("poison delivered %d times", len(rec.deliveries("poison")))
			})
			dlq := srv.DLQ(opts.ConsumerGroup)
			if len(dlq) != 1 || dlq[0].Keys() != "poison" {
				t.Errorf("DLQ: got %d messages (%v), want the poison one once", len(dlq), dlq)
			}
		})
	}
}

// TestTrimmedQueueKeepsOtherOffsets: a new group starts on a queue whose old
// messages were trimmed. The broker answers QUERY_NOT_FOUND for its offset,
// the library pulls from 0 and is moved up (PULL_OFFSET_MOVED), and v2.1.2
// then persists that one queue, which deletes every other queue's offset
// from its memory: from then on it no longer reports them. Here the broker
// crashes afterwards, losing the offsets it had not flushed. Nothing may be
// lost (the trimmed queue's remaining messages are consumed), and the
// batches acknowledged on the other queue may not come back: not when the
// library takes its queues up again after the crash, nor after the
// consumer stops (its offsets must be on the broker).
func TestTrimmedQueueKeepsOtherOffsets(t *testing.T) {
	t.Parallel()
	srv, err := rmqtest.Start(rmqtest.Options{LockTTL: testLockTTL, OffsetFlushInterval: time.Hour})
	if err != nil {
		t.Fatalf("start double: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	opts := testOptions(srv.Addr())
	q := mustNew(t, opts)
	topic := testenv.Topic(t)
	srv.CreateTopic(topic, 2)
	keyOf := func(queueID int) string { // a key of each queue
		for i := 0; ; i++ {
			if k := fmt.Sprintf("k%d", i); wantQueue(k, 2) == queueID {
				return k
			}
		}
	}
	const n, trimmed = 6, 4
	var old, kept []queue.Message
	for i := range n {
		old = append(old, queue.Message{ID: fmt.Sprint("old-", i), Key: keyOf(0)})
		kept = append(kept, queue.Message{ID: fmt.Sprint("kept-", i), Key: keyOf(1)})
	}
	publish(t, q, topic, old...)
	publish(t, q, topic, kept...)
	srv.Trim(topic, 0, trimmed)

	ctx, cancel := context.WithCancel(context.Background())
	rec := &consumeRecorder{byID: make(map[string][]queue.Message)}
	done := make(chan error, 1)
	go func() { done <- q.Consumer("c").Consume(ctx, topic, rec.handle) }()
	defer cancel()
	delivered := func(msgs []queue.Message) int {
		got := 0
		for _, m := range msgs {
			if len(rec.deliveries(m.ID)) > 0 {
				got++
			}
		}
		return got
	}
	testenv.Eventually(t, 20*time.Second, "the untrimmed queue's messages", func() (bool, string) {
		return delivered(kept) == n, fmt.Sprintf("got %d of %d", delivered(kept), n)
	})
	// The library persists the trimmed queue alone 10 s after
	// PULL_OFFSET_MOVED; that persist drops the other queue's offset.
	testenv.Eventually(t, 30*time.Second, "the library to persist the trimmed queue's new start", func() (bool, string) {
		off, ok := srv.CommittedOffset(opts.ConsumerGroup, topic, 0)
		return ok && off >= trimmed, fmt.Sprintf("queue 0's offset: %d (%v)", off, ok)
	})
	if err := srv.Crash(0); err != nil {
		t.Fatalf("crash: %v", err)
	}
	// The library takes the trimmed queue up again at a rebalance (every
	// 20 s), and after the crash the group re-registers at one.
	testenv.Eventually(t, 60*time.Second, "the trimmed queue's remaining messages", func() (bool, string) {
		return delivered(old[trimmed:]) == n-trimmed, fmt.Sprintf("got %d of %d", delivered(old[trimmed:]), n-trimmed)
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Consume: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Consume did not return within 20s of cancel")
	}
	for _, m := range old[:trimmed] {
		if d := len(rec.deliveries(m.ID)); d != 0 {
			t.Errorf("trimmed message %s: delivered %d times, want never", m.ID, d)
		}
	}
	for _, m := range kept {
		if d := len(rec.deliveries(m.ID)); d != 1 {
			t.Errorf("message %s: delivered %d times, want once: it was acknowledged before the crash", m.ID, d)
		}
	}
	for queueID := range 2 {
		if off, ok := srv.CommittedOffset(opts.ConsumerGroup, topic, queueID); !ok || off != n {
			t.Errorf("queue %d after the consumer stopped: got committed offset %d (%v), want %d: every message was acknowledged",
				queueID, off, ok, n)
		}
	}
}

// TestRebalanceHandover: when a second consumer joins, the first gives half
// the queues up and unlocks them, so the second consumes them within
// seconds — not after the old locks expire (60 s here, as on a broker) and
// its next 20 s rebalance — and no message the first acknowledged reaches
// the second. The handover's lock and unlock calls find the broker through
// a route of their own, from either kind of name server.
func TestRebalanceHandover(t *testing.T) {
	for _, ns := range nameServers {
		t.Run(ns.name, func(t *testing.T) {
			t.Parallel()
			testRebalanceHandover(t, rmqtest.Options{LegacyRoutes: ns.legacy})
		})
	}
}

func testRebalanceHandover(t *testing.T, opts rmqtest.Options) {
	srv, err := rmqtest.Start(opts)
	if err != nil {
		t.Fatalf("start double: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	q := mustNew(t, testOptions(srv.Addr()))
	topic := testenv.Topic(t)
	srv.CreateTopic(topic, testQueues)
	keys := make([]string, 0, testQueues)
	for i := 0; len(keys) < testQueues; i++ { // one key per queue
		if k := fmt.Sprintf("k%d", i); wantQueue(k, testQueues) == len(keys) {
			keys = append(keys, k)
		}
	}
	round := func(r int) []queue.Message {
		var out []queue.Message
		for _, k := range keys {
			out = append(out, queue.Message{ID: fmt.Sprintf("%s-%d", k, r), Key: k})
		}
		return out
	}

	first := startRecording(t, q.Consumer("first"), topic, nil)
	publish(t, q, topic, round(0)...)
	testenv.Eventually(t, 20*time.Second, "the first consumer to take every queue", func() (bool, string) {
		return first.distinct() == len(keys), fmt.Sprintf("got %d of %d", first.distinct(), len(keys))
	})

	// Keep traffic on every queue while the second consumer joins.
	stop := make(chan struct{})
	published := make(chan struct{})
	go func() {
		defer close(published)
		for r := 1; ; r++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = q.Publish(ctx, topic, round(r)...)
			cancel()
		}
	}()
	joined := time.Now()
	second := startRecording(t, q.Consumer("second"), topic, nil)
	testenv.Eventually(t, 15*time.Second, "the second consumer to consume its half of the keys", func() (bool, string) {
		n := distinctKeys(second)
		return n == len(keys)/2, fmt.Sprintf("second got %d keys", n)
	})
	took := time.Since(joined)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	<-published

	if took > 10*time.Second {
		t.Errorf("second consumer got its queues %v after joining, want well under the 20 s rebalance period", took)
	}
	first.mu.Lock()
	second.mu.Lock()
	defer first.mu.Unlock()
	defer second.mu.Unlock()
	for id := range second.byID {
		if _, twice := first.byID[id]; twice {
			t.Errorf("message %s, acknowledged by the first consumer: delivered to the second too", id)
		}
	}
	t.Logf("handover took %v", took)
}

func distinctKeys(r *consumeRecorder) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := map[string]bool{}
	for _, ds := range r.byID {
		keys[ds[0].Key] = true
	}
	return len(keys)
}

// TestConsumeWaitsForTopic: a worker that starts before its topic exists
// keeps trying and consumes once the topic is created.
func TestConsumeWaitsForTopic(t *testing.T) {
	t.Parallel()
	srv := startDouble(t)
	q := mustNew(t, testOptions(srv.Addr()))
	topic := testenv.Topic(t)
	rec := startRecording(t, q.Consumer("early"), topic, nil)
	time.Sleep(700 * time.Millisecond)
	srv.CreateTopic(topic, 2)
	publish(t, q, topic, queue.Message{ID: "r1", Key: "k"})
	testenv.Eventually(t, 20*time.Second, "the message", func() (bool, string) {
		return rec.distinct() == 1, fmt.Sprintf("got %d", rec.distinct())
	})
}

// TestBacklog: the backlog of a topic, queue by queue, is what the group
// has not acknowledged, with the age of the oldest message; reading it
// commits nothing (a consumer then gets every message), and once the
// consumer's acknowledgements are committed it is empty.
func TestBacklog(t *testing.T) {
	t.Parallel()
	srv := startDouble(t)
	q := mustNew(t, testOptions(srv.Addr()))
	topic := testenv.Topic(t)
	srv.CreateTopic(topic, 2)
	var msgs []queue.Message
	for i := range 5 {
		msgs = append(msgs, queue.Message{ID: fmt.Sprintf("m%d", i), Key: fmt.Sprintf("k%d", i)})
	}
	publish(t, q, topic, msgs...)

	read := func() (lag int64, oldest time.Duration, parts []int) {
		t.Helper()
		backlog, err := q.Backlog(t.Context(), topic)
		if err != nil {
			t.Fatalf("Backlog: %v", err)
		}
		for _, b := range backlog {
			lag += b.Lag
			oldest = max(oldest, b.OldestAge)
			parts = append(parts, b.Partition)
			if b.Pending != 0 || (b.Lag == 0) != (b.OldestAge == 0) {
				t.Errorf("partition %d: %+v, want no pending and an age exactly when there is lag", b.Partition, b)
			}
		}
		return lag, oldest, parts
	}
	for range 2 { // a second read finds the same: the first committed nothing
		if lag, oldest, parts := read(); lag != 5 || oldest <= 0 || !slices.Equal(parts, []int{0, 1}) {
			t.Fatalf("before consuming: lag %d, oldest %v, partitions %v; want 5, > 0, [0 1]", lag, oldest, parts)
		}
	}
	rec := startRecording(t, q.Consumer("c"), topic, nil)
	testenv.Eventually(t, 30*time.Second, "every message consumed and committed", func() (bool, string) {
		got := 0
		for _, m := range msgs {
			got += min(len(rec.deliveries(m.ID)), 1)
		}
		lag, _, _ := read()
		return got == len(msgs) && lag == 0, fmt.Sprintf("%d of %d consumed, lag %d", got, len(msgs), lag)
	})
}
