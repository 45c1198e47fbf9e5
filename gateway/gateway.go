// Package gateway is the shopper- and admin-facing HTTP API: campaign
// administration, and admitting purchases (auth, validation, sale window,
// local sold-out flag, rate limits, idempotency) up to a publish to the
// queue. It answers at once with a request id; the outcome arrives later
// through the notifier. One purchase reads top to bottom in purchase.go (the
// route, its decoder, the service call and the answer) and then admit.go
// (the Redis call and the publish it shares with concurrent purchases).
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// Stock is what the gateway needs from the Redis store. Projection and
// the reconcile.Projection methods load campaigns (ledger.go).
type Stock interface {
	reconcile.Projection
	Projection(ctx context.Context, campaignID string) (model.Projection, error)
	Admit(ctx context.Context, campaignID string, batch []model.AdmitRequest, limits model.RateLimits) ([]model.AdmitReply, error)
	Withdraw(ctx context.Context, batch []model.AdmitRequest) error
	IdempotentRequest(ctx context.Context, campaignID, userID, key string) (string, bool, error)
	SoldOut(ctx context.Context, campaignID string) (bool, error)
	Stats(ctx context.Context, campaignID string) (model.Stats, error)
	PublishEvent(ctx context.Context, e model.Event) error
	SubscribeEvents(ctx context.Context, ready func(), fn func(model.Event)) error
}

// Campaigns is what the gateway needs from the relational store. The
// reconcile.Ledger methods load campaigns and SetPaused pauses them
// (ledger.go).
type Campaigns interface {
	reconcile.Ledger
	CreateCampaign(ctx context.Context, c model.Campaign) (model.Campaign, error)
	CampaignOrderStats(ctx context.Context, campaignID string) (model.OrderStats, error)
	SetPaused(ctx context.Context, id string, paused bool) (model.Campaign, error)
}

// Options tune how purchases are admitted.
type Options struct {
	Topic string
	// RateLimits are applied per user, per campaign and per client IP by
	// the same script call that admits; a zero rate is no limit.
	RateLimits model.RateLimits
	// CampaignCacheTTL bounds how stale a cached campaign (window) may be.
	CampaignCacheTTL time.Duration // default 2s
	// SoldOutRecheck is how often cached sold-out flags are re-read from
	// Redis, in case a pub/sub event was missed.
	SoldOutRecheck time.Duration // default 1s
	// PublishTimeout bounds a publish; past it the request is refused with
	// 503 and its queued marker removed.
	PublishTimeout time.Duration // default 2s
	// AdmitBatch caps the purchases coalesced into one Redis script call and
	// one publish; AdmitConcurrency caps the batches in flight at once. Two
	// let one batch's script call overlap the other's publish; more split the
	// same arrivals into smaller batches, which pay the round trips' system
	// calls and the script's fixed work more often (docs/BENCHMARKS.md).
	AdmitBatch       int // default 256
	AdmitConcurrency int // default 2
	// AdmitLinger is how long a batch smaller than AdmitBatch waits for more
	// purchases while another batch is in flight; 0: never.
	AdmitLinger time.Duration
	// BreakerFailures consecutive failed publishes open the circuit breaker
	// in front of the queue; while it is open, purchases are refused with 503
	// at once instead of each waiting PublishTimeout. After BreakerOpenFor one
	// publish probes the queue, and a success closes the breaker again.
	BreakerFailures int           // default 3
	BreakerOpenFor  time.Duration // default 2s
	Now             func() time.Time
}

