package queuetest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
)

// Bounds for every wait in the suite. Deliveries get generous time because
// takeover after a crash waits for a lease or visibility timeout; quiet is how
// long the suite watches for deliveries that must not happen.
const (
	deliveryTimeout = 20 * time.Second
	stopTimeout     = 10 * time.Second
	publishTimeout  = 10 * time.Second
	quiet           = 300 * time.Millisecond
)

// newTopic returns a topic of t's own, unique across runs and processes, so
// tests that share a broker or a Redis never see each other's messages. It
// keeps to [A-Za-z0-9_], which every driver accepts.
func newTopic(t *testing.T) string {
	name := t.Name()[strings.LastIndexByte(t.Name(), '/')+1:]
	name = strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' {
			return r
		}
		return '_'
	}, name)
	// A UniqueName, so that a driver's keys left in the test Redis fail
	// the package (testenv.Main); the driver's test harness deletes them.
	return testenv.UniqueName("qt_" + name[:min(len(name), 24)] + "_")
}

// newMsg returns the message with sequence number seq for key. IDs are unique
// within a test; bodies encode key and seq so a mix-up is visible.
func newMsg(key string, seq int) queue.Message {
	return queue.Message{
		ID:   fmt.Sprintf("%s-%05d", key, seq),
		Key:  key,
		Body: fmt.Appendf(nil, "body of %s #%d", key, seq),
	}
}

// seqOf returns the sequence number newMsg put in id.
func seqOf(id string) (int, error) {
	return strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
}

// newMsgs returns perKey messages for each of keys keys (k0, k1, …),
// interleaved: k0#0, k1#0, …, k0#1, …
func newMsgs(keys, perKey int) []queue.Message {
	out := make([]queue.Message, 0, keys*perKey)
	for seq := range perKey {
		for k := range keys {
			out = append(out, newMsg(fmt.Sprintf("k%d", k), seq))
		}
	}
	return out
}

func ids(msgs []queue.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// mustPublish publishes msgs or fails the test.
func mustPublish(t *testing.T, p queue.Publisher, topic string, msgs ...queue.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	if err := p.Publish(ctx, topic, msgs...); err != nil {
		t.Fatalf("publish %d messages: got %v, want nil", len(msgs), err)
	}
}

// waitUntil polls cond until it reports done or timeout passes; progress
// describes the state for the failure message.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() (done bool, progress string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, progress := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, progress)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recorder is a concurrency-safe log of every delivery a handler saw.
type recorder struct {
	mu       sync.Mutex
	byID     map[string][]queue.Message // every delivery, in arrival order
	arrived  map[string]arrival         // each message's first delivery
	acked    map[string]bool            // messages whose batch the handler acknowledged
	batches  int
	maxBatch int
}

func newRecorder() *recorder {
	return &recorder{byID: make(map[string][]queue.Message), arrived: make(map[string]arrival), acked: make(map[string]bool)}
}

func (r *recorder) record(msgs []queue.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.batches++
	r.maxBatch = max(r.maxBatch, len(msgs))
	for _, m := range msgs {
		if _, seen := r.byID[m.ID]; !seen {
			r.arrived[m.ID] = arrival{at: now, rank: len(r.arrived)}
		}
		r.byID[m.ID] = append(r.byID[m.ID], m)
	}
}

func (r *recorder) ack(msgs []queue.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.acked[m.ID] = true
	}
}

// handle records and acknowledges every batch.
func (r *recorder) handle(_ context.Context, msgs []queue.Message) error {
	r.record(msgs)
	r.ack(msgs)
	return nil
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID)
}

func (r *recorder) ackedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

func (r *recorder) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ds := range r.byID {
		n += len(ds)
	}
	return n
}

func (r *recorder) deliveries(id string) []queue.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.byID[id])
}

// arrival is a message's first delivery: when, and how many distinct
// messages arrived before it (which orders the messages of one batch).
type arrival struct {
	at   time.Time
	rank int
}

// arrival returns id's first delivery (the zero arrival if none).
func (r *recorder) arrival(id string) arrival {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.arrived[id]
}

func (r *recorder) snapshot() map[string][]queue.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]queue.Message, len(r.byID))
	for id, ds := range r.byID {
		out[id] = slices.Clone(ds)
	}
	return out
}

// waitDistinct waits until r has seen n distinct messages.
func (r *recorder) waitDistinct(t *testing.T, n int) {
	t.Helper()
	waitUntil(t, deliveryTimeout, fmt.Sprintf("%d distinct messages", n), func() (bool, string) {
		got := r.distinct()
		return got >= n, fmt.Sprintf("got %d, want %d", got, n)
	})
}

// sortedIDs returns the keys of m in order, for stable failure messages.
func sortedIDs[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// runner is one Consume call running in the background.
type runner struct {
	cancel  context.CancelFunc
	done    chan struct{}
	err     error // set before done is closed
	crashed atomic.Bool
}

// startConsumer runs c.Consume(topic, h) until the test ends (or stop). At
// cleanup it cancels the call and checks that Consume returns nil in time;
// register cleanups that unblock handlers after calling startConsumer, so
// they run first.
func startConsumer(t *testing.T, c queue.Consumer, topic string, h queue.Handler) *runner {
	t.Helper()
	return startRun(t, func(ctx context.Context) error { return c.Consume(ctx, topic, h) })
}

// startRun runs consume in the background, as startConsumer describes.
func startRun(t *testing.T, consume func(ctx context.Context) error) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = consume(ctx)
	}()
	t.Cleanup(func() {
		r.cancel()
		select {
		case <-r.done:
			if r.err != nil && !r.crashed.Load() {
				t.Errorf("Consume after cancel: got %v, want nil", r.err)
			}
		case <-time.After(stopTimeout):
			t.Errorf("Consume did not return within %v of cancel", stopTimeout)
		}
	})
	return r
}

// stop cancels the Consume call and returns its result, failing the test if
// it does not return in time.
func (r *runner) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

// wait returns Consume's result, failing the test if it does not return
// within stopTimeout.
func (r *runner) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(stopTimeout):
		t.Fatalf("Consume did not return within %v of cancel", stopTimeout)
		return nil
	}
}

// returned reports whether Consume has returned.
func (r *runner) returned() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}
