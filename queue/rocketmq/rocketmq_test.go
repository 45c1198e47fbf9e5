// The tests of this package use rocketmq-client-go, which has data races of
// its own (processQueue.takeMessages vs putMessage, SubscriptionData.Clone vs
// messageQueueChanged; see queue/rocketmq/README.md): they run without -race
// (.ci/run says so too). The broker double they run against is race-clean and
// has its own tests under -race in rmqtest. No goroutine-leak checks here
// either: the library leaves goroutines behind after Shutdown.
package rocketmq_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/queuetest"
	"github.com/flashsale/flashsale/queue/rocketmq"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

const (
	testBatchSize = 16
	testQueues    = 4
	// testLockTTL is the double's lock lifetime: a dead consumer's queues
	// are free again this long after its last renewal.
	testLockTTL = 3 * time.Second
)

// testLogger writes warnings and worse to stderr. It is not tied to a test:
// the library's logger is process-wide and outlives every test.
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// startDouble starts a broker double for one test.
func startDouble(t *testing.T) *rmqtest.Server {
	t.Helper()
	srv, err := rmqtest.Start(rmqtest.Options{LockTTL: testLockTTL})
	if err != nil {
		t.Fatalf("start broker double: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// testOptions keeps the suite fast: short redelivery waits, frequent lock
// renewal (well inside testLockTTL) and a consumer group of the test's own.
func testOptions(nameServer string) rocketmq.Options {
	return rocketmq.Options{
		NameServers:       []string{nameServer},
		ConsumerGroup:     testenv.UniqueName("g"),
		ProducerInstance:  "test",
		ConsumerInstance:  "test",
		BatchSize:         testBatchSize,
		SuspendTime:       20 * time.Millisecond,
		MaxReconsumeTimes: 1000,
		LockInterval:      time.Second,
		HandoverWait:      5 * time.Second,
		Logger:            testLogger(),
		LibraryLogLevel:   slog.LevelError,
	}
}

func mustNew(t *testing.T, opts rocketmq.Options) *rocketmq.Queue {
	t.Helper()
	testenv.SkipShort(t, "runs the RocketMQ client library against the broker double")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q, err := rocketmq.New(ctx, opts)
	if err != nil {
		t.Fatalf("rocketmq.New: %v", err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// backend adapts a Queue on its own double to the contract suite. Topics
// are created on the double before first use, as an operator creates them
// on a cluster (the double, like a production broker, does not create topics
// by itself here).
type backend struct {
	srv *rmqtest.Server
	q   *rocketmq.Queue
}

func newBackend(t *testing.T) *backend {
	srv := startDouble(t)
	return &backend{srv: srv, q: mustNew(t, testOptions(srv.Addr()))}
}

func (b *backend) Publisher() queue.Publisher { return topicPublisher{Queue: b.q, srv: b.srv} }

func (b *backend) NewConsumer(_ *testing.T, name string) queue.Consumer {
	return topicConsumer{c: b.q.Consumer(name), srv: b.srv}
}

func (b *backend) Close() error { return b.q.Close() }

// topicPublisher creates topics on first use.
type topicPublisher struct {
	*rocketmq.Queue
	srv *rmqtest.Server
}

func ensureTopic(srv *rmqtest.Server, topic string) {
	if srv.Queues(topic) == 0 {
		srv.CreateTopic(topic, testQueues)
	}
}

func (p topicPublisher) Publish(ctx context.Context, topic string, msgs ...queue.Message) error {
	ensureTopic(p.srv, topic)
	return p.Queue.Publish(ctx, topic, msgs...)
}

func (p topicPublisher) PublishDelayed(ctx context.Context, topic string, d time.Duration, msgs ...queue.Message) error {
	ensureTopic(p.srv, topic)
	return p.Queue.PublishDelayed(ctx, topic, d, msgs...)
}

type topicConsumer struct {
	c   *rocketmq.Consumer
	srv *rmqtest.Server
}

func (c topicConsumer) Consume(ctx context.Context, topic string, h queue.Handler) error {
	ensureTopic(c.srv, topic)
	return c.c.Consume(ctx, topic, h)
}

// TestContract runs the queue contract suite against the broker double. The
// dead-consumer subtest is skipped (the backend is no queuetest.Crasher):
// RocketMQ's orderly mode keeps a batch's failed attempts in the consumer's
// memory, so a batch taken over from a dead consumer starts again at Attempt
// 1, where the suite wants at least 2. cmd/flashsale's
// TestConsumerKilledMidBatch covers the takeover itself.
func TestContract(t *testing.T) {
	t.Parallel()
	queuetest.Run(t, queuetest.Factory{
		Features:  rocketmq.Features(),
		BatchSize: testBatchSize,
		New:       func(t *testing.T) queuetest.Backend { return newBackend(t) },
	})
}
