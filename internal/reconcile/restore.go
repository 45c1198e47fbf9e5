package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/model"
)

// Restoring is the Redis side of a restore (store.Store): a load's
// writes, whether Redis lost a campaign (Behind), the restore lock, and
// the reset event that tells every gateway.
type Restoring interface {
	Projection
	Behind(ctx context.Context, c model.Campaign) (bool, error)
	LockRestore(ctx context.Context, campaignID string, ttl time.Duration) (token string, err error)
	UnlockRestore(ctx context.Context, campaignID, token string) (released bool, err error)
	PublishEvent(ctx context.Context, e model.Event) error
}

// RestorerOptions tune a Restorer.
type RestorerOptions struct {
	// Interval is the least time between two attempts on one campaign in
	// this process: a lost campaign is noticed by every purchase and batch.
	Interval time.Duration // default 1s
	// LockTTL frees the restore lock of a process that died holding it.
	LockTTL time.Duration // default 10s
	// Timeout bounds one attempt, the load included.
	Timeout time.Duration // default 1m
	Now     func() time.Time
}

func (o RestorerOptions) withDefaults() RestorerOptions {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.LockTTL <= 0 {
		o.LockTTL = 10 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Restorer rebuilds a campaign Redis lost from MySQL without an operator:
// the restore. The first role to notice the loss (a gateway's admit.lua,
// a worker's deduct.lua, or MySQL refusing a worker's orders because
// Redis is at an older epoch) calls Restore; one process at a time loads
// the campaign (Load) under the restore lock, and the sale resumes.
type Restorer struct {
	log    *slog.Logger
	ledger Ledger
	redis  Restoring
	m      *metrics.Metrics
	opts   RestorerOptions

	mu       sync.Mutex
	attempts map[string]attempt // by campaign
}

// attempt is this process's last restore attempt on a campaign.
type attempt struct {
	running bool
	ended   time.Time
}

// NewRestorer returns a Restorer.
func NewRestorer(log *slog.Logger, ledger Ledger, redis Restoring, m *metrics.Metrics, opts RestorerOptions) *Restorer {
	return &Restorer{log: log, ledger: ledger, redis: redis, m: m, opts: opts.withDefaults(), attempts: map[string]attempt{}}
}

// Restore rebuilds campaign id from MySQL if Redis lost it: the campaign
// was loaded before (its epoch in MySQL above 0) and its sale is not over,
// but Redis has none of it or an older epoch (store.Behind). Anything
// else changes nothing: a campaign never loaded stays not loaded until an
// operator's preload, and one whose sale is over stays as it is (an
// archived campaign looks the same as a lost one). trigger names what
// noticed the loss, for the log and the metric. rebuilt says whether this
// call loaded the campaign.
//
// An attempt on a campaign that started less than Interval after this
// process's last one ended, or while it runs, returns at once: the
// callers are every purchase and batch of the campaign. Across
// processes, the restore lock lets one load at a time, and the check is
// made again under it, so a campaign is loaded once however many notice.
// Loads that overlap all the same (a lock that outlived its TTL) are safe:
// each moves the epoch on and the last one wins (Load).
func (r *Restorer) Restore(ctx context.Context, id, trigger string) (rebuilt bool, err error) {
	if !r.begin(id) {
		return false, nil
	}
	defer r.end(id)
	return r.attempt(ctx, id, trigger)
}

// RestoreInBackground is Restore without waiting for it, for a caller that
// must answer at once (a purchase, a poll): the attempt runs in a
// goroutine of its own, and rebuilt is called there if it rebuilt the
// campaign. It starts no goroutine when Restore would return at once, so
// this process runs at most one per campaign however many callers notice
// the loss.
func (r *Restorer) RestoreInBackground(ctx context.Context, id, trigger string, rebuilt func()) {
	if !r.begin(id) {
		return
	}
	go func() {
		defer r.end(id)
		// attempt logs a failure; the next caller tries again.
		if ok, _ := r.attempt(ctx, id, trigger); ok && rebuilt != nil {
			rebuilt()
		}
	}()
}

// attempt is one restore of campaign id, begun (begin) by the caller.
func (r *Restorer) attempt(ctx context.Context, id, trigger string) (rebuilt bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	start := time.Now()
	rebuilt, epoch, orders, err := r.restore(ctx, id)
	if err != nil {
		r.log.Warn("restore from MySQL failed; the next purchase or batch tries again", "campaign_id", id, "trigger", trigger, "err", err)
		return false, err
	}
	if rebuilt {
		r.m.Restores.WithLabelValues(trigger).Inc()
		r.log.Warn("campaign lost in Redis, restored from MySQL", "campaign_id", id, "epoch", epoch, "orders", orders,
			"trigger", trigger, "duration", time.Since(start).Round(time.Millisecond))
	}
	return rebuilt, nil
}

// NeedsRestore reports whether campaign id is one Restore would rebuild
// now: it was loaded before, its sale is not over, and Redis lacks its
// current load. A reader that finds nothing in Redis asks it to tell a
// lost campaign (restore it, and wait) from one never loaded or whose
// sale is over; c is the campaign as MySQL holds it (zero when MySQL has
// none), for the reader to tell those apart.
func (r *Restorer) NeedsRestore(ctx context.Context, id string) (c model.Campaign, lost bool, err error) {
	return r.lost(ctx, id)
}

// begin reports whether an attempt on campaign id may start now, and
// marks it running if so.
func (r *Restorer) begin(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.Now()
	a, ok := r.attempts[id]
	if ok && (a.running || now.Sub(a.ended) < r.opts.Interval) {
		return false
	}
	// Forget the campaigns not tried for a while, so the map holds the
	// recent ones only.
	for c, a := range r.attempts {
		if !a.running && now.Sub(a.ended) >= r.opts.Interval {
			delete(r.attempts, c)
		}
	}
	r.attempts[id] = attempt{running: true}
	return true
}

func (r *Restorer) end(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts[id] = attempt{ended: r.opts.Now()}
}

// restore checks campaign id, and under the restore lock checks it again
// and loads it. A campaign that needs nothing is checked without the lock,
// the usual case of a worker's held batch (a paused or never loaded
// campaign).
func (r *Restorer) restore(ctx context.Context, id string) (rebuilt bool, epoch model.Epoch, orders int, err error) {
	if _, lost, err := r.lost(ctx, id); err != nil || !lost {
		return false, 0, 0, err
	}
	token, err := r.redis.LockRestore(ctx, id, r.opts.LockTTL)
	if err != nil || token == "" {
		return false, 0, 0, err // "": another process restores it
	}
	defer func() {
		// Released even when ctx ended: the lock would hold others off
		// for its TTL.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, uerr := r.redis.UnlockRestore(uctx, id, token); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	// Under the lock: another process may have loaded it since.
	if _, lost, err := r.lost(ctx, id); err != nil || !lost {
		return false, 0, 0, err
	}
	c, n, err := load(ctx, r.ledger, r.redis, id)
	if err != nil {
		return false, 0, 0, err
	}
	// The gateways drop their cached campaign and sold-out flag, as after
	// a preload; a gateway that misses it re-reads within its cache TTL.
	if err := r.redis.PublishEvent(ctx, model.Event{Type: model.EventReset, CampaignID: id}); err != nil {
		r.log.Warn("publish reset event", "campaign_id", id, "err", err)
	}
	return true, c.Epoch, n, nil
}

// lost reports whether campaign id was loaded before, its sale is not
// over, and Redis lacks its current load; c is the campaign MySQL holds.
func (r *Restorer) lost(ctx context.Context, id string) (c model.Campaign, lost bool, err error) {
	c, err = r.ledger.Campaign(ctx, id)
	if errors.Is(err, model.ErrNotFound) {
		return model.Campaign{}, false, nil
	}
	if err != nil {
		return model.Campaign{}, false, fmt.Errorf("restore %s: %w", id, err)
	}
	if c.Epoch == 0 || !r.opts.Now().Before(c.EndAt) {
		return c, false, nil
	}
	behind, err := r.redis.Behind(ctx, c)
	if err != nil {
		return c, false, fmt.Errorf("restore %s: %w", id, err)
	}
	return c, behind, nil
}
