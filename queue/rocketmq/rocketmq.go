// Package rocketmq is the queue driver on Apache RocketMQ, through
// github.com/apache/rocketmq-client-go/v2 (pinned at v2.1.2, the newest the
// module proxy serves; queue/rocketmq/README.md lists its defects and how this
// package works around them).
//
// Publishing: a message goes to queue FNV-1a(Key) mod n of its topic, the
// library's hash selector with the key as sharding key, so one campaign's
// requests stay in one queue in publish order. Message.ID travels in the
// KEYS property (searchable with mqadmin queryMsgByKey), Key in
// SHARDING_KEY. Several messages with one key are sent as one batch. The
// library ignores its send timeout option (3 s is hard-coded), so Publish runs
// SendSync under the caller's context and reports a send that outlived it as
// queue.ErrUnknown. Retries are the library's, bounded by Options.SendAttempts.
//
// Consuming: one push consumer per Consume call, in the group
// Options.ConsumerGroup, orderly: each queue is locked at the broker by one
// consumer at a time and its batches are handed over serially. A handler
// error returns SuspendCurrentQueueAMoment, which redelivers the same batch
// after Options.SuspendTime with Message.Attempt one higher (never
// ConsumeRetryLater: in orderly mode with auto-commit the library commits past
// such a batch and it is lost). Attempt is ReconsumeTimes+1, and the library
// keeps ReconsumeTimes in memory in orderly mode: a batch taken over from a
// consumer that died starts again at Attempt 1, because the broker never
// learnt about the failed attempts. After Options.MaxReconsumeTimes the
// driver moves a message to the group's dead-letter topic; keep it above the
// worker's max attempts, so the worker records a final result first. The
// driver does it rather than the library, whose send-back ignores the
// broker's answer: a message the broker refuses to take (SYSTEM_ERROR,
// NO_PERMISSION, SUBSCRIPTION_GROUP_NOT_EXIST) would be committed past,
// neither handled nor dead-lettered. The driver keeps it in its queue and
// tries again at its next delivery.
//
// Rebalancing: v2.1.2 neither unlocks a queue it gives up on a rebalance nor
// waits for the batch in flight on it (the Java client does both), and
// persisting one queue's offset deletes the other queues' offsets from its
// memory. A new consumer would wait for the old lock to expire (60 s on a
// broker) and then get acknowledged messages again. Consume fills the gap
// through the allocation strategy it installs: the consumer that gives a
// queue up stops handing out its batches, waits for the one in flight,
// persists every offset and unlocks the queue; the one that takes it over
// waits briefly for the lock before the library tries it. A consumer that
// died keeps its queues until their locks expire. The library also persists
// one queue alone when the broker moves it up past trimmed messages
// (PULL_OFFSET_MOVED), which the driver cannot see: so the driver keeps its
// own record of each queue's acknowledged offset and commits it (never
// lowering one) whenever it hands queues over or stops.
//
// Shutdown: Consume stops pulling (Suspend), lets the handlers in flight
// finish, persists offsets and only then shuts the client down; the library's
// Shutdown does not wait for running handlers.
//
// Broker restarts: the client reconnects on its own, but a pull that was
// held open when the connection dropped is abandoned only at the library's
// next rebalance (at most 20 s later); Ping reports the broker meanwhile.
//
// The library logs through a package-global logger (rlog); New installs a
// slog adapter once per process (see Options.Logger). Each client gets its own
// instance name, since the library shares one client per instance name within
// a process. The library has data races of its own: tests that use it cannot
// run under -race.
package rocketmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strings"
	"time"

	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/internal/gate"
	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
)

// Defaults used for zero Options fields.
const (
	DefaultProducerGroup     = "flashsale-gateway"
	DefaultConsumerGroup     = "workers"
	DefaultQueues            = 8
	DefaultBatchSize         = 128
	DefaultSendAttempts      = 3
	DefaultMaxReconsumeTimes = 1000
	DefaultSuspendTime       = time.Second
	DefaultLockInterval      = 20 * time.Second
	DefaultHandoverWait      = 5 * time.Second
	DefaultProbeTimeout      = 2 * time.Second
)

