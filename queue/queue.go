// Package queue is the transport contract between the gateway (publisher) and
// the workers (consumers). Drivers live in subpackages (memqueue, redisstream,
// rocketmq) and all pass the same contract suite in queuetest.
//
// Delivery is at least once: a handler that returns nil acknowledges its whole
// batch; an error (or a consumer that dies mid-batch) makes the batch come
// back, possibly to another consumer. Consumers must therefore be idempotent
// per Message.ID. What a handler's result does to its batch (ack, redeliver,
// hold), to its messages' Attempt, to the wait before the redelivery and to
// the log is one policy, in policy.go, that every driver applies.
package queue

import (
	"context"
	"errors"
	"hash/fnv"
	"time"
)

// Message is one unit on the queue.
type Message struct {
	// ID is the idempotency key (the purchase request id).
	ID string
	// Key orders messages: messages with the same key are delivered in
	// publish order and never handled concurrently (the campaign id).
	Key string
	// Body is opaque to the queue.
	Body []byte
	// Attempt counts deliveries of this message, starting at 1. Drivers that
	// cannot count exactly report at least 1 and never decrease it.
	Attempt int
}

// Publisher puts messages on a topic.
type Publisher interface {
	// Publish stores every message durably (as far as the driver is durable)
	// before it returns nil. On error none or some may have been stored; the
	// caller must treat the outcome as unknown only if it returns ErrUnknown.
	Publish(ctx context.Context, topic string, msgs ...Message) error
}

// Handler handles a batch of messages that share a partition, in order. It
// returns nil to acknowledge the whole batch or an error to have it
// redelivered; an error wrapping ErrHeld holds it instead (Classify).
type Handler func(ctx context.Context, msgs []Message) error

// ErrHeld wraps a handler's error when the batch is held rather than
// failed: nothing is wrong with its messages, but the consumer cannot take
// them until something outside the queue changes. A held batch is
// redelivered for as long as the hold lasts, each message with the Attempt
// it had: a hold is not a failed delivery, so a driver that gives failing
// messages up after some deliveries (a dead-letter topic) never gives a
// held one up.
var ErrHeld = errors.New("batch held")

// Consumer delivers a topic's messages to a handler.
type Consumer interface {
	// Consume blocks, handing batches to h, until ctx is cancelled or a fatal
	// error occurs. After cancellation it lets the batch in flight finish (its
	// context is not cancelled) and returns nil; unacknowledged messages are
	// redelivered later, to this or another consumer.
	Consume(ctx context.Context, topic string, h Handler) error
}

// Finish is the second step of a batch handled by a PipelineHandler. It
// returns nil to acknowledge the batch or an error to have it redelivered
// or, wrapping ErrHeld, held, as a Handler does.
type Finish func(ctx context.Context) error

// PipelineHandler handles a batch in two steps, so that a partition's next
// batch can start while this one completes (a worker deducts the next batch
// in Redis while it inserts this one's orders in MySQL).
//
// The first step is the call itself, under the rules of a Handler: one batch
// of a partition at a time, in order. It returns an error to have the batch
// redelivered, or the batch's Finish (nil when there is nothing left to do:
// the batch is acknowledged at once). The consumer runs each Finish after
// the previous batch of the partition was acknowledged, while the partition's
// next batch may already be in its first step; so at most two batches of a
// partition are in flight, and a partition's acknowledgements stay in order.
//
// When a Finish fails, that batch and every later batch of the partition are
// redelivered, in order, starting with it; no later batch's Finish runs
// before its redelivered Finish succeeds. A later batch's first step may have
// run meanwhile (its Finish is then dropped, not run), so it runs again: the
// first step must be idempotent per Message.ID, as every handler must.
type PipelineHandler func(ctx context.Context, msgs []Message) (Finish, error)

// PipelineConsumer is implemented by consumers that run a batch's Finish
// behind the next batch's first step (Features.Pipeline). Cancellation and
// shutdown are as for Consume: batches in flight run both steps to the end.
//
// Each pipelining driver implements this itself rather than through one
// pipeliner above the drivers, because undoing a failed Finish is the
// driver's own business: memqueue keeps a partition's batches in flight as
// prefixes of its message list, under the lock through which every consumer
// takes batches, while redisstream leaves the redelivery to the group's
// pending entries and its take-over path. A shared pipeliner would need both
// rebuilt around a read, acknowledge and restart interface, and would not be
// simpler. What a step's result means for the batch, its attempts, the
// back-off and the log is the shared policy (Settle) all the same.
type PipelineConsumer interface {
	ConsumePipelined(ctx context.Context, topic string, h PipelineHandler) error
}

