package redisstream

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/queuetest"
)

const testBatchSize = 16

// testOptions keeps the suite fast: short blocking reads, and a 1s lease so a
// crashed consumer's partitions are taken over within about a second.
func testOptions(t *testing.T) Options {
	return Options{
		Partitions:      4,
		BatchSize:       testBatchSize,
		Block:           100 * time.Millisecond,
		LeaseTTL:        time.Second,
		RedeliveryDelay: 10 * time.Millisecond,
		MoveInterval:    50 * time.Millisecond,
		Logger:          testLogger(t),
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// dialer returns fresh clients to one Redis server (or cluster), closed at
// cleanup.
type dialer func(t *testing.T) redis.UniversalClient

func realRedis(t *testing.T) redis.UniversalClient { return testenv.Redis(t) }

func clusterRedis(t *testing.T) redis.UniversalClient { return testenv.RedisCluster(t) }

func miniRedis(t *testing.T) dialer {
	m := miniredis.RunT(t)
	// Leases must expire in real time, as on a real server; by default
	// miniredis only expires keys on FastForward.
	m.ClockTTL(true)
	return func(t *testing.T) redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 64})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
}

// backend adapts a Queue to the contract suite. Crashable consumers get their
// own client; crashing closes it, which is what a killed process looks like
// from Redis: no more renewals, no acknowledgements, leases that expire.
type backend struct {
	q      *Queue
	opts   Options
	dial   dialer
	topics *topicLog
}

var _ queuetest.Crasher = (*backend)(nil)

func newBackend(t *testing.T, dial dialer) *backend {
	rdb := dial(t)
	q := New(rdb, testOptions(t))
	opts := q.opts // with defaults filled in
	b := &backend{q: q, opts: opts, dial: dial, topics: &topicLog{}}
	// Registered first, so it runs last: after consumers have stopped.
	t.Cleanup(func() { b.topics.deleteKeys(t, rdb, opts.Partitions) })
	t.Cleanup(func() { _ = b.q.Close() })
	return b
}

func (b *backend) Publisher() queue.Publisher {
	return loggingPublisher{Queue: b.q, topics: b.topics}
}

func (b *backend) NewConsumer(_ *testing.T, name string) queue.Consumer {
	return loggingConsumer{c: b.q.Consumer(name), topics: b.topics}
}

func (b *backend) Close() error { return b.q.Close() }

func (b *backend) NewCrashableConsumer(t *testing.T, name string) (queue.Consumer, func()) {
	rdb := b.dial(t)
	q := New(rdb, b.opts)
	return loggingConsumer{c: q.Consumer(name), topics: b.topics}, func() { _ = rdb.Close() }
}

// topicLog remembers the topics a test used, so their keys can be deleted
// from the shared Redis afterwards.
type topicLog struct {
	mu     sync.Mutex
	topics map[string]bool
}

func (l *topicLog) add(topic string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.topics == nil {
		l.topics = make(map[string]bool)
	}
	l.topics[topic] = true
}

func (l *topicLog) deleteKeys(t testing.TB, rdb redis.UniversalClient, partitions int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for topic := range l.topics {
		keys := []string{membersKey(topic)}
		for p := range partitions {
			keys = append(keys, streamKey(topic, p), leaseKey(topic, p), fenceKey(topic, p), delayedKey(topic, p), delaySeqKey(topic, p))
		}
		for _, k := range keys { // one by one: the keys live in different slots
			if err := rdb.Del(ctx, k).Err(); err != nil {
				t.Logf("delete %s: %v", k, err)
			}
		}
	}
}

type loggingPublisher struct {
	*Queue
	topics *topicLog
}

func (p loggingPublisher) Publish(ctx context.Context, topic string, msgs ...queue.Message) error {
	p.topics.add(topic)
	return p.Queue.Publish(ctx, topic, msgs...)
}

func (p loggingPublisher) PublishDelayed(ctx context.Context, topic string, delay time.Duration, msgs ...queue.Message) error {
	p.topics.add(topic)
	return p.Queue.PublishDelayed(ctx, topic, delay, msgs...)
}

type loggingConsumer struct {
	c      *Consumer
	topics *topicLog
}

func (c loggingConsumer) Consume(ctx context.Context, topic string, h queue.Handler) error {
	c.topics.add(topic)
	return c.c.Consume(ctx, topic, h)
}

func (c loggingConsumer) ConsumePipelined(ctx context.Context, topic string, h queue.PipelineHandler) error {
	c.topics.add(topic)
	return c.c.ConsumePipelined(ctx, topic, h)
}

// servers lists the Redis servers every test here runs on: the real one
// and the cluster from testenv, and a miniredis, which the embedded mode
// uses. On the cluster a topic's partitions live on different masters.
func servers() []struct {
	name string
	dial func(t *testing.T) dialer
} {
	return []struct {
		name string
		dial func(t *testing.T) dialer
	}{
		{"redis", func(t *testing.T) dialer { testenv.Redis(t); return realRedis }},
		{"cluster", func(t *testing.T) dialer { testenv.RedisCluster(t); return clusterRedis }},
		{"miniredis", miniRedis},
	}
}

