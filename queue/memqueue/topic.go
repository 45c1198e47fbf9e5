package memqueue

import (
	"bytes"
	"context"
	"sync"
	"time"

	"flashsale/queue"
)

// topic holds one topic's partitions. A single mutex guards them all: the
// queue is for tests and small embedded deployments, not for contention.
type topic struct {
	opts Options

	mu      sync.Mutex
	parts   []*partition
	changed chan struct{} // closed and replaced when a batch may have become available
	next    int           // where the next scan starts, so busy topics share consumers fairly
}

// partition is a FIFO of messages with at most one batch out at a time; that
// single batch in flight is what gives per-key order across consumers.
type partition struct {
	// msgs are the unacknowledged messages in publish order. Attempt holds
	// the number of deliveries so far. A batch is always a prefix of msgs.
	msgs      []queue.Message
	busy      *batch    // the batch in flight, nil if none
	notBefore time.Time // redelivery backoff after a failed batch
	failures  int       // consecutive failed batches, for the backoff
}

// batch is a prefix of a partition handed to one handler call.
type batch struct {
	part  *partition
	owner *Consumer
	msgs  []queue.Message
}

func newTopic(opts Options) *topic {
	tp := &topic{opts: opts, changed: make(chan struct{})}
	tp.parts = make([]*partition, opts.Partitions)
	for i := range tp.parts {
		tp.parts[i] = &partition{}
	}
	return tp
}

// publish appends copies of msgs, so callers may reuse their buffers.
func (tp *topic) publish(msgs []queue.Message) {
	if len(msgs) == 0 {
		return
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for _, m := range msgs {
		m.Body = bytes.Clone(m.Body)
		m.Attempt = 0
		p := tp.parts[queue.PartitionOf(m.Key, len(tp.parts))]
		p.msgs = append(p.msgs, m)
	}
	tp.broadcastLocked()
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
			b, wait = tp.pickLocked(c, time.Now())
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
		if p.busy != nil || len(p.msgs) == 0 {
			continue
		}
		if d := p.notBefore.Sub(now); d > 0 {
			if wait == 0 || d < wait {
				wait = d
			}
			continue
		}
		tp.next = idx + 1
		k := min(len(p.msgs), tp.opts.BatchSize)
		out := make([]queue.Message, k)
		for j := range k {
			p.msgs[j].Attempt++
			out[j] = p.msgs[j]
			// A fresh copy per delivery, as a network driver would give:
			// a handler that scribbles on a body cannot change a redelivery.
			out[j].Body = bytes.Clone(p.msgs[j].Body)
		}
		p.busy = &batch{part: p, owner: c, msgs: out}
		return p.busy, 0
	}
	return nil, wait
}

// finish acknowledges b (err == nil) or schedules its redelivery. A batch
// abandoned by a crash is ignored: its messages were already handed back.
func (tp *topic) finish(b *batch, err error) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	p := b.part
	if p.busy != b {
		return
	}
	p.busy = nil
	if err == nil {
		n := len(b.msgs)
		clear(p.msgs[:n]) // drop references to the bodies
		p.msgs = p.msgs[n:]
		p.failures = 0
		p.notBefore = time.Time{}
	} else {
		p.failures++
		p.notBefore = time.Now().Add(backoff(tp.opts.RedeliveryDelay, p.failures))
	}
	tp.broadcastLocked()
}

// abandon hands every batch that c has in flight back to the partitions, as
// if c's process had died: the next delivery counts as a new attempt.
func (tp *topic) abandon(c *Consumer) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for _, p := range tp.parts {
		if p.busy != nil && p.busy.owner == c {
			p.busy = nil
		}
	}
	tp.broadcastLocked()
}

func (tp *topic) broadcastLocked() {
	close(tp.changed)
	tp.changed = make(chan struct{})
}
