package redisstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/flashsale/flashsale/queue"
)

// Consumer hands a topic's batches to a handler. Create it with
// Queue.Consumer; one Consumer may run several Consume calls, each with its
// own identity.
type Consumer struct {
	q    *Queue
	name string
}

// Consume hands batches of topic to h until ctx is cancelled or the Queue is
// closed, then lets the handler calls in flight finish (their contexts are
// not cancelled), acknowledges their batches if they succeeded, releases its
// leases and returns nil. It returns an error only if it cannot go on at all:
// an invalid topic, a closed Queue or a closed Redis client. Transient Redis
// errors are logged and retried.
//
// Consume runs one loop per partition and competes for the partitions'
// leases, holding at most its fair share, so h is called concurrently for
// different partitions (never for one partition, hence never for one key).
func (c *Consumer) Consume(ctx context.Context, topic string, h queue.Handler) error {
	return c.ConsumePipelined(ctx, topic, queue.OneStep(h))
}

// ConsumePipelined is Consume for a PipelineHandler: while a batch's Finish
// runs (and then acknowledges it), the partition's loop reads the next batch
// and runs its first step. A failed Finish makes the loop take the
// partition's pending entries over again, in order, as a new holder would.
func (c *Consumer) ConsumePipelined(ctx context.Context, topic string, h queue.PipelineHandler) error {
	if err := validTopic(topic); err != nil {
		return fmt.Errorf("consume %s: %w", topic, err)
	}
	hctx := context.WithoutCancel(ctx)
	ctx, done, ok := c.q.gate.Enter(ctx)
	if !ok {
		return fmt.Errorf("consume %s: %w", topic, queue.ErrClosed)
	}
	defer done()

	owner := c.name + "-" + uuid.NewString()
	r := &run{
		q:     c.q,
		opts:  c.q.opts,
		topic: topic,
		owner: owner,
		h:     h,
		hctx:  hctx,
		log:   c.q.opts.Logger.With("topic", topic, "consumer", owner),
	}
	r.members.Store(1)
	if err := r.heartbeat(ctx); err != nil {
		if isFatal(err) {
			return fmt.Errorf("consume %s: %w", topic, err)
		}
		r.log.Warn("register consumer", "err", err)
	}

	g, gctx := errgroup.WithContext(ctx)
	// Subscribed before the announcement, so the answers to it (partitions
	// shed for this run) are heard.
	sub := r.q.rdb.Subscribe(gctx, handoverChannel(topic))
	g.Go(func() error { return r.watchHandovers(gctx, sub) })
	r.announce(gctx)
	g.Go(func() error { return r.keepMembership(gctx) })
	g.Go(func() error { return r.moveLoop(gctx) })
	for p := range r.opts.Partitions {
		g.Go(func() error { return r.partitionLoop(gctx, p) })
	}
	err := g.Wait()
	// Deregistered and every lease freed: the others take over now.
	r.announce(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("consume %s: %w", topic, err)
	}
	return nil
}

// run is one Consume call.
type run struct {
	q     *Queue
	opts  Options
	topic string
	owner string // lease value and consumer-group consumer name
	h     queue.PipelineHandler
	hctx  context.Context // handler context: never cancelled, so batches finish
	log   *slog.Logger

	members atomic.Int64 // live consumers of the topic, from the last heartbeat
	held    atomic.Int64 // partitions this run holds or is acquiring
	// wake ends the partition loops' idle waits after a handover;
	// unreserved those of the loops refused a reservation, when a
	// reservation is given back after a failed attempt.
	wake, unreserved wakeup
}

// wakeup wakes every goroutine waiting on it at once.
type wakeup struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next broadcast.
func (w *wakeup) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *wakeup) broadcast() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// errShed ends holding a partition given up to balance the load.
var errShed = errors.New("partition shed for balance")

// fairShare is how many partitions this run may hold.
func (r *run) fairShare() int64 {
	n := max(r.members.Load(), 1)
	return (int64(r.opts.Partitions) + n - 1) / n
}