// MaxBatchSize is the library's limit on pull and consume batches.
const MaxBatchSize = 1024

// Options configures a Queue. Zero fields take the defaults.
type Options struct {
	// NameServers are the name servers' host:port addresses. A host name is
	// looked up again on every new connection, so a name server that comes
	// back on a new IP (a recreated container) is found again.
	NameServers []string
	// ProducerGroup names the producers. Default "flashsale-gateway".
	ProducerGroup string
	// ConsumerGroup is the group every consumer joins; the queues of a topic
	// are shared out among its members. Default "workers".
	ConsumerGroup string
	// ProducerInstance and ConsumerInstance prefix the instance names of the
	// producer and of each Consume call's consumer; every client gets a unique
	// suffix, since the library shares one client per instance name within a
	// process. Default "<hostname>-<pid>".
	ProducerInstance, ConsumerInstance string
	// Queues is the queue count of a topic the broker creates on first send
	// (autoCreateTopicEnable). Default 8. Topics created beforehand keep
	// theirs.
	Queues int
	// BatchSize is the largest batch handed to a handler, at most 1024.
	// Default 128.
	BatchSize int
	// SendAttempts bounds how often the library tries a send (within the
	// caller's deadline): 1 means no retry. Default 3.
	SendAttempts int
	// MaxReconsumeTimes bounds redeliveries after handler errors: a message
	// whose delivery number MaxReconsumeTimes+2 fails again goes to the
	// group's dead-letter topic (%DLQ%<group>), and the queue moves on; if
	// the broker refuses to take it, it stays and is tried again. Default
	// 1000.
	MaxReconsumeTimes int
	// SuspendTime is the wait before a failed batch is redelivered. Default 1s.
	SuspendTime time.Duration
	// LockInterval is how often a consumer renews its queue locks; it must
	// be well below the broker's lock lifetime (60 s). Default 20s.
	LockInterval time.Duration
	// HandoverWait bounds how long a rebalance waits for the batch in flight
	// on a queue it gives up, and for the lock of a queue it takes over.
	// Default 5s.
	HandoverWait time.Duration
	// DelayLevels are the broker's delay levels 1..n (messageDelayLevel in
	// broker.conf). Default RocketMQ's 18 levels, 1s to 2h.
	DelayLevels []time.Duration
	// ProbeTopic is the topic whose route Ping checks before the Queue has
	// used any.
	ProbeTopic string
	// ProbeTimeout bounds each request Ping and the lock handover send.
	// Default 2s.
	ProbeTimeout time.Duration
	// Logger receives the driver's logs and, through an adapter, the
	// library's. The library's logger is global to the process: the first
	// New installs it, with LibraryLogLevel, and later calls keep it. Nil
	// discards.
	Logger *slog.Logger
	// LibraryLogLevel is the lowest level of library log lines passed on.
	// The zero value is slog.LevelInfo; the library is chatty at info.
	LibraryLogLevel slog.Level
}

// DefaultDelayLevels are RocketMQ's default delay levels 1..18.
func DefaultDelayLevels() []time.Duration {
	m, h := time.Minute, time.Hour
	return []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		m, 2 * m, 3 * m, 4 * m, 5 * m, 6 * m, 7 * m, 8 * m, 9 * m, 10 * m, 20 * m, 30 * m, h, 2 * h}
}

