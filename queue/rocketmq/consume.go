package rocketmq

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/flashsale/flashsale/queue"
)

// Waits in the consumer's lifecycle.
const (
	// offsetSettle: the library records a batch's offset on its own
	// goroutine just after the handler's callback returns; before offsets are
	// persisted (shutdown, giving up a queue) the driver pauses this long so
	// the last acknowledged batch is included.
	offsetSettle = 50 * time.Millisecond
	// releaseDelay: after a rebalance gives queues up, the library persists
	// their offsets over its own connection; the unlock, sent over the
	// prober's, waits this long so the next owner reads the new offsets.
	releaseDelay = 200 * time.Millisecond
	// acquirePoll is how often a rebalance retries the locks of queues it
	// takes over.
	acquirePoll = 100 * time.Millisecond
	// startBackoff and maxStartBackoff pace retries of a consumer that
	// cannot start yet (its topic does not exist, the broker is down).
	startBackoff    = 500 * time.Millisecond
	maxStartBackoff = 10 * time.Second
)

// Consumer hands a topic's batches to a handler. Create it with
// Queue.Consumer; one Consumer may run several Consume calls, each with its
// own client.
type Consumer struct {
	q    *Queue
	name string
}

// Consumer returns a consumer of q. name labels its clients (instance names)
// and logs; it need not be unique.
func (q *Queue) Consumer(name string) *Consumer {
	if name == "" {
		name = "consumer"
	}
	return &Consumer{q: q, name: unsafeChars.ReplaceAllString(name, "_")}
}

// unsafeChars are replaced in instance names, which end up in client ids
// (ip@instance).
var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// pushConsumer is the part of the library's push consumer the driver uses.
type pushConsumer interface {
	Subscribe(topic string, selector consumer.MessageSelector,
		f func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error)) error
	Start() error
	Shutdown() error
	Suspend()
	PersistConsumerOffset() error
}

// Consume hands batches of topic to h until ctx is cancelled or the Queue is
// closed, then stops pulling, lets the handler calls in flight finish (their
// contexts are not cancelled), persists the offsets of acknowledged batches,
// shuts its client down and returns nil. It returns an error only if it
// cannot go on at all: an invalid topic, a closed Queue, a consumer the
// library refuses to create. A topic or broker that is not there yet is
// retried with a backoff and logged.
//
// Batches of one queue (hence of one key) are handed over one at a time
// across every consumer of the group; batches of different queues
// concurrently.
func (c *Consumer) Consume(ctx context.Context, topic string, h queue.Handler) error {
	if err := validTopic(topic); err != nil {
		return fmt.Errorf("consume %s: %w", topic, err)
	}
	hctx := context.WithoutCancel(ctx)
	ctx, done, ok := c.q.gate.Enter(ctx)
	if !ok {
		return fmt.Errorf("consume %s: %w", topic, queue.ErrClosed)
	}
	defer done()
	c.q.probe.remember(topic)

	r := &run{
		q:         c.q,
		opts:      c.q.opts,
		topic:     topic,
		h:         h,
		hctx:      hctx,
		log:       c.q.log.With("topic", topic, "consumer", c.name),
		inflight:  make(map[primitive.MessageQueue]int),
		acked:     make(map[primitive.MessageQueue]int64),
		dead:      make(map[primitive.MessageQueue]map[int64]bool),
		releasing: make(map[primitive.MessageQueue]chan struct{}),
		owned:     make(map[string]map[primitive.MessageQueue]bool),
		stopped:   make(chan struct{}),
	}
	r.cond = sync.NewCond(&r.mu)
	pc, err := r.start(ctx, c.name)
	if err != nil {
		return fmt.Errorf("consume %s: %w", topic, err)
	}
	if pc == nil {
		return nil // cancelled before the client could start
	}
	<-ctx.Done()
	r.stop(pc)
	return nil
}