// reserve counts one more held partition if that stays within the fair share.
func (r *run) reserve() bool {
	for {
		h := r.held.Load()
		if h >= r.fairShare() {
			return false
		}
		if r.held.CompareAndSwap(h, h+1) {
			return true
		}
	}
}

// shed counts one partition fewer if this run holds more than its share. The
// compare-and-swap makes exactly the surplus give up, not every partition
// loop that notices it.
func (r *run) shed() bool {
	for {
		h := r.held.Load()
		if h <= r.fairShare() {
			return false
		}
		if r.held.CompareAndSwap(h, h-1) {
			return true
		}
	}
}

// retryDelay is how often a consumer without a partition tries to take it:
// a quarter of the lease TTL, jittered so competing consumers spread out.
func (r *run) retryDelay() time.Duration {
	d := r.opts.LeaseTTL / 4
	return d - d/5 + rand.N(2*d/5+1)
}

// idle waits d, or until woken or unreserved (nil: not waited on) is
// closed: channels the caller took from r.wake and r.unreserved before it
// looked at the partition, so no signal in between is missed.
func idle(ctx context.Context, d time.Duration, woken, unreserved <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-woken:
	case <-unreserved:
	case <-t.C:
	}
}

// partitionLoop competes for partition p's lease and reads it while held,
// until ctx is done.
func (r *run) partitionLoop(ctx context.Context, p int) error {
	log := r.log.With("partition", p)
	failures := 0
	for ctx.Err() == nil {
		woken, unreserved := r.wake.wait(), r.unreserved.wait()
		if !r.reserve() {
			// The share may be taken by attempts on partitions still
			// held elsewhere: look again when one of them gives up.
			idle(ctx, r.retryDelay(), woken, unreserved)
			continue
		}
		l, err := acquireLease(ctx, r.q.rdb, r.q.scripts, r.topic, p, r.owner, r.opts.LeaseTTL)
		if err != nil || l == nil {
			r.held.Add(-1)
			r.unreserved.broadcast()
			if err != nil {
				if isFatal(err) {
					return err
				}
				if ctx.Err() == nil {
					failures++
					streak(log, failures, "acquire lease", "err", err)
				}
				sleep(ctx, queue.Backoff(errorBackoff, failures))
				continue
			}
			failures = 0
			idle(ctx, r.retryDelay(), woken, nil)
			continue
		}
		failures = 0
		log.Info("partition lease acquired", "lease", l.value)
		r.observe(p, queue.PartitionAcquired)
		err = r.hold(ctx, p, l, log)
		if !errors.Is(err, errShed) {
			r.held.Add(-1)
		}
		switch {
		case err == nil, errors.Is(err, errShed):
		case isFatal(err):
			return err
		default:
			if ctx.Err() == nil {
				failures++
				streak(log, failures, "read partition", "err", err)
				sleep(ctx, queue.Backoff(errorBackoff, failures))
			}
		}
	}
	return nil
}

// hold serves partition p while l is held: it renews the lease in the
// background, redelivers the group's pending entries, then reads new ones.
// On return it releases the lease.
func (r *run) hold(ctx context.Context, p int, l *lease, log *slog.Logger) error {
	stream := streamKey(r.topic, p)
	// Renewal must outlive ctx: after cancellation the batch in flight still
	// needs the lease until it is acknowledged.
	renewCtx, stopRenew := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { r.keepLease(renewCtx, l, log) })
	defer func() {
		stopRenew()
		wg.Wait()
		r.leave(ctx, p, stream, l, log)
	}()

	pl := &pipeline{}
	// The last Finish must end (and acknowledge) while the lease is held.
	defer func() {
		_, _ = pl.wait()
		r.keepHeld(ctx, stream, l, pl, log)
	}()

	if err := r.ensureGroup(ctx, stream); err != nil {
		return err
	}
	for {
		err := r.redeliverPending(ctx, stream, l, pl, log)
		if err == nil {
			err = r.readNew(ctx, stream, l, pl, log)
		}
		if !errors.Is(err, errRestart) {
			return err
		}
		// A Finish failed: every entry from its batch on is pending again,
		// and nothing is in flight.
		pl.restarts++
		r.keepHeld(ctx, stream, l, pl, log)
		if !sleep(ctx, queue.Backoff(r.opts.RedeliveryDelay, pl.restarts)) || !l.valid() {
			return nil
		}
	}
}

