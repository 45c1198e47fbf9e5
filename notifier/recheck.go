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
	t := time.NewTicker(n.opts.RecheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.recheck(ctx)
		}
	}
}

func (n *Notifier) recheck(ctx context.Context) {
	ids := n.hub.due(time.Now().Add(-n.opts.RecheckInterval), maxRecheckPerTick)
	for _, id := range ids {
		if ctx.Err() != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, storeTimeout)
		r, err := n.src.Result(rctx, id)
		cancel()
		switch {
		case errors.Is(err, model.ErrNotFound):
			// The request vanished (campaign reloaded): it will never end.
			data := encodeFrame(errorFrame{Type: "error", Code: codeNotFound, RequestID: id, Message: msgNotFound})
			for _, s := range n.hub.dropActive(id) {
				n.push(s.conn, outMsg{data: data}, 0)
			}
			continue
		case err != nil:
			if ctx.Err() == nil {
				n.log.Warn("re-check stored results", "request_id", id, "due", len(ids), "err", err)
			}
			return // Redis is struggling; the next tick tries again.
		}
		n.hub.touch(id, time.Now())
		if r.Status.Final() {
			n.deliver(r, n.hub.publish(r))
		}
	}
}
