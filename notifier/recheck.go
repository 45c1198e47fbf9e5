package notifier

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/model"
)

// recheckLoop re-reads the stored results of subscriptions that have waited
// longer than RecheckInterval, so a publication lost during a Redis reconnect
// only delays a result.
func (n *Notifier) recheckLoop(ctx context.Context) {
	every(ctx, n.opts.RecheckInterval, func() { n.recheck(ctx, time.Now().Add(-n.opts.RecheckInterval)) })
}

// every calls fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// recheck re-reads, in one round trip, the stored results of the request ids
// last read at or before cutoff (at most maxRecheckPerTick, the oldest
// first).
func (n *Notifier) recheck(ctx context.Context, cutoff time.Time) {
	n.reread(ctx, n.hub.due(cutoff, maxRecheckPerTick))
}

// recheckTag re-reads the stored results of every request of tag with an
// active subscription, maxRecheckPerTick to a round trip: its results
// subscription was re-established, and what was published before that was
// not received.
func (n *Notifier) recheckTag(ctx context.Context, tag string) {
	ids := n.hub.waitingOn(tag)
	for start := 0; start < len(ids) && ctx.Err() == nil; start += maxRecheckPerTick {
		n.reread(ctx, ids[start:min(start+maxRecheckPerTick, len(ids))])
	}
}

// reread reads the stored results of ids in one round trip and hands the
// final ones to their subscriptions.
func (n *Notifier) reread(ctx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, storeTimeout)
	results, err := n.src.Results(rctx, ids)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("re-check stored results", "due", len(ids), "err", err)
		}
		return // Redis is struggling; the next tick tries again.
	}
	// Nothing stored: Redis lost the request's state. Its order, or the
	// lost rule, ends it (as one of its waiters'), or it waits on.
	for i, id := range ids {
		if results[i].Status != "" {
			continue
		}
		if user, ok := n.hub.activeUser(id); ok {
			one := []model.Result{{}}
			n.fillUnstored(user, []string{id}, one)
			results[i] = one[0]
		}
	}
	n.hub.touch(ids, time.Now())
	notFound := func(id string) {
		data := encodeFrame(errorFrame{Type: "error", Code: codeNotFound, RequestID: id, Message: msgNotFound})
		for _, s := range n.hub.dropActive(id) {
			n.push(s.conn, outMsg{data: data}, 0)
		}
	}
	for i, r := range results {
		switch {
		case r.Status == "":
			// Neither Redis nor MySQL has it, and its campaign is gone
			// from Redis or it is no request of it.
			notFound(ids[i])
		case r.Status.Final():
			n.deliver(r, n.hub.publish(r))
			// Who still waits is another user: a subscription to a
			// request with nothing stored could not be proved the
			// caller's.
			notFound(ids[i])
		}
	}
}