// keepHeld sets the delivery counters of the held batches going back to
// the pending entries (pl.held) one below their messages' Attempt: the next
// take-over, by this run or the partition's next holder, counts a delivery
// and so gives them back the Attempt they had. It runs after ctx may have
// been cancelled.
func (r *run) keepHeld(ctx context.Context, stream string, l *lease, pl *pipeline, log *slog.Logger) {
	held := pl.held
	pl.held = nil
	if len(held) == 0 || !l.valid() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	counts := make(map[int][]string)
	for _, b := range held {
		for i, id := range b.ids {
			n := max(b.msgs[i].Attempt-1, 0)
			counts[n] = append(counts[n], id)
		}
	}
	if err := setDeliveryCounts(ctx, r.q.rdb, l, stream, r.opts.Group, r.owner, counts); err != nil && !isFatal(err) {
		log.Warn("keep the delivery counts of held batches; their next delivery counts as an attempt", "batches", len(held), "err", err)
	}
}

// errRestart ends reading a partition when a Finish failed: its batch and
// those behind it are taken over again from the pending entries.
var errRestart = errors.New("a finish failed; redelivering from it")

// pipeline is a partition's batch whose Finish runs behind the loop. Only
// the partition's loop uses it.
type pipeline struct {
	behind *finishing
	// restarts counts the restarts after a failed Finish since a Finish was
	// last acknowledged, for the back-off and the log.
	restarts int
	// held are the batches going back to the pending entries held, not
	// failed (keepHeld): their Finish was held, or their first step when the
	// loop gave up or restarted.
	held []batch
}

// finishing is one batch's Finish and acknowledgement, on its own goroutine.
// Its fields are set before done is closed.
type finishing struct {
	done chan struct{}
	ok   bool   // finished and acknowledged
	held *batch // the batch, when its Finish was held
	err  error  // fatal error from the acknowledgement
}

// wait waits for the batch behind, if any, and reports whether it was
// acknowledged; a fatal error is returned as is.
func (pl *pipeline) wait() (bool, error) {
	f := pl.behind
	if f == nil {
		return true, nil
	}
	<-f.done
	pl.behind = nil
	if f.ok {
		pl.restarts = 0
	}
	if f.held != nil {
		pl.held = append(pl.held, *f.held)
	}
	return f.ok, f.err
}

// settled waits for the batch behind, if any: nil if it was acknowledged,
// errRestart if it failed, or the acknowledgement's fatal error.
func (pl *pipeline) settled() error {
	switch ok, err := pl.wait(); {
	case err != nil:
		return err
	case !ok:
		return errRestart
	}
	return nil
}

// failed reports, without waiting, whether the batch behind has failed.
func (pl *pipeline) failed() bool {
	f := pl.behind
	if f == nil {
		return false
	}
	select {
	case <-f.done:
		return !f.ok
	default:
		return false
	}
}

// streak logs the n-th failure in a row of one partition's step: the first
// at warn, the rest at debug. A Redis outage fails every partition's every
// try, and the outage itself is logged once (store.Guard); what matters
// per partition is that it began failing, and whether it lost its lease.
func streak(log *slog.Logger, n int, msg string, args ...any) {
	level := slog.LevelWarn
	if n > 1 {
		level = slog.LevelDebug
	}
	log.Log(context.Background(), level, msg, append(args, "failures", n)...)
}

// keepLease renews l every TTL/3 until ctx is done or the lease is lost.
func (r *run) keepLease(ctx context.Context, l *lease, log *slog.Logger) {
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, l.ttl/3)
		held, err := renewLease(rctx, r.q.rdb, r.q.scripts, l)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// Keep trying until the deadline: a blip must not drop the
			// partition, but past the deadline another consumer may own it.
			failures++
			streak(log, failures, "renew lease", "err", err)
			if isFatal(err) || !l.valid() {
				l.markLost()
				return
			}
		case !held:
			log.Warn("lease lost; stopping after the current batch")
			l.markLost()
			return
		default:
			failures = 0
		}
	}
}