func (o Options) withDefaults() Options {
	if o.CampaignCacheTTL <= 0 {
		o.CampaignCacheTTL = 2 * time.Second
	}
	if o.SoldOutRecheck <= 0 {
		o.SoldOutRecheck = time.Second
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = 2 * time.Second
	}
	if o.AdmitBatch <= 0 {
		o.AdmitBatch = 256
	}
	if o.AdmitConcurrency <= 0 {
		o.AdmitConcurrency = 2
	}
	if o.BreakerFailures <= 0 {
		o.BreakerFailures = 3
	}
	if o.BreakerOpenFor <= 0 {
		o.BreakerOpenFor = 2 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Service implements the gateway's operations; the HTTP handlers are thin
// wrappers around it.
type Service struct {
	log       *slog.Logger
	stock     Stock
	campaigns Campaigns
	pub       queue.Publisher
	m         *metrics.Metrics
	opts      Options
	admitter  admitter
	breaker   *gobreaker.CircuitBreaker[struct{}]

	mu    sync.RWMutex
	cache map[string]*cachedCampaign
}

// cachedCampaign keeps what admitting needs of a campaign in memory, so the
// hot path touches neither MySQL nor (once sold out) Redis. Readers take an
// immutable snapshot without locking: every purchase reads it.
type cachedCampaign struct {
	snap      atomic.Pointer[campaignSnapshot] // nil until first loaded
	soldOut   atomic.Bool
	refreshMu sync.Mutex // one reload at a time
}

type campaignSnapshot struct {
	campaign model.Campaign
	err      error // model.ErrNotFound is cached too, against bots probing ids
	loadedAt time.Time
}

// New returns a Service.
func New(log *slog.Logger, stock Stock, campaigns Campaigns, pub queue.Publisher, m *metrics.Metrics, opts Options) *Service {
	opts = opts.withDefaults()
	return &Service{log: log, stock: stock, campaigns: campaigns, pub: pub, m: m, opts: opts,
		breaker: gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
			Name:    "queue-publish",
			Timeout: opts.BreakerOpenFor,
			ReadyToTrip: func(c gobreaker.Counts) bool {
				return c.ConsecutiveFailures >= uint32(opts.BreakerFailures)
			},
			OnStateChange: func(name string, from, to gobreaker.State) {
				log.Warn("circuit breaker", "name", name, "from", from.String(), "to", to.String())
			},
		}),
		cache: map[string]*cachedCampaign{}}
}

