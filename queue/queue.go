// Package queue is the transport contract between the gateway (publisher) and
// the workers (consumers). Drivers live in subpackages (memqueue, redisstream,
// rocketmq) and all pass the same contract suite in queuetest.
//
// Delivery is at least once: a handler that returns nil acknowledges its whole
// batch; an error (or a consumer that dies mid-batch) makes the batch come
// back, possibly to another consumer. Consumers must therefore be idempotent
// per Message.ID.
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
// returns nil to acknowledge the whole batch or an error to have it redelivered.
type Handler func(ctx context.Context, msgs []Message) error

// Consumer delivers a topic's messages to a handler.
type Consumer interface {
	// Consume blocks, handing batches to h, until ctx is cancelled or a fatal
	// error occurs. After cancellation it lets the batch in flight finish (its
	// context is not cancelled) and returns nil; unacknowledged messages are
	// redelivered later, to this or another consumer.
	Consume(ctx context.Context, topic string, h Handler) error
}

// DelayPublisher is implemented by publishers that can hold messages back
// (Features.Delay). It is Publish with a delay: the messages are stored at
// once and delivered no earlier than delay from now, possibly later (drivers
// round up to the delays their backend supports). delay <= 0 is Publish.
type DelayPublisher interface {
	PublishDelayed(ctx context.Context, topic string, delay time.Duration, msgs ...Message) error
}

// Pinger reports whether a driver can reach its backend (readiness).
type Pinger interface {
	Ping(ctx context.Context) error
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