// run is one Consume call: one push consumer and the driver's view of the
// queues it holds.
type run struct {
	q     *Queue
	opts  Options
	topic string
	h     queue.Handler
	hctx  context.Context
	log   *slog.Logger

	mu        sync.Mutex
	cond      *sync.Cond // signalled when a handler returns
	stopping  bool
	inflight  map[primitive.MessageQueue]int             // handler calls running, by queue
	acked     map[primitive.MessageQueue]int64           // offset after the last batch acknowledged, by queue held
	dead      map[primitive.MessageQueue]map[int64]bool  // offsets dead-lettered but not yet committed past
	releasing map[primitive.MessageQueue]chan struct{}   // queues being given up; closed when done
	owned     map[string]map[primitive.MessageQueue]bool // by topic: the last allocation
	pc        pushConsumer                               // set before the client starts
	stopped   chan struct{}                              // closed after the client shut down
	releases  sync.WaitGroup
}

// start creates, subscribes and starts the push consumer, retrying while
// the topic or broker is missing; nil, nil means ctx ended first.
func (r *run) start(ctx context.Context, name string) (pushConsumer, error) {
	wait := startBackoff
	for {
		pc, err := r.newPushConsumer(name)
		if err != nil {
			return nil, err
		}
		// The allocation strategy (which uses r.pc) runs from within Start.
		r.mu.Lock()
		r.pc = pc
		r.mu.Unlock()
		err = pc.Start()
		if err == nil {
			return pc, nil
		}
		if !strings.Contains(err.Error(), "route info not found") {
			// Refused before it started anything (invalid options); its
			// Shutdown would dereference state that Start never set up.
			return nil, fmt.Errorf("start consumer: %w", err)
		}
		// The library has shut the failed consumer down itself.
		r.log.Warn("consumer cannot start yet; retrying", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
		wait = min(2*wait, maxStartBackoff)
	}
}

func (r *run) newPushConsumer(name string) (pushConsumer, error) {
	o := r.opts
	pc, err := consumer.NewPushConsumer(
		consumer.WithNsResolver(primitive.NewPassthroughResolver(r.q.probe.nameServers)),
		consumer.WithGroupName(o.ConsumerGroup),
		consumer.WithInstance(instanceName(o.ConsumerInstance, name)),
		consumer.WithConsumerModel(consumer.Clustering),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumerOrder(true),
		consumer.WithConsumeMessageBatchMaxSize(o.BatchSize),
		consumer.WithPullBatchSize(int32(o.BatchSize)),
		// The library never dead-letters (-1: no maximum in orderly mode):
		// its send-back ignores the broker's answer and commits past a
		// message the broker refused. consume does it instead.
		consumer.WithMaxReconsumeTimes(-1),
		consumer.WithSuspendCurrentQueueTimeMillis(o.SuspendTime),
		consumer.WithRebalanceLockInterval(o.LockInterval),
		consumer.WithStrategy(r.allocate),
	)
	if err != nil {
		return nil, fmt.Errorf("new consumer: %w", err)
	}
	if err := pc.Subscribe(r.topic, consumer.MessageSelector{}, r.consume); err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	return pc, nil
}

// consume is the library's callback for one batch of one queue. Orderly mode
// calls it for one queue at a time.
func (r *run) consume(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
	mq := primitive.MessageQueue{}
	if oc, ok := primitive.GetOrderlyCtx(ctx); ok {
		// The library sleeps this long before redelivering a suspended batch;
		// its default (-1) would not wait at all.
		oc.SuspendCurrentQueueTimeMillis = int(r.opts.SuspendTime / time.Millisecond)
		mq = oc.MQ
	} else if len(msgs) > 0 && msgs[0].Queue != nil {
		mq = *msgs[0].Queue
	}
	if len(msgs) == 0 {
		return consumer.ConsumeSuccess, nil
	}
	if !r.begin(mq) {
		// Stopping, or the queue is being handed to another consumer: the
		// batch was not handled and its offset stays where it was. Never
		// ConsumeRetryLater here: in orderly mode it would skip the batch.
		return consumer.SuspendCurrentQueueAMoment, nil
	}
	defer r.end(mq)

	// A failed batch comes back whole, dead-lettered messages included:
	// they are in the dead-letter topic already.
	live := r.notDeadLettered(mq, msgs)
	if len(live) > 0 {
		batch := make([]queue.Message, len(live))
		for i, m := range live {
			id := m.GetKeys()
			if id == "" {
				id = m.MsgId // published by something other than this driver
			}
			batch[i] = queue.Message{ID: id, Key: m.GetShardingKey(), Body: m.Body, Attempt: int(m.ReconsumeTimes) + 1}
		}
		switch r.handle(mq, batch) {
		case queue.Hold:
			return consumer.SuspendCurrentQueueAMoment, nil
		case queue.Redeliver:
			if !r.deadLetter(mq, live) {
				return consumer.SuspendCurrentQueueAMoment, nil
			}
		}
	}
	r.acknowledged(mq, msgs)
	return consumer.ConsumeSuccess, nil
}

// The consumer policy (queue.Settle) on the library's orderly consumer. Its
// outcomes map onto the callback's result: Ack is ConsumeSuccess; Redeliver
// is SuspendCurrentQueueAMoment, or ConsumeSuccess once the whole batch is
// dead-lettered. What the library forces to stay here:
//   - Attempt is the library's ReconsumeTimes+1, and every suspended
//     delivery counts one. A held batch cannot go back uncounted, so handle
//     runs it again within the callback until the hold ends. It hands it
//     back only when the consumer stops or the queue is given up, where the
//     count goes with the library's memory of the queue (the next owner
//     starts at Attempt 1).
//   - The wait before a redelivery is the library's: it sleeps SuspendTime,
//     the same every time, before handing a suspended batch out again;
//     handle waits SuspendTime between the runs of a held one to match. Not
//     queue.Backoff, which the library has no way to take.
//   - Giving up after MaxReconsumeTimes is the driver's (deadLetter), not
//     the library's, whose send-back ignores the broker's answer.

// handle runs the handler on batch and settles its result. A held batch
// runs again every SuspendTime within this call, so a hold never counts
// towards MaxReconsumeTimes, however long it lasts; it is handed back (Hold)
// only when the consumer stops or mq is given up.
func (r *run) handle(mq primitive.MessageQueue, batch []queue.Message) queue.Outcome {
	for runs := 1; ; runs++ {
		o := queue.Settle(r.log, batch, r.h(r.hctx, batch), runs, "queue", mq.QueueId)
		if o != queue.Hold || !r.waitHeld(mq) {
			return o
		}
	}
}

// waitHeld waits SuspendTime and reports whether a held batch of mq may
// run again: not when the consumer is stopping or mq is being given up.
func (r *run) waitHeld(mq primitive.MessageQueue) bool {
	deadline := time.Now().Add(r.opts.SuspendTime)
	for {
		r.mu.Lock()
		_, releasing := r.releasing[mq]
		stopping := r.stopping
		r.mu.Unlock()
		left := time.Until(deadline)
		switch {
		case stopping || releasing:
			return false
		case left <= 0:
			return true
		}
		// Checked often, so a rebalance's wait for this queue's batch
		// (HandoverWait) is not spent here.
		time.Sleep(min(left, 20*time.Millisecond))
	}
}

// deadLetter sends the messages of a failed batch that are past
// MaxReconsumeTimes to the group's dead-letter topic. It reports whether
// the whole batch is there now: then the queue moves past it; otherwise the
// batch comes back, and a message the broker refused to take is tried again
// the next time, never committed past (as the library's own send-back
// does).
func (r *run) deadLetter(mq primitive.MessageQueue, msgs []*primitive.MessageExt) bool {
	all := true
	for _, m := range msgs {
		if int(m.ReconsumeTimes) <= r.opts.MaxReconsumeTimes {
			all = false
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.ProbeTimeout)
		err := r.q.probe.deadLetter(ctx, r.opts.ConsumerGroup, mq, m, r.opts.MaxReconsumeTimes)
		cancel()
		if err != nil {
			r.log.Warn("dead-letter a message past max_reconsume_times; it stays in its queue and is tried again",
				"queue", mq.QueueId, "offset", m.QueueOffset, "request_id", m.GetKeys(), "err", err)
			all = false
			continue
		}
		r.log.Error("message dead-lettered after max_reconsume_times failed deliveries",
			"queue", mq.QueueId, "offset", m.QueueOffset, "request_id", m.GetKeys(), "deliveries", m.ReconsumeTimes+1)
		r.mu.Lock()
		if r.dead[mq] == nil {
			r.dead[mq] = make(map[int64]bool)
		}
		r.dead[mq][m.QueueOffset] = true
		r.mu.Unlock()
	}
	return all
}

// notDeadLettered returns the messages of msgs not yet dead-lettered.
func (r *run) notDeadLettered(mq primitive.MessageQueue, msgs []*primitive.MessageExt) []*primitive.MessageExt {
	r.mu.Lock()
	defer r.mu.Unlock()
	dead := r.dead[mq]
	if len(dead) == 0 {
		return msgs
	}
	live := make([]*primitive.MessageExt, 0, len(msgs))
	for _, m := range msgs {
		if !dead[m.QueueOffset] {
			live = append(live, m)
		}
	}
	return live
}

// acknowledged records that the library commits past msgs: their queue's
// offset for the next owner, and dead-letter marks no longer needed.
func (r *run) acknowledged(mq primitive.MessageQueue, msgs []*primitive.MessageExt) {
	next := int64(-1)
	for _, m := range msgs {
		next = max(next, m.QueueOffset+1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acked[mq] = max(r.acked[mq], next)
	for off := range r.dead[mq] {
		if off < next {
			delete(r.dead[mq], off)
		}
	}
	if len(r.dead[mq]) == 0 {
		delete(r.dead, mq)
	}
}

// persist writes the offsets of acknowledged batches to the broker: the
// library's (PersistConsumerOffset), then the driver's own record of them
// for every queue held. v2.1.2's persist of one queue deletes the other
// queues' offsets from its memory (a rebalance's drop, and the
// PULL_OFFSET_MOVED path of a queue whose old messages were trimmed, which
// the driver cannot see), so the library alone may hand a queue over, or
// stop, without the offsets of batches it acknowledged. A commit never
// lowers an offset already on the broker.
func (r *run) persist(pc pushConsumer) {
	if err := pc.PersistConsumerOffset(); err != nil {
		r.log.Warn("persist offsets", "err", err)
	}
	r.mu.Lock()
	acked := maps.Clone(r.acked)
	r.mu.Unlock()
	// One deadline for all: a broker that is down must not hold a shutdown
	// or a rebalance for a timeout per queue.
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.ProbeTimeout)
	defer cancel()
	for mq, off := range acked {
		if err := r.q.probe.commitOffset(ctx, r.opts.ConsumerGroup, mq, off); err != nil {
			r.log.Warn("commit the offset of acknowledged batches; they may be delivered again",
				"queue", mq.QueueId, "offset", off, "err", err)
		}
	}
}

// begin admits a handler call for mq, or waits until the reason not to is
// settled and reports false: the consumer is stopping (wait for the client to
// shut down, after which the library drops the batch) or mq is being given
// up (wait until it is, after which the library drops its queue). Waiting
// instead of refusing at once keeps the library from counting refusals as
// failed attempts and, at its maximum, moving the messages to the
// dead-letter topic.
func (r *run) begin(mq primitive.MessageQueue) bool {
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		<-r.stopped
		return false
	}
	if ch, ok := r.releasing[mq]; ok {
		r.mu.Unlock()
		<-ch
		return false
	}
	r.inflight[mq]++
	r.mu.Unlock()
	return true
}

func (r *run) end(mq primitive.MessageQueue) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight[mq]--; r.inflight[mq] <= 0 {
		delete(r.inflight, mq)
	}
	r.cond.Broadcast()
}