// Run keeps the sold-out flags fresh: events from workers (sold out) and
// from the order lifecycle (units returned) flip them at once, a periodic
// re-check repairs missed events. It returns when ctx ends.
func (s *Service) Run(ctx context.Context) error {
	go func() {
		t := time.NewTicker(s.opts.SoldOutRecheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.recheckSoldOut(ctx)
			}
		}
	}()
	for {
		err := s.stock.SubscribeEvents(ctx, nil, s.applyEvent)
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("campaign events subscription lost, retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

func (s *Service) applyEvent(e model.Event) {
	s.mu.RLock()
	cc := s.cache[e.CampaignID]
	s.mu.RUnlock()
	if cc == nil {
		return
	}
	switch e.Type {
	case model.EventSoldOut:
		cc.soldOut.Store(true)
	case model.EventReturned:
		// An order ended unsold and its units are back: refusing from the
		// flag now would undersell.
		cc.soldOut.Store(false)
	case model.EventReset:
		cc.soldOut.Store(false)
		cc.refreshMu.Lock()
		cc.snap.Store(nil) // reload the campaign on next use
		cc.refreshMu.Unlock()
	case model.EventChanged:
		cc.refreshMu.Lock()
		cc.snap.Store(nil)
		cc.refreshMu.Unlock()
	}
}

func (s *Service) recheckSoldOut(ctx context.Context) {
	s.mu.RLock()
	ids := make([]string, 0, len(s.cache))
	for id := range s.cache {
		ids = append(ids, id)
	}
	s.mu.RUnlock()
	for _, id := range ids {
		flag, err := s.stock.SoldOut(ctx, id)
		if err != nil {
			continue // keep the last known value; Redis trouble shows in readiness
		}
		s.mu.RLock()
		if cc := s.cache[id]; cc != nil {
			cc.soldOut.Store(flag)
		}
		s.mu.RUnlock()
	}
}

// fresh reports whether snap may still be used at now.
func (s *Service) fresh(snap *campaignSnapshot, now time.Time) bool {
	return snap != nil && now.Sub(snap.loadedAt) < s.opts.CampaignCacheTTL
}

// campaign returns the cached campaign, loading it when missing or stale.
// The fast path takes a read lock and an atomic load only.
func (s *Service) campaign(ctx context.Context, id string) (*cachedCampaign, model.Campaign, error) {
	s.mu.RLock()
	cc := s.cache[id]
	s.mu.RUnlock()
	if cc != nil {
		if snap := cc.snap.Load(); s.fresh(snap, s.opts.Now()) {
			return cc, snap.campaign, snap.err
		}
	} else {
		s.mu.Lock()
		if cc = s.cache[id]; cc == nil {
			if len(s.cache) >= maxCachedCampaigns {
				s.evictUnknownLocked()
			}
			cc = &cachedCampaign{}
			s.cache[id] = cc
		}
		s.mu.Unlock()
	}

	cc.refreshMu.Lock()
	defer cc.refreshMu.Unlock()
	old := cc.snap.Load()
	if s.fresh(old, s.opts.Now()) { // another request reloaded it meanwhile
		return cc, old.campaign, old.err
	}
	c, err := s.campaigns.Campaign(ctx, id)
	next := &campaignSnapshot{loadedAt: s.opts.Now()}
	switch {
	case errors.Is(err, model.ErrNotFound):
		next.err = model.ErrNotFound
	case err != nil:
		// Serve the last good copy rather than refuse purchases on a DB blip.
		if old != nil && old.err == nil {
			return cc, old.campaign, nil
		}
		return nil, model.Campaign{}, fmt.Errorf("load campaign %s: %w: %v", id, model.ErrUnavailable, err)
	default:
		next.campaign = c
		if flag, ferr := s.stock.SoldOut(ctx, id); ferr == nil {
			cc.soldOut.Store(flag)
		}
	}
	cc.snap.Store(next)
	return cc, next.campaign, next.err
}

// maxCachedCampaigns bounds the cache against bots probing random ids.
const maxCachedCampaigns = 10_000

// evictUnknownLocked drops entries that are not known campaigns.
func (s *Service) evictUnknownLocked() {
	for id, cc := range s.cache {
		if cc.refreshMu.TryLock() {
			if snap := cc.snap.Load(); snap == nil || snap.err != nil {
				delete(s.cache, id)
			}
			cc.refreshMu.Unlock()
		}
	}
}

// CreateCampaign validates and stores a new campaign.
func (s *Service) CreateCampaign(ctx context.Context, c model.Campaign) (model.Campaign, error) {
	if err := c.Validate(); err != nil {
		return model.Campaign{}, err
	}
	return s.campaigns.CreateCampaign(ctx, c)
}

// CampaignStats combines Redis counters and MySQL orders.
type CampaignStats struct {
	Store      model.Stats
	OrdersInDB int64
	UnitsInDB  int64
}

// Stats returns a campaign's live statistics.
func (s *Service) Stats(ctx context.Context, id string) (CampaignStats, error) {
	if !model.ValidCampaignID(id) {
		return CampaignStats{}, model.ErrNotFound
	}
	if _, err := s.campaigns.Campaign(ctx, id); err != nil {
		return CampaignStats{}, err
	}
	st, err := s.stock.Stats(ctx, id)
	if err != nil {
		return CampaignStats{}, err
	}
	os, err := s.campaigns.CampaignOrderStats(ctx, id)
	if err != nil {
		return CampaignStats{}, err
	}
	return CampaignStats{Store: st, OrdersInDB: os.Orders, UnitsInDB: os.Units}, nil
}

// PublicCampaign is what anyone may know about a campaign.
type PublicCampaign struct {
	Campaign model.Campaign
	SoldOut  bool
}

// Campaign returns a campaign's public view.
func (s *Service) Campaign(ctx context.Context, id string) (PublicCampaign, error) {
	if !model.ValidCampaignID(id) {
		return PublicCampaign{}, model.ErrNotFound
	}
	cc, c, err := s.campaign(ctx, id)
	if err != nil {
		return PublicCampaign{}, err
	}
	return PublicCampaign{Campaign: c, SoldOut: cc.soldOut.Load()}, nil
}

func (s *Service) refuse(reason string, err error) error {
	s.m.Refusals.WithLabelValues(reason).Inc()
	return err
}
