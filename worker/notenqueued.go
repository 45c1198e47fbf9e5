package worker

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Every admission is on record in Redis, written with its queued marker
// (store.SweepNotEnqueued). A request still queued longer than the longest
// possible queue delay after its admission, that the queue has moved past,
// was never stored (its gateway died between admitting and publishing, or
// the publish's outcome was unknown and the message was lost):
// SweepNotEnqueued gives it a final rejected result (not_enqueued), so it
// does not stay queued for good.
//
// Every worker process sweeps every campaign it can find in MySQL (the
// durable record, so no index in Redis can be lost or raced), so the sweep
// does not wait for the worker of one partition; no worker at all means no
// sweep, which is right: nothing is consumed either.

// SweepNotEnqueued sweeps the campaigns whose sale ended less than the key
// retention ago (the ones Redis may hold) every tenth of maxDelay until ctx
// ends, and publishes the results it stores like any other final result.
// It also finishes the stock transfers a dead worker left half done. The
// first sweep comes a whole maxDelay after the start: workers that start
// after an outage drain the backlog first. A failed sweep is logged; the
// next one takes up what it left.
func (w *Worker) SweepNotEnqueued(ctx context.Context, maxDelay time.Duration) error {
	interval := max(maxDelay/10, 100*time.Millisecond)
	t := time.NewTimer(maxDelay)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		w.sweepNotEnqueued(ctx, maxDelay)
		t.Reset(interval)
	}
}

func (w *Worker) sweepNotEnqueued(ctx context.Context, maxDelay time.Duration) {
	// The same loop finishes the stock transfers a dead worker left half
	// done (the buckets of a campaign, store.RecoverTransfers).
	if err := w.stock.RecoverTransfers(ctx); err != nil && ctx.Err() == nil {
		w.log.Warn("recover stock transfers", "err", err)
	}
	campaigns, err := w.orders.CampaignsEndingAfter(ctx, time.Now().Add(-w.opts.KeyRetention))
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("sweep requests not enqueued: list campaigns", "err", err)
		}
		return
	}
	var tags []string
	for _, c := range campaigns {
		for b := range max(c.Buckets, 1) {
			tags = append(tags, model.BucketTag(c.ID, b, c.Buckets))
		}
	}
	results, err := w.stock.SweepNotEnqueued(ctx, tags, maxDelay)
	if err != nil && ctx.Err() == nil {
		w.log.Warn("sweep requests not enqueued", "err", err)
	}
	if len(results) == 0 {
		return
	}
	w.m.NotEnqueued.Add(float64(len(results)))
	for _, r := range results {
		w.log.Warn("request rejected as not enqueued: still queued, and the queue has moved past it",
			"request_id", r.RequestID, "campaign_id", r.CampaignID, "user_id", r.UserID, "max_queue_delay", maxDelay)
	}
	if err := w.stock.PublishResults(ctx, results); err != nil {
		// Results are stored in Redis; notifiers re-read what they wait on.
		w.log.Warn("publish results", "count", len(results), "err", err)
	}
}