// busy reports whether a handler runs on any of mqs; call with r.mu held.
func (r *run) busy(mqs []primitive.MessageQueue) bool {
	for _, mq := range mqs {
		if r.inflight[mq] > 0 {
			return true
		}
	}
	return false
}

// waitIdle waits, with r.mu held, until no handler runs on mqs or until
// deadline (zero: no deadline); it reports whether they are idle.
func (r *run) waitIdle(mqs []primitive.MessageQueue, deadline time.Time) bool {
	if !deadline.IsZero() {
		t := time.AfterFunc(time.Until(deadline), func() {
			r.mu.Lock()
			r.cond.Broadcast()
			r.mu.Unlock()
		})
		defer t.Stop()
	}
	for r.busy(mqs) && (deadline.IsZero() || time.Now().Before(deadline)) {
		r.cond.Wait()
	}
	return !r.busy(mqs)
}

// allocate is the allocation strategy installed in the library: the
// library's own average allocation, plus the handover v2.1.2 leaves out. The
// library calls it during a rebalance, once per subscribed topic, and right
// after it drops the queues that are no longer allocated (persisting their
// offsets) and locks the new ones (skipping those another consumer still
// holds, until the next rebalance, 20 s later).
//
// For a queue given up: no new batch is handed out, the batch in flight is
// waited for (up to HandoverWait), the offsets are persisted, and the queue
// is unlocked at the broker once the library has dropped it.
// For a queue taken over: its lock is retried for up to HandoverWait, so the
// library's own attempt succeeds as soon as the previous owner lets go.
func (r *run) allocate(group, clientID string, mqAll []*primitive.MessageQueue, cidAll []string) []*primitive.MessageQueue {
	res := consumer.AllocateByAveragely(group, clientID, mqAll, cidAll)
	if len(mqAll) == 0 {
		return res
	}
	topic := mqAll[0].Topic
	now := make(map[primitive.MessageQueue]bool, len(res))
	for _, mq := range res {
		now[*mq] = true
	}

	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return res
	}
	prev := r.owned[topic]
	r.owned[topic] = now
	var dropped, added []primitive.MessageQueue
	for mq := range prev {
		if !now[mq] {
			dropped = append(dropped, mq)
			r.releasing[mq] = make(chan struct{})
		}
	}
	for mq := range now {
		if !prev[mq] {
			added = append(added, mq)
		}
		if ch, ok := r.releasing[mq]; ok {
			// Given back before its release went out: keep the lock.
			close(ch)
			delete(r.releasing, mq)
		}
	}
	waited := r.busy(dropped)
	idle := r.waitIdle(dropped, time.Now().Add(r.opts.HandoverWait))
	pc := r.pc
	r.mu.Unlock()

	if len(dropped) > 0 {
		if !idle {
			r.log.Warn("handler still running on a queue given up in a rebalance; its batch may be redelivered to the next owner",
				"wait", r.opts.HandoverWait)
		}
		if waited {
			time.Sleep(offsetSettle)
		}
		// Persist every held queue's offset now. When the library drops
		// queues it persists them one by one, and v2.1.2's persist of one
		// queue deletes every other queue's offset from memory: the second
		// queue dropped would otherwise go to its next owner without its
		// offset, and acknowledged messages would be delivered again.
		r.persist(pc)
		r.mu.Lock()
		for _, mq := range dropped {
			// The next owner's commits may pass it; never write it again.
			delete(r.acked, mq)
			delete(r.dead, mq)
		}
		r.mu.Unlock()
		r.releases.Add(1)
		go func() {
			defer r.releases.Done()
			r.release(group, clientID, dropped)
		}()
	}
	r.acquire(group, clientID, added)
	return res
}

