package rocketmq_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
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

func wantQueue(key string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// TestPublishOutcome checks how Publish reports failures: a send the broker
// refused is a plain error (nothing stored); a send whose answer never came
// back within the caller's deadline is queue.ErrUnknown, stored or not.
func TestPublishOutcome(t *testing.T) {
	tests := []struct {
		name        string
		noTopic     bool
		fault       func(srv *rmqtest.Server)
		timeout     time.Duration
		wantUnknown bool
		wantStored  int // the warm-up message included
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
			testenv.Eventually(t, 3*time.Second, "the broker to settle", func() (bool, string) {
				n := len(srv.AllMessages(topic))
				return n == tc.wantStored, fmt.Sprintf("got %d stored, want %d", n, tc.wantStored)
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

// TestPoisonMessageGoesToDLQ: a batch refused more than MaxReconsumeTimes
// times leaves the queue for the group's dead-letter topic (the library
// sends it back to its store host), and the messages behind it flow again.
// The worker never lets it come to this (it gives up first, see
// worker.Options.MaxAttempts); this is the driver's last resort.
func TestPoisonMessageGoesToDLQ(t *testing.T) {
	t.Parallel()
	srv := startDouble(t)
	opts := testOptions(srv.Addr())
	opts.MaxReconsumeTimes = 2
	opts.BatchSize = 1
	q := mustNew(t, opts)
	topic := testenv.Topic(t)
	srv.CreateTopic(topic, 1)
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

// TestRebalanceHandover: when a second consumer joins, the first gives half
// the queues up and unlocks them, so the second consumes them within
// seconds — not after the old locks expire (60 s here, as on a broker) and
// its next 20 s rebalance — and no message the first acknowledged reaches
// the second.
func TestRebalanceHandover(t *testing.T) {
	t.Parallel()
	srv, err := rmqtest.Start(rmqtest.Options{})
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