// leave gives up the partition: it deletes this run's consumer from the group
// when it owns no pending entries (so restarts do not pile up consumers) and
// releases the lease, then reports whether it freed the lease or had lost it.
// It runs after ctx may have been cancelled.
func (r *run) leave(ctx context.Context, p int, stream string, l *lease, log *slog.Logger) {
	running := ctx.Err() == nil
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	// Only while the lease is held: nobody else can then hand entries to
	// this consumer name between the check and the delete, which would
	// drop them from the group's pending list.
	if l.valid() {
		pending, err := r.q.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: stream, Group: r.opts.Group, Start: "-", End: "+", Count: 1, Consumer: r.owner,
		}).Result()
		if err == nil && len(pending) == 0 {
			err = r.q.rdb.XGroupDelConsumer(ctx, stream, r.opts.Group, r.owner).Err()
		}
		if err != nil && !isFatal(err) && !isNoGroup(err) {
			log.Warn("remove consumer from group", "err", err)
		}
	}
	released, err := releaseLease(ctx, r.q.rdb, r.q.scripts, l)
	if err != nil && !isFatal(err) {
		log.Warn("release lease", "err", err)
	}
	held := time.Since(l.acquired).Round(time.Millisecond)
	if !released {
		// Expired (a stall, a Redis outage) or taken: another consumer may
		// have redelivered what this one was handling.
		log.Warn("partition lease lost", "lease", l.value, "held_for", held)
		r.observe(p, queue.PartitionLost)
		return
	}
	log.Info("partition lease released", "lease", l.value, "held_for", held)
	r.observe(p, queue.PartitionReleased)
	if running {
		// Shed for balance: the consumer it was shed for takes it now. A
		// stopping run announces once, when all its leases are free.
		r.announce(ctx)
	}
}

// observe reports a lease event of partition p to the Observer, if any.
func (r *run) observe(p int, event string) {
	if r.opts.Observer != nil {
		r.opts.Observer.PartitionEvent(r.topic, p, event)
	}
}

// announce tells the topic's other consumers that the membership changed or
// partitions are free (handoverChannel).
func (r *run) announce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := r.q.rdb.Publish(ctx, handoverChannel(r.topic), r.owner).Err(); err != nil && !isFatal(err) && ctx.Err() == nil {
		r.log.Warn("announce handover", "err", err)
	}
}

// watchHandovers counts the members again and wakes the idle partition
// loops whenever another consumer of the topic announces a change. Until
// it does, the loops find out on their own, within a heartbeat and a lease
// attempt.
func (r *run) watchHandovers(ctx context.Context, sub *redis.PubSub) error {
	defer sub.Close()
	msgs := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			if m.Payload == r.owner {
				continue
			}
		}
		if err := r.heartbeat(ctx); err != nil && ctx.Err() == nil && !isFatal(err) {
			r.log.Warn("heartbeat after a handover", "err", err)
		}
		r.wake.broadcast()
	}
}

// ensureGroup creates the consumer group, and the stream if need be, at the
// start of the stream, so messages published before any consumer ran are
// delivered too.
func (r *run) ensureGroup(ctx context.Context, stream string) error {
	err := r.q.rdb.XGroupCreateMkStream(ctx, stream, r.opts.Group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s on %s: %w", r.opts.Group, stream, err)
	}
	return nil
}

