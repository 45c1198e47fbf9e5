package notifier

import (
	"context"
	"errors"
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
// final ones to their subscriptions. While Redis is unavailable the Ledger
// answers instead (rereadLedger).
func (n *Notifier) reread(ctx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, storeTimeout)
	results, err := n.src.Results(rctx, ids)
	cancel()
	if errors.Is(err, model.ErrUnavailable) && n.opts.Ledger != nil {
		// store.Guard logs the outage once.
		n.rereadLedger(ctx, ids)
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("re-check stored results", "due", len(ids), "err", err)
		}
		return // Redis is struggling; the next tick tries again.
	}
	// Nothing stored: Redis lost the request's state. What MySQL decided,
	// or the lost rule, ends it (as one of its waiters'), or it waits on.
	var users []string
	for i, id := range ids {
		if results[i].Status != "" {
			continue
		}
		if users == nil {
			users = make([]string, len(ids))
		}
		users[i], _ = n.hub.activeUser(id)
	}
	if users != nil {
		n.fillUnstored(users, ids, results)
	}
	n.hub.touch(ids, time.Now())
	for i, r := range results {
		switch {
		case r.Status == "":
			// Neither Redis nor MySQL has it, and its campaign is gone
			// from Redis or it is no request of it.
			n.notFound(ids[i])
		case r.Status.Final():
			n.settle(r)
		}
	}
}

// rereadLedger is reread while Redis is unavailable: the due ids' results
// MySQL decided (issue 28) go to their waiters in one read, and the others
// wait on. The tick's bounds (RecheckInterval, maxRecheckPerTick) bound
// MySQL's load; a failed read is logged once per tick.
func (n *Notifier) rereadLedger(ctx context.Context, ids []string) {
	lctx, cancel := context.WithTimeout(ctx, storeTimeout)
	found, err := n.decided(lctx, ids)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("re-check results in the ledger while Redis is unavailable", "due", len(ids), "err", err)
		}
		return // the next tick tries again
	}
	n.hub.touch(ids, time.Now())
	for _, id := range ids {
		if r, ok := found[id]; ok {
			n.settle(r)
		}
	}
}

// settle hands the final result r to the active subscriptions of its user
// and tells the ones still waiting, another user's, not_found: a
// subscription made while nothing proved its owner (a request Redis had
// nothing for, or Redis down) ends here.
func (n *Notifier) settle(r model.Result) {
	n.deliver(r, n.hub.publish(r))
	n.notFound(r.RequestID)
}

// notFound tells the active subscriptions of id not_found and drops them.
func (n *Notifier) notFound(id string) {
	data := encodeFrame(errorFrame{Type: "error", Code: codeNotFound, RequestID: id, Message: msgNotFound})
	for _, s := range n.hub.dropActive(id) {
		n.push(s.conn, outMsg{data: data}, 0)
	}
}
