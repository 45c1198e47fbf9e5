package memqueue

import (
	"bytes"
	"container/heap"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/flashsale/flashsale/queue"
)

// topic holds one topic's partitions. A single mutex guards them all: the
// queue is for tests and small embedded deployments, not for contention.
type topic struct {
	opts Options

	mu      sync.Mutex
	parts   []*partition
	changed chan struct{} // closed and replaced when a batch may have become available
	next    int           // where the next scan starts, so busy topics share consumers fairly
	// delayed holds the messages published with a delay that are not due
	// yet, earliest first. They join their partitions when due, under this
	// lock, whenever a consumer looks for a batch or a message is published;
	// a waiting consumer sleeps no longer than until the earliest is due. So
	// no goroutine or timer outlives Close, which drops them with the topic.
	delayed delayHeap
	seq     uint64 // orders delayed publishes due at the same instant
}

// delayed is the messages of one delayed publish.
type delayed struct {
	at   time.Time
	seq  uint64
	msgs []queue.Message
}

// delayHeap is a min-heap of delayed publishes by due time, then publish
// order.
type delayHeap []*delayed

func (h delayHeap) Len() int { return len(h) }
func (h delayHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h delayHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)   { *h = append(*h, x.(*delayed)) }
func (h *delayHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return d
}

// partition is a FIFO of messages. Its batches in flight (out) are
// consecutive prefixes of msgs, all handed to one consumer: at most one in its
// first step and, with a PipelineHandler, one more finishing ahead of it.
// That is what gives per-key order across consumers.
type partition struct {
	// msgs are the unacknowledged messages in publish order. Attempt holds
	// the number of deliveries so far.
	msgs      []queue.Message
	out       []*batch  // handed out, oldest first; out[0] is the only one finishing
	notBefore time.Time // redelivery backoff after a failed batch
	failures  int       // consecutive failed batches, for the backoff
}

// batchState is where a batch in flight is.
type batchState int

const (
	deciding  batchState = iota // in the handler's first step
	waiting                     // first step done; its Finish waits for the batch ahead
	finishing                   // Finish running
)

// batch is a slice of a partition handed to one consumer.
type batch struct {
	part   *partition
	owner  *Consumer
	msgs   []queue.Message
	state  batchState
	finish queue.Finish // set once the first step returned one
	// doomed is set when a batch ahead failed during this one's first
	// step: its result is ignored and it is redelivered with the failed one.
	doomed bool
}

func newTopic(opts Options) *topic {
	tp := &topic{opts: opts, changed: make(chan struct{})}
	tp.parts = make([]*partition, opts.Partitions)
	for i := range tp.parts {
		tp.parts[i] = &partition{}
	}
	return tp
}