func (o Options) withDefaults() Options {
	if o.ProducerGroup == "" {
		o.ProducerGroup = DefaultProducerGroup
	}
	if o.ConsumerGroup == "" {
		o.ConsumerGroup = DefaultConsumerGroup
	}
	host, _ := os.Hostname()
	if o.ProducerInstance == "" {
		o.ProducerInstance = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if o.ConsumerInstance == "" {
		o.ConsumerInstance = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if o.Queues <= 0 {
		o.Queues = DefaultQueues
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.SendAttempts <= 0 {
		o.SendAttempts = DefaultSendAttempts
	}
	if o.MaxReconsumeTimes <= 0 {
		o.MaxReconsumeTimes = DefaultMaxReconsumeTimes
	}
	if o.SuspendTime <= 0 {
		o.SuspendTime = DefaultSuspendTime
	}
	if o.LockInterval <= 0 {
		o.LockInterval = DefaultLockInterval
	}
	if o.HandoverWait <= 0 {
		o.HandoverWait = DefaultHandoverWait
	}
	if len(o.DelayLevels) == 0 {
		o.DelayLevels = DefaultDelayLevels()
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = DefaultProbeTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}

// sender is the part of the library's producer Publish uses.
type sender interface {
	SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
	Shutdown() error
}

// Queue publishes to RocketMQ and makes consumers. All methods are safe for
// concurrent use.
type Queue struct {
	opts  Options
	log   *slog.Logger
	prod  sender
	probe *prober

	gate *gate.Gate
}

var (
	_ queue.Publisher      = (*Queue)(nil)
	_ queue.DelayPublisher = (*Queue)(nil)
	_ queue.Pinger         = (*Queue)(nil)
	_ queue.BacklogReader  = (*Queue)(nil)
	_ queue.Consumer       = (*Consumer)(nil)
)

// New returns a Queue. It starts the producer, which looks up and dials
// nothing before the first send; use Ping to check the broker.
func New(_ context.Context, opts Options) (*Queue, error) {
	opts = opts.withDefaults()
	if opts.BatchSize > MaxBatchSize {
		return nil, fmt.Errorf("rocketmq: batch size %d is above the library's limit %d", opts.BatchSize, MaxBatchSize)
	}
	addrs, err := libraryNameServers(opts.NameServers)
	if err != nil {
		return nil, err
	}
	installLibraryLogger(opts.Logger, opts.LibraryLogLevel)

	q := &Queue{
		opts:  opts,
		log:   opts.Logger,
		probe: newProber(addrs, opts.ProbeTimeout),
		gate:  gate.New(),
	}
	p, err := producer.NewDefaultProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(addrs)),
		producer.WithGroupName(opts.ProducerGroup),
		producer.WithInstanceName(instanceName(opts.ProducerInstance, "producer")),
		producer.WithRetry(opts.SendAttempts-1),
		producer.WithQueueSelector(keySelector{}),
		producer.WithDefaultTopicQueueNums(opts.Queues),
	)
	if err != nil {
		return nil, fmt.Errorf("rocketmq: new producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("rocketmq: start producer: %w", err)
	}
	q.prod = p
	return q, nil
}

// Features reports what the driver guarantees: per-key order (orderly
// consumption of hash-selected queues), messages that outlive the processes
// (as far as the broker persists them) and delayed delivery.
func Features() queue.Features {
	return queue.Features{PerKeyOrder: true, Persistent: true, Delay: true}
}

// instanceName returns a fresh instance name for one client.
func instanceName(prefix, role string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return unsafeChars.ReplaceAllString(prefix+"-"+role, "_") + "-" + hex.EncodeToString(b[:])
}

// nameServerScheme marks a name server given by host name, in the form the
// library takes for one.
const nameServerScheme = "http://"

// libraryNameServers returns the name servers as the library takes them: IP
// literals as they are, host names as "http://host:port". The library
// refuses a bare host name (primitive/base.go, verifyIP) but takes that form,
// strips the scheme and dials host:port by name (internal/namesrv.go,
// getNameServerAddress), so the name is looked up on every new connection:
// once the connection to a name server that moved breaks (at once when its
// process stops, or after the library's 120 s read timeout), the next route
// lookup finds it at its new IP.
func libraryNameServers(addrs []string) ([]string, error) {
	if len(addrs) == 0 {
		return nil, errors.New("rocketmq: no name server address")
	}
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("rocketmq: name server %q: %w", a, err)
		}
		if net.ParseIP(host) == nil {
			a = nameServerScheme + a
		}
		out = append(out, a)
	}
	return out, nil
}

// dialAddr is the host:port of a name server as libraryNameServers gave it.
func dialAddr(nameServer string) string { return strings.TrimPrefix(nameServer, nameServerScheme) }

// topicPattern is what a broker accepts as a topic name.
var topicPattern = regexp.MustCompile(`^[%|a-zA-Z0-9_-]{1,127}$`)

func validTopic(topic string) error {
	if !topicPattern.MatchString(topic) || strings.HasPrefix(topic, "%") {
		return fmt.Errorf("invalid topic %q: want 1-127 of [a-zA-Z0-9_-|]", topic)
	}
	return nil
}

// Limits of one batch send: brokers refuse bodies over 4 MiB.
const (
	maxBatchBytes    = 1 << 20
	maxBatchMessages = 256
)

// Publish sends msgs, one batch per run of messages with the same key, in
// order. It fails with queue.ErrClosed after Close and with ctx's error if
// ctx is already done; then nothing is sent. An error the broker answered
// before storing anything is returned as is; anything else after the first
// send started (a timeout, a lost connection, a partial failure) wraps
// queue.ErrUnknown.
func (q *Queue) Publish(ctx context.Context, topic string, msgs ...queue.Message) error {
	if err := q.checkPublish(ctx, topic); err != nil {
		return err
	}
	sent := false
	for _, run := range batches(msgs) {
		out := make([]*primitive.Message, len(run))
		for i, m := range run {
			out[i] = toMessage(topic, m)
		}
		if err := q.send(ctx, topic, out); err != nil {
			if sent && !errors.Is(err, queue.ErrUnknown) {
				err = fmt.Errorf("%w: %w", queue.ErrUnknown, err)
			}
			return err
		}
		sent = true
	}
	return nil
}

// PublishDelayed sends msgs so that they are delivered no earlier than delay
// from now: at the smallest delay level that is at least delay. Delays above
// the largest level are refused; delay <= 0 publishes at once. Brokers refuse
// delayed batches, so each message is a send of its own.
func (q *Queue) PublishDelayed(ctx context.Context, topic string, delay time.Duration, msgs ...queue.Message) error {
	if delay <= 0 {
		return q.Publish(ctx, topic, msgs...)
	}
	if err := q.checkPublish(ctx, topic); err != nil {
		return err
	}
	level, err := delayLevel(q.opts.DelayLevels, delay)
	if err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	for i, m := range msgs {
		pm := toMessage(topic, m)
		pm.WithDelayTimeLevel(level)
		if err := q.send(ctx, topic, []*primitive.Message{pm}); err != nil {
			if i > 0 && !errors.Is(err, queue.ErrUnknown) {
				err = fmt.Errorf("%w: %w", queue.ErrUnknown, err)
			}
			return err
		}
	}
	return nil
}

// delayLevel returns the smallest level (1-based) whose delay is at least d.
func delayLevel(levels []time.Duration, d time.Duration) (int, error) {
	for i, l := range levels {
		if l >= d {
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("delay %v is above the largest delay level (%v)", d, levels[len(levels)-1])
}

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
	q.probe.remember(topic)
	return nil
}

// toMessage maps a queue.Message onto RocketMQ's properties.
func toMessage(topic string, m queue.Message) *primitive.Message {
	pm := primitive.NewMessage(topic, m.Body)
	pm.WithKeys([]string{m.ID})
	pm.WithShardingKey(m.Key)
	return pm
}

// batches splits msgs into runs of consecutive messages with the same key,
// within the batch limits. Keeping runs consecutive keeps each key's
// publish order.
func batches(msgs []queue.Message) [][]queue.Message {
	var out [][]queue.Message
	size := 0
	for i, m := range msgs {
		last := len(out) - 1
		if i == 0 || m.Key != msgs[i-1].Key || len(out[last]) >= maxBatchMessages || size+len(m.Body) > maxBatchBytes {
			out = append(out, nil)
			last++
			size = 0
		}
		out[last] = append(out[last], m)
		size += len(m.Body) + 64
	}
	return out
}

// send runs one SendSync under ctx. The library bounds a send by its own
// 3 s and route lookups by more, so the call runs in a goroutine and a send
// still running when ctx ends is reported as an unknown outcome.
func (q *Queue) send(ctx context.Context, topic string, msgs []*primitive.Message) error {
	type result struct {
		res *primitive.SendResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := q.prod.SendSync(ctx, msgs...)
		for wait := routeRetryWait; err != nil && missingBrokerAddr(err) && wait <= routeRetryMax; wait *= 2 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
				res, err = q.prod.SendSync(ctx, msgs...)
				continue
			}
			break
		}
		done <- result{res, err}
	}()
	select {
	case <-ctx.Done():
		return fmt.Errorf("publish %s: %w: %w", topic, queue.ErrUnknown, ctx.Err())
	case r := <-done:
		if r.err != nil {
			if refusedBeforeStore(r.err) {
				return fmt.Errorf("publish %s: %w", topic, r.err)
			}
			return fmt.Errorf("publish %s: %w: %w", topic, queue.ErrUnknown, r.err)
		}
		// Never print r.res: SendResult.String panics on a nil queue in v2.1.2.
		if r.res == nil || r.res.Status != primitive.SendOK {
			status := "no result"
			if r.res != nil {
				status = fmt.Sprintf("status %d", r.res.Status)
			}
			return fmt.Errorf("publish %s: %w: broker stored the message but reported %s", topic, queue.ErrUnknown, status)
		}
		return nil
	}
}

