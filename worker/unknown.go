package worker

import (
	"context"
	"time"
)

// A gateway whose publish had an unknown outcome (queue.ErrUnknown) keeps
// its requests admitted and records them; deduct.lua takes off the record
// every request a worker sees. What is still on it after the longest
// possible queue delay was never stored: SweepUnknown gives it a final
// rejected result (not_enqueued), so it does not stay queued for good.
//
// Every worker process sweeps every campaign of its topic, so the sweep
// does not wait for the worker of one partition; no worker at all means no
// sweep, which is right: nothing is consumed either.

// SweepUnknown sweeps topic's requests of unknown publish outcome every
// tenth of maxDelay until ctx ends (store.SweepUnknown), and publishes the
// results it stores like any other final result. The first sweep comes a
// whole maxDelay after the start: workers that start after an outage drain
// the backlog first, and the delay counts from the time they consume again,
// not from when the messages were sent. A failed sweep is logged; the next
// one takes up what it left.
func (w *Worker) SweepUnknown(ctx context.Context, topic string, maxDelay time.Duration) error {
	interval := max(maxDelay/10, 100*time.Millisecond)
	t := time.NewTimer(maxDelay)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		w.sweepUnknown(ctx, topic, maxDelay)
		t.Reset(interval)
	}
}

func (w *Worker) sweepUnknown(ctx context.Context, topic string, maxDelay time.Duration) {
	// The same loop finishes the stock transfers a dead worker left half
	// done (the buckets of a campaign, store.RecoverTransfers).
	if err := w.stock.RecoverTransfers(ctx); err != nil && ctx.Err() == nil {
		w.log.Warn("recover stock transfers", "err", err)
	}
	results, err := w.stock.SweepUnknown(ctx, topic, maxDelay)
	if err != nil && ctx.Err() == nil {
		w.log.Warn("sweep requests of unknown publish outcome", "err", err)
	}
	if len(results) == 0 {
		return
	}
	w.m.NotEnqueued.Add(float64(len(results)))
	for _, r := range results {
		w.log.Warn("request rejected as not enqueued: its publish outcome was unknown and no worker saw it",
			"request_id", r.RequestID, "campaign_id", r.CampaignID, "user_id", r.UserID, "max_queue_delay", maxDelay)
	}
	if err := w.stock.PublishResults(ctx, results); err != nil {
		// Results are stored in Redis; notifiers re-read what they wait on.
		w.log.Warn("publish results", "count", len(results), "err", err)
	}
}
