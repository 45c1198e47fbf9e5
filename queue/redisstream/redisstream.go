// Package redisstream is the queue driver on Redis Streams (go-redis v9). It
// works on a single Redis, on Redis Cluster and on miniredis (the embedded
// mode).
//
// A topic is split into Options.Partitions streams, fsq:{<topic>:<p>}, each
// with its own hash tag so every command touches one slot. A message goes to
// the partition FNV-1a(key) % Partitions, so all messages with one key share a
// stream and keep their publish order.
//
// Consumers read through one consumer group (Options.Group). To keep each
// key's batches serial across processes, a partition is read only by the
// holder of its lease, fsq:{<topic>:<p>}:lease, a key with a TTL that the
// holder keeps renewing. A new holder first takes over the group's pending
// entries of the partition (XAUTOCLAIM), so the messages a dead or stopped
// consumer left unacknowledged come back before anything newer; then it reads
// new entries with XREADGROUP. Consumers of a topic register in
// fsq:{<topic>}:members and hold at most their fair share of partitions, so
// adding worker processes spreads the partitions over them. A consumer that
// joins, or frees partitions (a stop, a share shed for balance), announces
// it on fsq:{<topic>}:handover, and the others count the members again and
// try the free partitions at once: a rolling restart hands its partitions
// over without waiting for a lease to expire, which only a consumer that
// died (and so freed nothing) leaves to the TTL.
//
// The lease is fenced. Its value names the holder and a token that is new
// for every tenure, taken from the counter fsq:{<topic>:<p>}:fence, and every
// command that reads, takes over or acknowledges a partition's entries runs
// in a transaction that executes only while the lease still holds that
// value (WATCH, GET, MULTI/EXEC; fence.go). What that guarantees: once a
// holder's lease has expired and another consumer has taken it, the former
// holder cannot read, claim or acknowledge any entry of the partition,
// however long it was stalled (a GC pause, a starved CPU); its next such
// call fails and it stops serving the partition. What it cannot stop is a
// batch read before the lease was lost reaching the handler afterwards, when
// the holder stalls right between the read and the call, or a handler call
// or Finish that is already running.
// The new holder redelivers that batch first (its entries are still
// pending), so it is handled twice, as at-least-once allows, possibly at the
// same time as the new holder handles that key; the former holder can
// neither acknowledge it nor go on to newer entries. With
// handlers idempotent per Message.ID, as every handler must be, each key's
// messages are thus first handled in publish order across a take-over too.
// The lease's TTL is kept by Redis, so the fence needs no agreement between
// hosts' clocks.
//
// Delivery is at least once. A handler that returns nil has its batch
// acknowledged and deleted (XACK then XDEL in one script): the stream holds
// only unacknowledged messages and needs no trimming, which could drop
// unconsumed ones. The price is that a topic serves one consumer group.
// A handler that returns an error gets the same batch again after a backoff,
// with Attempt taken from the group's delivery counter. A PipelineHandler's
// Finish runs on its own goroutine while the partition's loop reads and
// decides the next batch; when a Finish fails, the loop takes the partition's
// pending entries over again from the oldest, as a new holder would.
//
// Delayed messages (PublishDelayed) wait in a sorted set per partition,
// fsq:{<topic>:<p>}:delayed, scored by due time on Redis's clock, until a
// Lua script moves them into the stream atomically. Every Consume call runs
// that script for each partition every Options.MoveInterval; any number may
// run at once (delay.go). Being in Redis, they survive every consumer's
// restart.
//
// On miniredis, call ClockTTL(true) on the server: by default miniredis only
// expires keys on FastForward, so a lease whose holder stopped without
// releasing it would never expire.
package redisstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/internal/gate"
)

// Defaults used for zero Options fields.
const (
	DefaultPartitions      = 8
	DefaultGroup           = "workers"
	DefaultBatchSize       = 128
	DefaultBlock           = time.Second
	DefaultLeaseTTL        = 10 * time.Second
	DefaultRedeliveryDelay = 100 * time.Millisecond
	DefaultMoveInterval    = 200 * time.Millisecond
)