// publish appends copies of msgs, so callers may reuse their buffers. The
// delayed messages already due go first: a partition holds its messages in
// the order they became due.
func (tp *topic) publish(msgs []queue.Message) {
	if len(msgs) == 0 {
		return
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.releaseLocked(time.Now())
	for _, m := range msgs {
		m.Body = bytes.Clone(m.Body)
		m.Attempt = 0
		tp.appendLocked(m)
	}
	tp.broadcastLocked()
}

// publishDelayed stores copies of msgs until at.
func (tp *topic) publishDelayed(msgs []queue.Message, at time.Time) {
	if len(msgs) == 0 {
		return
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.seq++
	heap.Push(&tp.delayed, &delayed{at: at, seq: tp.seq, msgs: copies(msgs)})
	// Waiting consumers recompute how long to sleep.
	tp.broadcastLocked()
}

// copies returns msgs with bodies of their own and no deliveries yet.
func copies(msgs []queue.Message) []queue.Message {
	out := make([]queue.Message, len(msgs))
	for i, m := range msgs {
		m.Body = bytes.Clone(m.Body)
		m.Attempt = 0
		out[i] = m
	}
	return out
}

// appendLocked appends m to its partition.
func (tp *topic) appendLocked(m queue.Message) {
	p := tp.parts[queue.PartitionOf(m.Key, len(tp.parts))]
	p.msgs = append(p.msgs, m)
}

// releaseLocked appends the delayed messages due by now to their
// partitions, in due order. It returns how long until the next is due (0 if
// none is waiting) and whether it released any.
func (tp *topic) releaseLocked(now time.Time) (wait time.Duration, released bool) {
	for len(tp.delayed) > 0 {
		next := tp.delayed[0]
		if now.Before(next.at) {
			return next.at.Sub(now), released
		}
		heap.Pop(&tp.delayed)
		for _, m := range next.msgs {
			tp.appendLocked(m)
		}
		released = true
	}
	return 0, released
}

// take waits for a partition that has messages, no batch in flight and no
// pending backoff, and hands its head out as a batch. It returns nil once ctx
// is done, the queue is closed or the consumer has crashed.
func (tp *topic) take(ctx context.Context, c *Consumer) *batch {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.q.done:
			return nil
		case <-c.crashed:
			return nil
		default:
		}

		tp.mu.Lock()
		var b *batch
		var wait time.Duration
		// Checked under the lock that abandon takes, so a crash cannot slip
		// between the check and the pick and leave a batch nobody abandons.
		if !c.isCrashed() {
			now := time.Now()
			untilDue, released := tp.releaseLocked(now)
			if released {
				tp.broadcastLocked() // other consumers may take what this one cannot
			}
			b, wait = tp.pickLocked(c, now)
			if wait == 0 || (untilDue > 0 && untilDue < wait) {
				wait = untilDue
			}
		}
		changed := tp.changed
		tp.mu.Unlock()
		if b != nil {
			return b
		}

		var timer *time.Timer
		var timeout <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			timeout = timer.C
		}
		select {
		case <-ctx.Done():
		case <-c.q.done:
		case <-c.crashed:
		case <-changed:
		case <-timeout:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// pickLocked returns a batch, or nil and how long until a backed-off
// partition becomes ready (0 if none is waiting).
func (tp *topic) pickLocked(c *Consumer, now time.Time) (*batch, time.Duration) {
	var wait time.Duration
	n := len(tp.parts)
	for i := range n {
		idx := (tp.next + i) % n
		p := tp.parts[idx]
		taken := p.taken()
		if !p.canTake(c) || taken == len(p.msgs) {
			continue
		}
		if d := p.notBefore.Sub(now); d > 0 {
			if wait == 0 || d < wait {
				wait = d
			}
			continue
		}
		tp.next = idx + 1
		k := min(len(p.msgs)-taken, tp.opts.BatchSize)
		out := make([]queue.Message, k)
		for j := range k {
			m := &p.msgs[taken+j]
			m.Attempt++
			out[j] = *m
			// A fresh copy per delivery, as a network driver would give:
			// a handler that scribbles on a body cannot change a redelivery.
			out[j].Body = bytes.Clone(m.Body)
		}
		b := &batch{part: p, owner: c, msgs: out}
		p.out = append(p.out, b)
		return b, 0
	}
	return nil, wait
}

// taken counts the messages in flight: the prefix of msgs that out covers.
func (p *partition) taken() int {
	n := 0
	for _, b := range p.out {
		n += len(b.msgs)
	}
	return n
}

// canTake reports whether c may take the partition's next batch: none is in
// its first step, at most one is ahead of it, and those ahead are c's.
func (p *partition) canTake(c *Consumer) bool {
	if len(p.out) >= 2 {
		return false
	}
	for _, b := range p.out {
		if b.state == deciding || b.owner != c {
			return false
		}
	}
	return true
}

// holds reports whether b is still in flight (not abandoned by a crash).
func (p *partition) holds(b *batch) bool {
	for _, o := range p.out {
		if o == b {
			return true
		}
	}
	return false
}

// remove drops b from out.
func (p *partition) remove(b *batch) {
	for i, o := range p.out {
		if o == b {
			p.out = append(p.out[:i], p.out[i+1:]...)
			return
		}
	}
}

// decided records the end of b's first step: err settles it
// (queue.Settle) for redelivery, a nil finish acknowledges it (once the
// batches ahead are), otherwise its Finish is queued behind them. It returns
// the batch whose Finish the caller must now run, if any. Results of
// abandoned or doomed batches are ignored.
func (tp *topic) decided(b *batch, finish queue.Finish, err error, log *slog.Logger) *batch {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	defer tp.broadcastLocked()
	p := b.part
	switch {
	case !p.holds(b):
		return nil
	case b.doomed:
		p.remove(b)
		return nil
	case err != nil:
		tp.failedLocked(b, err, log)
		// Only finishing batches can be ahead; they go on.
		p.remove(b)
		return nil
	}
	b.state, b.finish = waiting, finish
	return p.advance()
}

// finished records the end of b's Finish and returns the next batch whose
// Finish the caller must run, if any. A failure sends b and every batch
// behind it back for redelivery in order.
func (tp *topic) finished(b *batch, err error, log *slog.Logger) *batch {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	defer tp.broadcastLocked()
	p := b.part
	if !p.holds(b) {
		return nil
	}
	if err != nil {
		tp.failedLocked(b, err, log, "step", "finish")
		kept := p.out[:0]
		for _, o := range p.out {
			if o.state == deciding {
				o.doomed = true
				kept = append(kept, o)
			}
		}
		clear(p.out[len(kept):])
		p.out = kept
		return nil
	}
	b.state, b.finish = waiting, nil
	return p.advance()
}

// advance acknowledges the leading batches that have nothing left to run
// and starts the Finish of the next one, which it returns.
func (p *partition) advance() *batch {
	for len(p.out) > 0 {
		head := p.out[0]
		if head.state != waiting || head.doomed {
			return nil
		}
		if head.finish != nil {
			head.state = finishing
			return head
		}
		n := len(head.msgs)
		clear(p.msgs[:n]) // drop references to the bodies
		p.msgs = p.msgs[n:]
		p.out = p.out[1:]
		p.failures = 0
		p.notBefore = time.Time{}
	}
	return nil
}

// failedLocked settles a step of b, still in flight, that returned err
// (queue.Settle): a held batch's messages keep the Attempt they had (their
// take counted this delivery), and the partition waits its back-off.
func (tp *topic) failedLocked(b *batch, err error, log *slog.Logger, attrs ...any) {
	p := b.part
	p.failures++
	if !queue.Settle(log, b.msgs, err, p.failures, attrs...).Counts() {
		off := 0
		for _, o := range p.out[:slices.Index(p.out, b)] {
			off += len(o.msgs)
		}
		for j := range b.msgs {
			p.msgs[off+j].Attempt--
		}
	}
	p.notBefore = time.Now().Add(queue.Backoff(tp.opts.RedeliveryDelay, p.failures))
}

// abandon hands every batch that c has in flight back to the partitions, as
// if c's process had died: the next delivery counts as a new attempt.
func (tp *topic) abandon(c *Consumer) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for _, p := range tp.parts {
		if len(p.out) > 0 && p.out[0].owner == c {
			clear(p.out)
			p.out = nil
		}
	}
	tp.broadcastLocked()
}

func (tp *topic) broadcastLocked() {
	close(tp.changed)
	tp.changed = make(chan struct{})
}
