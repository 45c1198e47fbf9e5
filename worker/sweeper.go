package worker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/flashsale/flashsale/model"
)

// A worker process's sweeper runs its periodic tasks, each on its own
// timer and named in its log lines (task=...):
//
//   - the not-enqueued sweep: an admitted request still queued once the
//     queue has moved past it (a request admitted worker.not_enqueued_grace
//     after it decided, or its sale ended worker.max_queue_delay ago) was
//     never stored (its gateway died between admitting and publishing, or
//     the publish's outcome was unknown and the message was lost):
//     store.SweepNotEnqueued gives it a final rejected result
//     (not_enqueued), so it does not stay queued for good;
//   - transfer recovery: the stock transfers between a campaign's buckets
//     that a dead worker left half done (store.RecoverTransfers);
//   - the expiry sweep: the unpaid orders still pending payment.grace past
//     their window, their expiry message lost, expired from MySQL
//     (Expiry.SweepTask).
//
// Every worker process's not-enqueued sweep looks at every campaign it can
// find in MySQL (the durable record, so no index in Redis can be lost or
// raced), so it does not wait for the worker of one partition; no worker at
// all means no sweep, which is right: nothing is consumed either.

// Task is one of a Sweeper's periodic tasks.
type Task struct {
	Name  string        // in its log lines
	First time.Duration // from the start to the first run
	Every time.Duration // from the end of a run to the next
	// Run does the task once; log carries its name. A failed run is
	// logged, and the next takes up what it left.
	Run func(ctx context.Context, log *slog.Logger) error
}

// Sweeper runs periodic tasks, each on its own timer, until ctx ends.
type Sweeper struct {
	Log   *slog.Logger
	Tasks []Task
}

// Run runs every task until ctx ends, and returns nil then.
func (s Sweeper) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, t := range s.Tasks {
		wg.Go(func() { t.loop(ctx, s.Log.With("task", t.Name)) })
	}
	wg.Wait()
	return nil
}

func (t Task) loop(ctx context.Context, log *slog.Logger) {
	timer := time.NewTimer(t.First)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if err := t.Run(ctx, log); err != nil && ctx.Err() == nil {
			log.Warn("periodic task failed; its next run takes up what it left", "err", err)
		}
		timer.Reset(t.Every)
	}
}

// Tasks returns the worker's periodic tasks: the not-enqueued sweep of the
// campaigns whose sale ended less than the key retention ago (the ones
// Redis may hold), and transfer recovery. The sweep runs every quarter of
// grace, from 100 ms to 1 s, from the start: an orphan ends about grace
// after the queue moved past it, and each run marks how far admissions
// have come, which later runs need (notenqueued.lua). Only its rule for
// the end of a sale waits a whole maxDelay after the start: workers that
// start after an outage drain the backlog first (the queue moving past a
// request needs no such wait). Transfer recovery runs every tenth of
// maxDelay (at least 100 ms), the first time maxDelay after the start.
func (w *Worker) Tasks(grace, maxDelay time.Duration) []Task {
	start := time.Now()
	sweep := min(max(grace/4, 100*time.Millisecond), time.Second)
	every := max(maxDelay/10, 100*time.Millisecond)
	// The campaigns to sweep are read from MySQL every tenth of maxDelay,
	// not on every run: a campaign is created well before its sale, and a
	// sweep every second must not be a query every second.
	var tags []string
	var listed time.Time
	return []Task{
		{Name: "not-enqueued sweep", Every: sweep, Run: func(ctx context.Context, log *slog.Logger) error {
			if listed.IsZero() || time.Since(listed) >= every {
				t, err := w.sweptTags(ctx)
				if err != nil {
					return err
				}
				tags, listed = t, time.Now()
			}
			ended := maxDelay
			if time.Since(start) < maxDelay {
				ended = 0 // off
			}
			return w.sweepNotEnqueued(ctx, log, tags, grace, ended)
		}},
		{Name: "transfer recovery", First: maxDelay, Every: every, Run: func(ctx context.Context, _ *slog.Logger) error {
			return w.stock.RecoverTransfers(ctx)
		}},
	}
}

// sweptTags lists the tags the not-enqueued sweep looks at: every bucket of
// every campaign whose sale ended less than the key retention ago (the
// ones Redis may hold), from MySQL.
func (w *Worker) sweptTags(ctx context.Context) ([]string, error) {
	campaigns, err := w.orders.CampaignsEndingAfter(ctx, time.Now().Add(-w.opts.KeyRetention))
	if err != nil {
		return nil, fmt.Errorf("list campaigns: %w", err)
	}
	var tags []string
	for _, c := range campaigns {
		for b := range max(c.Buckets, 1) {
			tags = append(tags, model.BucketTag(c.ID, b, c.Buckets))
		}
	}
	return tags, nil
}

// loggedRequests is how many request ids a line about many requests names.
const loggedRequests = 5

// sweepNotEnqueued runs the not-enqueued sweep once, and publishes the
// results it stores like any other final result.
func (w *Worker) sweepNotEnqueued(ctx context.Context, log *slog.Logger, tags []string, grace, maxDelay time.Duration) error {
	results, err := w.stock.SweepNotEnqueued(ctx, tags, grace, maxDelay)
	if len(results) == 0 {
		return err
	}
	w.m.NotEnqueued.Add(float64(len(results)))
	ids := make([]string, 0, loggedRequests)
	for _, r := range results[:min(len(results), loggedRequests)] {
		ids = append(ids, r.RequestID)
	}
	log.Warn("requests rejected as not enqueued: still queued, and the queue has moved past them",
		"count", len(results), "request_ids", ids, "not_enqueued_grace", grace)
	if perr := w.stock.PublishResults(ctx, results); perr != nil {
		// Results are stored in Redis; notifiers re-read what they wait on.
		log.Warn("publish results", "count", len(results), "err", perr)
	}
	return err
}