// Waits after Redis errors.
const (
	errorBackoff = 100 * time.Millisecond // the first of queue.Backoff
	opTimeout    = 5 * time.Second        // for cleanup commands run after ctx is cancelled
	// shutdownAckTries bounds acknowledgement attempts once Consume's context
	// is cancelled, so shutdown cannot hang on a Redis that refuses them.
	shutdownAckTries = 3
)

// Options configures a Queue. Zero fields take the defaults. Every process
// that publishes or consumes a topic must use the same Partitions and Group.
type Options struct {
	// Partitions is the number of streams per topic. Default 8.
	Partitions int
	// Group is the consumer group that consumers read through. Default
	// "workers".
	Group string
	// BatchSize is the largest batch handed to a handler. Default 128.
	BatchSize int
	// Block is how long one XREADGROUP waits for new messages. It bounds how
	// long Consume takes to notice cancellation, since go-redis cannot
	// interrupt a blocked read. Default 1s.
	Block time.Duration
	// LeaseTTL is how long a partition lease outlives its holder's last
	// renewal: the time until another consumer takes over from a dead one.
	// It is renewed every LeaseTTL/3. Default 10s.
	LeaseTTL time.Duration
	// RedeliveryDelay is the wait before a failed batch is handed out again;
	// it doubles with each consecutive failure of the batch. Default 100ms.
	RedeliveryDelay time.Duration
	// MoveInterval is how often each Consume call moves the topic's due
	// delayed messages into their streams: about how late after its due
	// time a delayed message may arrive. Default 200ms.
	MoveInterval time.Duration
	// Logger receives handler and Redis errors, and every lease taken,
	// released or lost. Nil discards.
	Logger *slog.Logger
	// Observer, when set, is told of every partition lease the Queue's
	// consumers take, release or lose (metrics).
	Observer queue.PartitionObserver
	// ReplicaAck, with Replicas > 0, makes Publish return nil only once
	// that many replicas hold the messages (publish.go).
	ReplicaAck ReplicaAck
}