// The library (v2.1.2) stores a new route's queues before their broker's
// address, so a send between the two fails "topic=… route info not found"
// with nothing stored; it is tried again after these waits (doubling).
const routeRetryWait, routeRetryMax = 5 * time.Millisecond, 320 * time.Millisecond

// missingBrokerAddr reports the error of that window (the library's other
// message, "the topic=… route info not found", means no route at all).
func missingBrokerAddr(err error) bool {
	return strings.HasPrefix(err.Error(), "topic=") && strings.HasSuffix(err.Error(), " route info not found")
}

// refusedBeforeStore reports whether a SendSync error means nothing was
// stored: the producer or client is not running, no route was found, or the
// broker answered with an error code. The library has sentinels for the
// first; the others are plain error strings.
func refusedBeforeStore(err error) bool {
	if errors.Is(err, rmqerrors.ErrNotRunning) || errors.Is(err, rmqerrors.ErrService) || errors.Is(err, rmqerrors.ErrTopicNotExist) {
		return true
	}
	s := err.Error()
	return strings.HasPrefix(s, "CODE: ") || strings.Contains(s, "route info not found")
}

// Ping checks that the name server knows a topic this Queue uses (or
// Options.ProbeTopic) and that its broker answers, over a connection of its
// own with a short timeout. The library reconnects unreliably after a broker
// restart, so a failed publish is worth a look at Ping too.
func (q *Queue) Ping(ctx context.Context) error {
	if err := q.probe.ping(ctx, q.opts.ProbeTopic); err != nil {
		return fmt.Errorf("rocketmq: %w", err)
	}
	return nil
}

// Close makes later Publish and Consume calls fail with queue.ErrClosed, stops
// running Consume calls as if their contexts were cancelled, waits until they
// have finished their batches in flight, and shuts the producer down. Close
// must not be called from a handler.
func (q *Queue) Close() error {
	if q.gate.Close() {
		_ = q.prod.Shutdown()
		q.probe.close()
	}
	return nil
}

// keySelector sends a message to queue FNV-1a(sharding key) mod n, like the
// library's hash selector, and also a batch: the library wraps a batch in an
// envelope without properties, so the key is read from the first message
// inside it (every message of a batch has the same key).
type keySelector struct{}

func (keySelector) Select(m *primitive.Message, mqs []*primitive.MessageQueue, _ string) *primitive.MessageQueue {
	if len(mqs) == 0 {
		return nil
	}
	key := m.GetShardingKey()
	if key == "" && m.Batch {
		if inner, err := remoting.DecodeBatch(m.Body); err == nil && len(inner) > 0 {
			key = inner[0].Properties[remoting.PropShardingKey]
		}
	}
	return mqs[queue.PartitionOf(key, len(mqs))]
}