// redeliverPending takes over every pending entry of the partition, in ID
// order, and hands them out before any new entry. Claiming with min-idle 0
// is safe because the lease guarantees no other consumer is working on them.
func (r *run) redeliverPending(ctx context.Context, stream string, l *lease, pl *pipeline, log *slog.Logger) error {
	start := "0-0"
	for ctx.Err() == nil && l.valid() {
		xs, next, err := claimEntries(ctx, r.q.rdb, l, stream, r.opts.Group, r.owner, start, r.opts.BatchSize)
		switch {
		case errors.Is(err, errLeaseLost):
			log.Warn("lease lost; stopping")
			return nil
		case err != nil:
			return fmt.Errorf("claim pending on %s: %w", stream, err)
		}
		if len(xs) > 0 {
			// Each entry was delivered before: a claim is at least its
			// second attempt if the counter cannot be read.
			b := toBatch(xs, r.deliveryCounts(ctx, stream, xs, log), 2)
			if done, err := r.deliver(ctx, stream, l, pl, b, log); err != nil || !done {
				return err
			}
		}
		if next == "0-0" || next == "" {
			return nil
		}
		start = next
	}
	return nil
}

// readNew hands out new entries until ctx is done, the lease is lost or the
// partition is shed to balance the load.
func (r *run) readNew(ctx context.Context, stream string, l *lease, pl *pipeline, log *slog.Logger) error {
	for ctx.Err() == nil && l.valid() {
		if pl.failed() {
			_, err := pl.wait()
			return cmp.Or(err, errRestart)
		}
		if r.shed() {
			log.Debug("shedding partition for balance", "share", r.fairShare())
			return errShed
		}
		xs, after, err := readEntries(ctx, r.q.rdb, l, stream, r.opts.Group, r.owner, r.opts.BatchSize)
		switch {
		case errors.Is(err, errLeaseLost):
			log.Warn("lease lost; stopping")
			return nil
		case isNoGroup(err):
			// The stream was deleted (and recreated by XADD) under us.
			if err := r.ensureGroup(ctx, stream); err != nil {
				return err
			}
			continue
		case err != nil:
			return fmt.Errorf("read %s: %w", stream, err)
		}
		if len(xs) == 0 {
			if err := r.wait(ctx, stream, after); err != nil {
				return err
			}
			continue
		}
		if ctx.Err() != nil {
			// Cancelled while reading: hand nothing new to the handler, and
			// reset the delivery counters so the next holder reports a
			// first attempt.
			r.unread(ctx, stream, l, xs, log)
			return nil
		}
		if done, err := r.deliver(ctx, stream, l, pl, toBatch(xs, nil, 1), log); err != nil || !done {
			return err
		}
	}
	return nil
}

// wait blocks until the stream has an entry after the ID after, for at most
// Options.Block. A plain XREAD, outside the fenced read: it takes nothing
// from the group, so cancellation while it blocks (go-redis cannot interrupt
// it) leaves every entry undelivered.
func (r *run) wait(ctx context.Context, stream, after string) error {
	err := r.q.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, after}, Count: 1, Block: r.opts.Block}).Err()
	if err == nil || errors.Is(err, redis.Nil) || ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("wait on %s: %w", stream, err)
}

// deliver hands b to the handler until its first step accepts it; then,
// once the batch ahead is acknowledged, it acknowledges b or starts b's
// Finish behind the loop. It reports false without error when it gave up
// because ctx was cancelled or the lease was lost: the batch then stays
// pending in the group and the partition's next holder redelivers it first,
// keeping key order. errRestart means the batch ahead failed its Finish.
func (r *run) deliver(ctx context.Context, stream string, l *lease, pl *pipeline, b batch, log *slog.Logger) (bool, error) {
	for failures := 1; ; failures++ {
		if !l.valid() {
			return false, nil
		}
		finish, err := r.h(r.hctx, b.msgs)
		o := queue.Settle(log, b.msgs, err, failures)
		if o == queue.Ack {
			return r.finish(ctx, stream, l, pl, b, finish, log)
		}
		// Retry only after the batch ahead is acknowledged: if its Finish
		// fails, that batch must come back first.
		err = pl.settled()
		if err != nil || !sleep(ctx, queue.Backoff(r.opts.RedeliveryDelay, failures)) || !l.valid() {
			// Given up: the batch stays pending, uncounted if held
			// (keepHeld).
			if o == queue.Hold {
				pl.held = append(pl.held, b)
			}
			return false, err
		}
		if !o.Counts() {
			// Held: the batch runs again as it is, its delivery counters
			// left where they were.
			continue
		}
		b, err = r.reclaim(ctx, stream, l, b, log)
		switch {
		case errors.Is(err, errLeaseLost):
			log.Warn("lease lost; stopping")
			return false, nil
		case err != nil:
			return false, err
		}
		if len(b.ids) == 0 {
			return true, nil // deleted from the stream meanwhile
		}
	}
}