func (o Options) withDefaults() Options {
	if o.Partitions <= 0 {
		o.Partitions = DefaultPartitions
	}
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.Block <= 0 {
		o.Block = DefaultBlock
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.RedeliveryDelay <= 0 {
		o.RedeliveryDelay = DefaultRedeliveryDelay
	}
	if o.MoveInterval <= 0 {
		o.MoveInterval = DefaultMoveInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}

// Queue publishes to and makes consumers of topics on one Redis client. It
// does not own the client: close the client after Close. All methods are safe
// for concurrent use.
type Queue struct {
	rdb     redis.UniversalClient
	opts    Options
	scripts leaseScripts
	delays  delayScripts

	gate *gate.Gate
}

var (
	_ queue.Publisher        = (*Queue)(nil)
	_ queue.DelayPublisher   = (*Queue)(nil)
	_ queue.Pinger           = (*Queue)(nil)
	_ queue.BacklogReader    = (*Queue)(nil)
	_ queue.Consumer         = (*Consumer)(nil)
	_ queue.PipelineConsumer = (*Consumer)(nil)
)

// New returns a Queue on rdb. The client's pool must have room for one
// blocked connection per partition for every running Consume call, plus a
// few for publishing, lease renewal and moving delayed messages.
func New(rdb redis.UniversalClient, opts Options) *Queue {
	return &Queue{
		rdb:     rdb,
		opts:    opts.withDefaults(),
		scripts: newLeaseScripts(),
		delays:  newDelayScripts(),
		gate:    gate.New(),
	}
}

// Features reports what redisstream guarantees: per-key order, delayed
// delivery, and messages that outlive the processes using them, as far as
// the Redis server persists its data (not at all on miniredis).
func Features() queue.Features {
	return queue.Features{PerKeyOrder: true, Persistent: true, Delay: true, Pipeline: true}
}

// Publish appends msgs to their partition streams in one pipelined round
// trip. It fails with queue.ErrClosed after Close and with ctx's error if ctx
// is already done; then nothing is stored. If Redis refused every message,
// nothing is stored either; any other failure (a timeout, a broken
// connection, a partial refusal, and with Options.ReplicaAck fewer replicas
// than asked) wraps queue.ErrUnknown.
func (q *Queue) Publish(ctx context.Context, topic string, msgs ...queue.Message) error {
	if err := q.checkPublish(ctx, topic); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	if q.opts.ReplicaAck.Replicas > 0 {
		return q.publishAcked(ctx, topic, msgs)
	}
	cmds, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, m := range msgs {
			p.XAdd(ctx, &redis.XAddArgs{
				Stream: streamKey(topic, queue.PartitionOf(m.Key, q.opts.Partitions)),
				Values: []any{fieldID, m.ID, fieldKey, m.Key, fieldBody, m.Body},
			})
		}
		return nil
	})
	if err == nil {
		return nil
	}
	refused := 0
	for _, c := range cmds {
		var rerr redis.Error
		if errors.As(c.Err(), &rerr) {
			refused++
		}
	}
	if refused == len(msgs) {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	return fmt.Errorf("publish %s: %w: %w", topic, queue.ErrUnknown, err)
}

// Ping checks that Redis answers.
func (q *Queue) Ping(ctx context.Context) error {
	if err := q.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}

// Close makes later Publish and Consume calls fail with queue.ErrClosed, stops
// running Consume calls as if their contexts were cancelled, and waits until
// they have finished their batches in flight and released their leases. It
// does not close the Redis client. Close must not be called from a handler.
func (q *Queue) Close() error {
	q.gate.Close()
	return nil
}

// Consumer returns a consumer of q. name identifies the process in leases,
// the consumer group and logs (a host name, say); each Consume call appends
// a unique suffix, so names need not be unique.
func (q *Queue) Consumer(name string) *Consumer {
	if name == "" {
		name = "consumer"
	}
	return &Consumer{q: q, name: name}
}

// Stream entry fields.
const (
	fieldID   = "id"
	fieldKey  = "key"
	fieldBody = "body"
)

// streamKey is partition p's stream. The hash tag covers topic and partition,
// so partitions spread over a cluster and each command stays in one slot.
func streamKey(topic string, p int) string {
	return "fsq:{" + topic + ":" + strconv.Itoa(p) + "}"
}

// StreamKey returns the Redis key of a topic's partition p, where Publish
// appends its messages: an operator or a test finds its node from it.
func StreamKey(topic string, p int) string { return streamKey(topic, p) }

// leaseKey is partition p's lease; it shares the stream's hash tag.
func leaseKey(topic string, p int) string {
	return streamKey(topic, p) + ":lease"
}

// fenceKey is partition p's fencing counter, from which each tenure of the
// lease takes its token. It never expires: a token must not repeat.
func fenceKey(topic string, p int) string {
	return streamKey(topic, p) + ":fence"
}

// membersKey is the sorted set of a topic's live consumers, scored by when
// each registration expires (Unix ms).
func membersKey(topic string) string {
	return "fsq:{" + topic + "}:members"
}

// handoverChannel is where a topic's consumers announce that they joined,
// or freed partitions, so the others rebalance at once rather than at their
// next heartbeat or lease attempt.
func handoverChannel(topic string) string {
	return "fsq:{" + topic + "}:handover"
}

// validTopic rejects names that would break the keys' hash tags.
func validTopic(topic string) error {
	if topic == "" || strings.ContainsAny(topic, "{}") {
		return fmt.Errorf("invalid topic %q: must be non-empty without braces", topic)
	}
	return nil
}

// sleep waits d or until ctx is done; it reports whether the full d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// checkPublish refuses a publish that cannot store anything: a closed
// queue, a bad topic or a context already done.
func (q *Queue) checkPublish(ctx context.Context, topic string) error {
	if q.gate.Closed() {
		return fmt.Errorf("publish %s: %w", topic, queue.ErrClosed)
	}
	if err := validTopic(topic); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	return nil
}