// release unlocks queues given up in a rebalance once no handler runs on
// them and the library has persisted their offsets, unless a later rebalance
// gave them back.
func (r *run) release(group, clientID string, mqs []primitive.MessageQueue) {
	r.mu.Lock()
	r.waitIdle(mqs, time.Time{})
	r.mu.Unlock()
	time.Sleep(releaseDelay)

	r.mu.Lock()
	var gone []primitive.MessageQueue
	var chans []chan struct{}
	for _, mq := range mqs {
		if ch, ok := r.releasing[mq]; ok {
			gone = append(gone, mq)
			chans = append(chans, ch)
		}
	}
	r.mu.Unlock()

	for broker, part := range byBroker(gone) {
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.ProbeTimeout)
		if err := r.q.probe.unlock(ctx, group, clientID, part); err != nil {
			r.log.Warn("unlock queues given up in a rebalance; they stay locked until the lock expires",
				"broker", broker, "queues", len(part), "err", err)
		}
		cancel()
	}

	r.mu.Lock()
	for i, mq := range gone {
		if r.releasing[mq] == chans[i] {
			delete(r.releasing, mq)
			close(chans[i])
		}
	}
	r.mu.Unlock()
}

// acquire retries the locks of queues taken over until the broker grants
// them all, HandoverWait passes or the consumer stops.
func (r *run) acquire(group, clientID string, mqs []primitive.MessageQueue) {
	deadline := time.Now().Add(r.opts.HandoverWait)
	pending := mqs
	for len(pending) > 0 {
		var still []primitive.MessageQueue
		for _, part := range byBroker(pending) {
			ctx, cancel := context.WithTimeout(context.Background(), r.opts.ProbeTimeout)
			locked, err := r.q.probe.lock(ctx, group, clientID, part)
			cancel()
			if err != nil {
				r.log.Debug("lock queues taken over", "err", err)
			}
			got := make(map[primitive.MessageQueue]bool, len(locked))
			for _, mq := range locked {
				got[mq] = true
			}
			for _, mq := range part {
				if !got[mq] {
					still = append(still, mq)
				}
			}
		}
		pending = still
		r.mu.Lock()
		stopping := r.stopping
		r.mu.Unlock()
		if len(pending) == 0 || stopping || time.Now().After(deadline) {
			break
		}
		time.Sleep(acquirePoll)
	}
	if len(pending) > 0 {
		r.log.Info("queues taken over are still locked by another consumer; the library retries at its next rebalance",
			"queues", len(pending), "waited", r.opts.HandoverWait)
	}
}

// byBroker groups queues by broker name: lock requests go to one broker.
func byBroker(mqs []primitive.MessageQueue) map[string][]primitive.MessageQueue {
	out := make(map[string][]primitive.MessageQueue)
	for _, mq := range mqs {
		out[mq.BrokerName] = append(out[mq.BrokerName], mq)
	}
	return out
}

// stop shuts the consumer down without losing acknowledged work: stop
// pulling and handing out batches, wait for the handlers in flight, persist
// the offsets (before the library's Shutdown unlocks the queues, so the next
// owner reads them), then shut the client down.
func (r *run) stop(pc pushConsumer) {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	pc.Suspend()

	r.mu.Lock()
	waited := len(r.inflight) > 0
	for len(r.inflight) > 0 {
		r.cond.Wait()
	}
	r.mu.Unlock()
	if waited {
		time.Sleep(offsetSettle)
	}
	r.persist(pc)
	if err := pc.Shutdown(); err != nil {
		r.log.Warn("shut consumer down", "err", err)
	}
	close(r.stopped)
	r.releases.Wait()
}