// finish acknowledges b, whose first step succeeded, or starts its Finish,
// after the batch ahead of it is acknowledged.
func (r *run) finish(ctx context.Context, stream string, l *lease, pl *pipeline, b batch, finish queue.Finish, log *slog.Logger) (bool, error) {
	if err := pl.settled(); err != nil {
		return false, err
	}
	if finish == nil {
		return r.ack(ctx, stream, l, b.ids, log)
	}
	f := &finishing{done: make(chan struct{})}
	pl.behind = f
	// The restart a failure causes is the next in a row: the batch ahead
	// was acknowledged or this one would not start.
	failures := pl.restarts + 1
	go func() {
		defer close(f.done)
		switch queue.Settle(log, b.msgs, finish(r.hctx), failures, "step", "finish") {
		case queue.Ack:
			f.ok, f.err = r.ack(ctx, stream, l, b.ids, log)
		case queue.Hold:
			f.held = &b
		}
	}()
	return true, nil
}

// reclaim prepares a failed batch for redelivery: claiming the entries again
// bumps their delivery counters in Redis, so the attempt count survives a
// crash, and re-reads them. If Redis cannot be reached the batch is retried
// from memory with Attempt+1.
func (r *run) reclaim(ctx context.Context, stream string, l *lease, b batch, log *slog.Logger) (batch, error) {
	prev := make(map[string]int, len(b.ids))
	for i, id := range b.ids {
		prev[id] = b.msgs[i].Attempt
	}
	xs, err := reclaimEntries(ctx, r.q.rdb, l, stream, r.opts.Group, r.owner, b.ids)
	if err != nil {
		if isFatal(err) || errors.Is(err, errLeaseLost) {
			return batch{}, err
		}
		log.Warn("reclaim failed batch", "err", err)
		out := batch{ids: b.ids, msgs: make([]queue.Message, len(b.msgs))}
		for i, m := range b.msgs {
			m.Attempt++
			out.msgs[i] = m
		}
		return out, nil
	}
	out := toBatch(xs, r.deliveryCounts(ctx, stream, xs, log), 0)
	for i, id := range out.ids {
		// Never report fewer attempts than already seen.
		out.msgs[i].Attempt = max(out.msgs[i].Attempt, prev[id]+1)
	}
	return out, nil
}

// deliveryCounts reads the group's delivery counters for xs, which this run
// has just claimed. Missing counters are left out.
func (r *run) deliveryCounts(ctx context.Context, stream string, xs []redis.XMessage, log *slog.Logger) map[string]int {
	if len(xs) == 0 {
		return nil
	}
	pending, err := r.q.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: stream, Group: r.opts.Group, Consumer: r.owner,
		Start: xs[0].ID, End: xs[len(xs)-1].ID, Count: int64(len(xs)),
	}).Result()
	if err != nil {
		log.Warn("read delivery counts", "err", err)
		return nil
	}
	counts := make(map[string]int, len(pending))
	for _, p := range pending {
		counts[p.ID] = int(p.RetryCount)
	}
	return counts
}