// ConsumePipelined runs h on c, pipelined if c is a PipelineConsumer and
// otherwise with both steps in one handler call.
func ConsumePipelined(ctx context.Context, c Consumer, topic string, h PipelineHandler) error {
	if pc, ok := c.(PipelineConsumer); ok {
		return pc.ConsumePipelined(ctx, topic, h)
	}
	return c.Consume(ctx, topic, Serial(h))
}

// Serial is h as a Handler: each call runs the first step and then the
// Finish.
func Serial(h PipelineHandler) Handler {
	return func(ctx context.Context, msgs []Message) error {
		finish, err := h(ctx, msgs)
		if err != nil || finish == nil {
			return err
		}
		return finish(ctx)
	}
}

// OneStep is h as a PipelineHandler whose batches need no Finish.
func OneStep(h Handler) PipelineHandler {
	return func(ctx context.Context, msgs []Message) (Finish, error) {
		return nil, h(ctx, msgs)
	}
}

// DelayPublisher is implemented by publishers that can hold messages back
// (Features.Delay). It is Publish with a delay: the messages are stored at
// once and delivered no earlier than delay from now, possibly later (drivers
// round up to the delays their backend supports, or move due messages on a
// timer). A delayed message joins its key's order when it becomes due, not
// when it was published; messages of one key published one after the other
// with the same delay keep their order. delay <= 0 is Publish.
type DelayPublisher interface {
	PublishDelayed(ctx context.Context, topic string, delay time.Duration, msgs ...Message) error
}

// Pinger reports whether a driver can reach its backend (readiness).
type Pinger interface {
	Ping(ctx context.Context) error
}

// Partition ownership events, as a driver whose consumers own partitions
// (redisstream's leases) reports them to a PartitionObserver.
const (
	// PartitionAcquired: a consumer took the partition.
	PartitionAcquired = "acquired"
	// PartitionReleased: it gave the partition up (a stop, or a share
	// handed over for balance), so another consumer can take it at once.
	PartitionReleased = "released"
	// PartitionLost: it stopped serving the partition without giving it
	// up: its lease had expired or been taken, or could not be freed.
	PartitionLost = "lost"
)

// PartitionObserver learns which partitions a process's consumers own, for
// metrics. PartitionEvent must be quick and safe for concurrent use.
type PartitionObserver interface {
	PartitionEvent(topic string, partition int, event string)
}

// Backlog is what waits in one partition of a topic.
type Backlog struct {
	Partition int
	// Lag counts the messages not handed to any consumer yet; Pending those
	// handed to one and not acknowledged.
	Lag, Pending int64
	// OldestAge is the age of the oldest unacknowledged message, 0 when
	// there is none: how long the longest-waiting request has waited.
	OldestAge time.Duration
}

// BacklogReader is implemented by drivers that can tell a topic's backlog
// per partition (metrics).
type BacklogReader interface {
	Backlog(ctx context.Context, topic string) ([]Backlog, error)
}

// Features records where drivers truly differ, so the contract suite knows
// what to expect from each.
type Features struct {
	// PerKeyOrder: messages with one key arrive in publish order, one batch
	// at a time across all consumers of the topic.
	PerKeyOrder bool
	// Persistent: messages survive a restart of the process that holds them.
	Persistent bool
	// Delay: the publisher implements DelayPublisher.
	Delay bool
	// Pipeline: consumers implement PipelineConsumer.
	Pipeline bool
}

// ErrClosed is returned by a publisher or consumer after Close.
var ErrClosed = errors.New("queue closed")

// ErrUnknown wraps publish errors after which the messages may or may not
// have been stored (a timeout after the request was sent).
var ErrUnknown = errors.New("publish outcome unknown")

// PartitionOf maps a message key to one of n partitions (FNV-1a), the same
// way in every driver, so a campaign lands on the same partition number
// whichever transport carries it.
func PartitionOf(key string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}
