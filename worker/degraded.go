package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Decider decides a campaign's purchases in MySQL while Redis is down, the
// degraded mode (sqlstore.DB). Which side decides is the campaign's, in
// MySQL: TakeOver moves the ledger epoch on, so orders Redis decided before
// it are refused (model.ErrLedgerMoved) and decided again here, and a load
// of Redis (the restore) hands the campaign back, after which Decide is
// refused with model.ErrLedgerMoved.
type Decider interface {
	TakeOver(ctx context.Context, campaignID string) (model.Campaign, error)
	Decide(ctx context.Context, campaignID string, ds []model.Deduction, now time.Time) ([]model.Result, error)
}

// degraded is what a worker knows of the campaigns it decided in MySQL.
type degraded struct {
	mu sync.Mutex
	// since holds the campaigns this worker took over or decided in MySQL,
	// with when it started: each is handed back to Redis (restored)
	// before Redis decides it again.
	since map[string]time.Time
	// verified holds, for each campaign Redis decided here, the count of
	// Redis outages when MySQL last said Redis decides it. After another
	// outage, another process may have taken it over: Redis's state of it
	// is then older than MySQL's, and anything Redis decided from it (a
	// refusal too) would be wiped by the load that hands it back.
	verified map[string]int64
}

// stale reports whether campaign id must be checked against MySQL (and
// handed back if MySQL decides it) before Redis decides it: this worker
// decided it in MySQL, or Redis was out since it was last checked.
func (d *degraded) stale(id string, outages int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.since[id]; ok {
		return true
	}
	v, ok := d.verified[id]
	return ok && v < outages || !ok && outages > 0
}

// checked records that MySQL says Redis decides campaign id, as of
// outages.
func (d *degraded) checked(id string, outages int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.verified == nil || len(d.verified) >= maxCachedTerms {
		d.verified = map[string]int64{}
	}
	d.verified[id] = outages
}

func (d *degraded) mark(id string, now time.Time) (first bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.since[id]; ok {
		return false
	}
	if d.since == nil {
		d.since = map[string]time.Time{}
	}
	d.since[id] = now
	return true
}

// marked lists the campaigns marked.
func (d *degraded) marked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Collect(maps.Keys(d.since))
}

// forget drops id and returns how long it was marked (0 if it was not).
func (d *degraded) forget(id string, now time.Time) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.since[id]
	if !ok {
		return 0
	}
	delete(d.since, id)
	return now.Sub(t)
}

// degrades reports whether a Redis failure of a batch's deduction sends it
// to MySQL: degraded mode is on and Redis did not answer.
func (w *Worker) degrades(err error) bool {
	return w.opts.Decider != nil && errors.Is(err, model.ErrUnavailable)
}

// decideInMySQL decides one campaign's share of a batch in MySQL: the
// campaign is taken over (once per outage in this worker; TakeOver is
// idempotent), and Decide stores its successes as orders in the same
// transaction, so nothing is left to persist. A campaign handed back to
// Redis meanwhile (model.ErrLedgerMoved) holds the batch: its redelivery
// goes through Redis.
func (w *Worker) decideInMySQL(ctx context.Context, b *campaignBatch, ds []model.Deduction) ([]model.Result, error) {
	now := time.Now()
	if w.degraded.mark(b.campaignID, now) {
		if _, err := w.opts.Decider.TakeOver(ctx, b.campaignID); err != nil {
			w.degraded.forget(b.campaignID, now)
			return nil, fmt.Errorf("worker: take over campaign %s in MySQL: %w: %w", b.campaignID, model.ErrHeld, err)
		}
		w.log.Warn("Redis unavailable: deciding the campaign in MySQL", "campaign_id", b.campaignID)
		w.m.Degraded.WithLabelValues("worker").Inc()
	}
	results, err := w.opts.Decider.Decide(ctx, b.campaignID, ds, now)
	if errors.Is(err, model.ErrLedgerMoved) {
		w.handedBack(b.campaignID)
		return nil, fmt.Errorf("worker: campaign %s: %w", b.campaignID, err)
	}
	if err != nil {
		return nil, fmt.Errorf("worker: decide in MySQL: %w: %w", model.ErrHeld, err)
	}
	b.inMySQL = true
	for _, r := range results {
		w.m.DegradedDecisions.WithLabelValues("worker", string(r.Status)).Inc()
	}
	return results, nil
}

// handBack is called before Redis decides a campaign this worker decided
// in MySQL: the restore loads Redis from MySQL under a new epoch, which
// hands the campaign back (counting the units MySQL sold). Until MySQL
// says Redis decides it again, the batch is held: Redis's state is older
// than the ledger's.
func (w *Worker) handBack(ctx context.Context, campaignID string) error {
	if w.opts.Restorer != nil {
		_, _ = w.opts.Restorer.Restore(ctx, campaignID, "handback")
	}
	c, err := w.orders.Campaign(ctx, campaignID)
	if err != nil {
		return fmt.Errorf("worker: hand campaign %s back to Redis: %w: %w", campaignID, model.ErrHeld, err)
	}
	if c.DecidedInMySQL {
		return fmt.Errorf("worker: campaign %s still decided in MySQL: %w", campaignID, model.ErrLedgerMoved)
	}
	w.handedBack(campaignID)
	return nil
}

// RedisAnswers tells the worker that Redis answers again and which
// campaigns MySQL still decides (the process's hand-back loop does, each
// second): those it decided in MySQL and MySQL no longer decides stop
// being counted as such even when no batch of theirs comes. Their next
// batch is still checked (handBack) before Redis decides it.
func (w *Worker) RedisAnswers(decidedInMySQL []string) {
	for _, id := range w.degraded.marked() {
		if !slices.Contains(decidedInMySQL, id) {
			w.handedBack(id)
		}
	}
}

func (w *Worker) handedBack(campaignID string) {
	if d := w.degraded.forget(campaignID, time.Now()); d > 0 {
		w.log.Info("campaign decided in Redis again", "campaign_id", campaignID, "degraded_for", d.Round(time.Millisecond))
		w.m.Degraded.WithLabelValues("worker").Dec()
		w.m.DegradedSeconds.WithLabelValues("worker").Add(d.Seconds())
	}
}