func TestContract(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			queuetest.Run(t, queuetest.Factory{
				Features:  Features(),
				BatchSize: testBatchSize,
				New: func(t *testing.T) queuetest.Backend {
					return newBackend(t, srv.dial(t))
				},
			})
		})
	}
}

func mustPublish(t *testing.T, p queue.Publisher, topic string, msgs ...queue.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Publish(ctx, topic, msgs...); err != nil {
		t.Fatalf("publish: got %v, want nil", err)
	}
}

// consumeUntil runs c on topic until n messages were acknowledged, then stops
// it and returns what it saw.
func consumeUntil(t *testing.T, c queue.Consumer, topic string, n int) []queue.Message {
	t.Helper()
	var mu sync.Mutex
	var got []queue.Message
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(ctx, topic, func(_ context.Context, msgs []queue.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, msgs...)
			return nil
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		k := len(got)
		mu.Unlock()
		if k >= n {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("got %d messages within 10s, want %d", k, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Consume after cancel: got %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Consume did not return within 10s of cancel")
	}
	mu.Lock()
	defer mu.Unlock()
	return got
}

// TestLayout checks the keyspace other tools rely on: one stream per
// partition with fields id, key and body; a key always in the same partition;
// acknowledged entries deleted; leases, group consumers and registrations
// gone after a clean stop.
func TestLayout(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			dial := srv.dial(t)
			b := newBackend(t, dial)
			rdb := dial(t)
			ctx := context.Background()
			topic := testenv.Topic(t)
			msgs := []queue.Message{
				{ID: "r1", Key: "campaign-a", Body: []byte("one")},
				{ID: "r2", Key: "campaign-b", Body: []byte("two")},
				{ID: "r3", Key: "campaign-a", Body: []byte{0, 1, 2, 255}},
			}
			mustPublish(t, b.Publisher(), topic, msgs...)

			for _, m := range msgs {
				stream := streamKey(topic, queue.PartitionOf(m.Key, b.opts.Partitions))
				xs, err := rdb.XRange(ctx, stream, "-", "+").Result()
				if err != nil {
					t.Fatalf("XRANGE %s: %v", stream, err)
				}
				found := false
				for _, x := range xs {
					if x.Values[fieldID] == m.ID {
						found = true
						if x.Values[fieldKey] != m.Key || x.Values[fieldBody] != string(m.Body) {
							t.Errorf("entry %s: got %v, want key %q body %q", m.ID, x.Values, m.Key, m.Body)
						}
					}
				}
				if !found {
					t.Errorf("message %s: got no entry in %s, want one", m.ID, stream)
				}
			}

			got := consumeUntil(t, b.NewConsumer(t, "c"), topic, len(msgs))
			byID := make(map[string]queue.Message)
			for _, m := range got {
				byID[m.ID] = m
			}
			for _, m := range msgs {
				g := byID[m.ID]
				if g.Key != m.Key || string(g.Body) != string(m.Body) || g.Attempt != 1 {
					t.Errorf("message %s: got key %q body %q attempt %d, want key %q body %q attempt 1",
						m.ID, g.Key, g.Body, g.Attempt, m.Key, m.Body)
				}
			}

			for p := range b.opts.Partitions {
				stream := streamKey(topic, p)
				if n, err := rdb.XLen(ctx, stream).Result(); err != nil || n != 0 {
					t.Errorf("XLEN %s after acknowledging everything: got %d (err %v), want 0", stream, n, err)
				}
				if n, err := rdb.Exists(ctx, leaseKey(topic, p)).Result(); err != nil || n != 0 {
					t.Errorf("lease of partition %d after a clean stop: got %d keys (err %v), want 0", p, n, err)
				}
				consumers, err := rdb.XInfoConsumers(ctx, stream, b.opts.Group).Result()
				// A partition that got no message may not have been reached by
				// its runner before the stop: no stream then means no consumers.
				if err != nil && strings.Contains(err.Error(), "no such key") {
					err = nil
				}
				if err != nil {
					t.Errorf("XINFO CONSUMERS %s: %v", stream, err)
				}
				if len(consumers) != 0 {
					t.Errorf("group consumers on %s after a clean stop: got %d, want 0", stream, len(consumers))
				}
			}
			if n, err := rdb.ZCard(ctx, membersKey(topic)).Result(); err != nil || n != 0 {
				t.Errorf("registered consumers after a clean stop: got %d (err %v), want 0", n, err)
			}
		})
	}
}

// TestPublishInvalidTopic checks that names which would break the keys' hash
// tags are refused.
func TestPublishInvalidTopic(t *testing.T) {
	q := New(miniRedis(t)(t), Options{})
	for _, topic := range []string{"", "a{b", "a}b"} {
		t.Run(fmt.Sprintf("%q", topic), func(t *testing.T) {
			err := q.Publish(context.Background(), topic, queue.Message{ID: "x"})
			if err == nil {
				t.Errorf("Publish to %q: got nil, want an error", topic)
			}
			err = q.Consumer("c").Consume(context.Background(), topic, func(context.Context, []queue.Message) error { return nil })
			if err == nil {
				t.Errorf("Consume of %q: got nil, want an error", topic)
			}
		})
	}
}