// ack acknowledges and deletes the entries ids, fenced by the lease. It
// retries while the lease is valid: moving on to newer entries with an
// unacknowledged batch behind would let that batch come back out of order.
// After ctx is cancelled it gives up sooner, since nothing newer follows; the
// batch then stays pending and is redelivered (a duplicate, which
// at-least-once allows), as it is when the lease was lost.
func (r *run) ack(ctx context.Context, stream string, l *lease, ids []string, log *slog.Logger) (bool, error) {
	actx := context.WithoutCancel(ctx)
	for failures := 1; ; failures++ {
		c, cancel := context.WithTimeout(actx, opTimeout)
		err := ackEntries(c, r.q.rdb, l, stream, r.opts.Group, ids)
		cancel()
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, errLeaseLost):
			log.Warn("lease lost; batch left to the next holder", "messages", len(ids))
			return false, nil
		case isFatal(err):
			return false, err
		}
		log.Warn("acknowledge batch", "messages", len(ids), "err", err)
		if !l.valid() || (ctx.Err() != nil && failures >= shutdownAckTries) {
			return false, nil
		}
		time.Sleep(queue.Backoff(errorBackoff, failures))
	}
}

// unread resets the delivery counters of entries read but never handed to
// the handler, so they still count as undelivered. Fenced: only while the
// lease is held, so no other consumer can be working on them.
func (r *run) unread(ctx context.Context, stream string, l *lease, xs []redis.XMessage, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	ids := make([]string, len(xs))
	for i, x := range xs {
		ids[i] = x.ID
	}
	if err := unreadEntries(ctx, r.q.rdb, l, stream, r.opts.Group, r.owner, ids); err != nil && !isFatal(err) {
		log.Warn("reset delivery counts", "err", err)
	}
}

// heartbeat registers this run as a live consumer of the topic for one lease
// TTL, drops expired registrations and counts the live ones. Registrations
// are scored with local clocks, so hosts' clocks must agree to well within a
// lease TTL.
func (r *run) heartbeat(ctx context.Context) error {
	key := membersKey(r.topic)
	now := time.Now()
	var card *redis.IntCmd
	_, err := r.q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, key, redis.Z{Score: float64(now.Add(r.opts.LeaseTTL).UnixMilli()), Member: r.owner})
		p.ZRemRangeByScore(ctx, key, "-inf", "("+strconv.FormatInt(now.UnixMilli(), 10))
		card = p.ZCard(ctx, key)
		p.PExpire(ctx, key, 3*r.opts.LeaseTTL)
		return nil
	})
	if err != nil {
		return fmt.Errorf("heartbeat %s: %w", key, err)
	}
	r.members.Store(max(card.Val(), 1))
	return nil
}

// keepMembership heartbeats every TTL/3 until ctx is done, then deregisters
// so the remaining consumers take over this run's share at once.
func (r *run) keepMembership(ctx context.Context) error {
	t := time.NewTicker(r.opts.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
			defer cancel()
			if err := r.q.rdb.ZRem(c, membersKey(r.topic), r.owner).Err(); err != nil && !isFatal(err) {
				r.log.Warn("deregister consumer", "err", err)
			}
			return nil
		case <-t.C:
		}
		if err := r.heartbeat(ctx); err != nil {
			if isFatal(err) {
				return err
			}
			if ctx.Err() == nil {
				r.log.Warn("heartbeat", "err", err)
			}
		}
	}
}

// batch is a handler's batch with the stream entry IDs it came from.
type batch struct {
	ids  []string
	msgs []queue.Message
}

// toBatch converts stream entries. counts holds delivery counters by entry
// ID; entries without one get fallback.
func toBatch(xs []redis.XMessage, counts map[string]int, fallback int) batch {
	out := batch{ids: make([]string, len(xs)), msgs: make([]queue.Message, len(xs))}
	for i, x := range xs {
		attempt, ok := counts[x.ID]
		if !ok {
			attempt = fallback
		}
		out.ids[i] = x.ID
		out.msgs[i] = queue.Message{
			ID:      str(x.Values[fieldID]),
			Key:     str(x.Values[fieldKey]),
			Body:    []byte(str(x.Values[fieldBody])),
			Attempt: max(attempt, 1),
		}
	}
	return out
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// isFatal reports errors after which a Consume call cannot go on.
func isFatal(err error) bool { return errors.Is(err, redis.ErrClosed) }

// isNoGroup reports a missing stream or group. Contains, not HasPrefix:
// inside a script the error may come wrapped in the script's own.
func isNoGroup(err error) bool {
	return err != nil && strings.Contains(err.Error(), "NOGROUP")
}
