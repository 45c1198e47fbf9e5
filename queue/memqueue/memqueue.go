// Package memqueue is an in-process queue driver for tests and the embedded
// mode. It keeps the semantics of the real drivers: delivery is at least once,
// a topic is split into partitions by message key, and each partition has at
// most one batch in its handler call across all consumers of the topic (and,
// pipelined, one more finishing ahead of it), so messages with one key are
// handled in publish order and never concurrently. Messages published with a
// delay wait in the topic until due and then join their partitions in due
// order. Nothing survives the process.
package memqueue

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/flashsale/flashsale/queue"
)

// Defaults used for zero Options fields.
const (
	DefaultPartitions      = 8
	DefaultBatchSize       = 128
	DefaultRedeliveryDelay = 50 * time.Millisecond
)

// Options configures a Queue. Zero fields take the defaults.
type Options struct {
	// Partitions is the number of partitions per topic; a message's key is
	// hashed (FNV-1a) to one of them. Default 8.
	Partitions int
	// BatchSize is the largest batch handed to a handler. Default 128.
	BatchSize int
	// RedeliveryDelay is how long a failed batch waits before it is delivered
	// again; it doubles with each consecutive failure of the same partition.
	// Default 50ms.
	RedeliveryDelay time.Duration
	// Logger receives handler failures. Nil discards.
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Partitions <= 0 {
		o.Partitions = DefaultPartitions
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.RedeliveryDelay <= 0 {
		o.RedeliveryDelay = DefaultRedeliveryDelay
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}

// Queue is an in-memory set of topics. It is a queue.Publisher and makes
// Consumers; all methods are safe for concurrent use.
type Queue struct {
	opts Options

	mu     sync.Mutex
	topics map[string]*topic
	closed bool
	done   chan struct{} // closed by Close
	active sync.WaitGroup
}

var (
	_ queue.Publisher        = (*Queue)(nil)
	_ queue.DelayPublisher   = (*Queue)(nil)
	_ queue.Pinger           = (*Queue)(nil)
	_ queue.Consumer         = (*Consumer)(nil)
	_ queue.PipelineConsumer = (*Consumer)(nil)
)

// New returns an empty Queue.
func New(opts Options) *Queue {
	return &Queue{
		opts:   opts.withDefaults(),
		topics: make(map[string]*topic),
		done:   make(chan struct{}),
	}
}

// Features reports what memqueue guarantees: per-key order, delayed delivery
// and pipelining, but nothing survives the process.
func Features() queue.Features {
	return queue.Features{PerKeyOrder: true, Persistent: false, Delay: true, Pipeline: true}
}

// Publish appends msgs to their partitions of topic. It fails with
// queue.ErrClosed after Close and with the context's error if ctx is done; in
// both cases nothing is stored.
func (q *Queue) Publish(ctx context.Context, topicName string, msgs ...queue.Message) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish %s: %w", topicName, err)
	}
	tp, err := q.topic(topicName, false)
	if err != nil {
		return fmt.Errorf("publish %s: %w", topicName, err)
	}
	tp.publish(msgs)
	return nil
}

// PublishDelayed stores msgs in topic until delay has passed; then they join
// their partitions, after the messages that became due or were published
// before them. delay <= 0 is Publish. It fails as Publish does.
func (q *Queue) PublishDelayed(ctx context.Context, topicName string, delay time.Duration, msgs ...queue.Message) error {
	if delay <= 0 {
		return q.Publish(ctx, topicName, msgs...)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish %s: %w", topicName, err)
	}
	tp, err := q.topic(topicName, false)
	if err != nil {
		return fmt.Errorf("publish %s: %w", topicName, err)
	}
	// The monotonic clock: a wall-clock step cannot make a message early.
	tp.publishDelayed(msgs, time.Now().Add(delay))
	return nil
}

// Ping always succeeds: there is no backend to reach.
func (q *Queue) Ping(context.Context) error { return nil }

// Close makes later Publish and Consume calls fail with queue.ErrClosed, stops
// running Consume calls as if their contexts were cancelled and waits for them
// to return. Undelivered messages, delayed ones included, are dropped with the
// Queue. Close must not be called from a handler.
func (q *Queue) Close() error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.done)
	}
	q.mu.Unlock()
	q.active.Wait()
	return nil
}

// Consumer returns a consumer of q. The name only labels log lines.
func (q *Queue) Consumer(name string) *Consumer {
	return &Consumer{q: q, name: name, crashed: make(chan struct{})}
}

// topic returns the named topic, creating it on first use. With consume set
// it also counts a Consume call so Close can wait for it; counting under the
// same lock as the closed check keeps Add from racing Close's Wait.
func (q *Queue) topic(name string, consume bool) (*topic, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, queue.ErrClosed
	}
	tp, ok := q.topics[name]
	if !ok {
		tp = newTopic(q.opts)
		q.topics[name] = tp
	}
	if consume {
		q.active.Add(1)
	}
	return tp, nil
}
