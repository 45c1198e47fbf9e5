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
	IdempotentRequest(ctx context.Context, a model.AdmitRequest) (model.AdmitReply, bool, error)
	SoldOut(ctx context.Context, campaignID string) (bool, error)
	Stats(ctx context.Context, campaignID string) (model.Stats, error)
	Remaining(ctx context.Context, campaignIDs []string) (map[string]int64, error)
	Remove(ctx context.Context, campaignID string, admitted int64) (removed int64, err error)
	PublishEvent(ctx context.Context, e model.Event) error
	SubscribeEvents(ctx context.Context, ready func(), fn func(model.Event)) error
}

// Campaigns is what the gateway needs from the relational store. The
// reconcile.Ledger methods load campaigns and SetPaused pauses them
// (ledger.go); the rest manage them (campaigns.go).
type Campaigns interface {
	reconcile.Ledger
	CreateCampaign(ctx context.Context, c model.Campaign) (model.Campaign, error)
	CampaignOrderStats(ctx context.Context, campaignID string) (model.OrderStats, error)
	SetPaused(ctx context.Context, id string, paused bool) (model.Campaign, error)
	CampaignPage(ctx context.Context, state model.CampaignState, now time.Time, cursor string, limit int) ([]model.Campaign, string, error)
	OpenCampaigns(ctx context.Context, now time.Time, limit int) ([]model.Campaign, error)
	ChangeCampaign(ctx context.Context, id string, change func(model.Campaign) (model.Campaign, error)) (model.Campaign, error)
	DeleteCampaign(ctx context.Context, id string, allow func(c model.Campaign, orders int64) error) error
}

// Options tune how purchases are admitted.
type Options struct {
	Topic string
	// RateLimits are applied per user, per campaign and per client IP by
	// the same script call that admits; a zero rate is no limit.
	RateLimits model.RateLimits
	// CampaignCacheTTL bounds how stale a cached campaign (window) may be,
	// and how long an id is known to name no campaign.
	CampaignCacheTTL time.Duration // default 2s
	// CachedCampaigns bounds the campaigns cached; CachedUnknownIDs the ids
	// cached as naming none, which anyone may send (cache.go).
	CachedCampaigns  int // default 10,000
	CachedUnknownIDs int // default 1,024
	// SoldOutRecheck is how often cached sold-out flags are re-read from
	// Redis, in case a pub/sub event was missed.
	SoldOutRecheck time.Duration // default 1s
	// PublishTimeout bounds a publish. A publish the queue refused is
	// answered 503 and its queued marker removed; one whose outcome is
	// unknown (it outlived the timeout after sending, say) keeps the marker
	// and is answered as published.
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
	// Gate checks purchases of campaigns with ChallengeBits above 0
	// (challenge.go); nil refuses them all.
	Gate Gate
	Now  func() time.Time
}

func (o Options) withDefaults() Options {
	if o.CampaignCacheTTL <= 0 {
		o.CampaignCacheTTL = 2 * time.Second
	}
	if o.CachedCampaigns <= 0 {
		o.CachedCampaigns = 10_000
	}
	if o.CachedUnknownIDs <= 0 {
		o.CachedUnknownIDs = 1024
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
	cache     *campaignCache
	list      publicList
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
		cache: newCampaignCache(opts.CachedCampaigns, opts.CachedUnknownIDs, m.CachedCampaigns)}
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
	if e.Type == model.EventChanged || e.Type == model.EventReset {
		s.list.drop()
	}
	cc := s.cache.get(e.CampaignID)
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

// recheckSoldOut re-reads the sold-out flag of every campaign on sale: not
// of every id ever asked about, so its cost is the live sales', whoever
// probes the cache.
func (s *Service) recheckSoldOut(ctx context.Context) {
	for _, cc := range s.cache.selling(s.opts.Now()) {
		flag, err := s.stock.SoldOut(ctx, cc.id)
		if err != nil {
			continue // keep the last known value; Redis trouble shows in readiness
		}
		cc.soldOut.Store(flag)
	}
}

// fresh reports whether snap may still be used at now.
func (s *Service) fresh(snap *campaignSnapshot, now time.Time) bool {
	return snap != nil && now.Sub(snap.loadedAt) < s.opts.CampaignCacheTTL
}

// campaign returns the cached campaign, loading it when missing or stale.
// The fast path takes a read lock and an atomic load only.
func (s *Service) campaign(ctx context.Context, id string) (*cachedCampaign, model.Campaign, error) {
	cc := s.cache.getOrAdd(id)
	if snap := cc.snap.Load(); s.fresh(snap, s.opts.Now()) {
		return cc, snap.campaign, snap.err
	}

	cc.refreshMu.Lock()
	defer cc.refreshMu.Unlock()
	old := cc.snap.Load()
	if s.fresh(old, s.opts.Now()) { // another request reloaded it meanwhile
		return cc, old.campaign, old.err
	}
	c, err := s.lookup(ctx, id)
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
	if next.err == nil {
		s.cache.promote(cc)
	}
	return cc, next.campaign, next.err
}

// lookup reads campaign id from the relational store. Ids are exact
// strings: a campaign stored under another spelling (a store comparing
// without case, as MySQL's default collations do) is not this one, or B1
// would be served b1's sale under B1's Redis keys.
func (s *Service) lookup(ctx context.Context, id string) (model.Campaign, error) {
	c, err := s.campaigns.Campaign(ctx, id)
	if err == nil && c.ID != id {
		return model.Campaign{}, fmt.Errorf("campaign %s: stored as %s: %w", id, c.ID, model.ErrNotFound)
	}
	return c, err
}

// CreateCampaign validates and stores a new campaign.
func (s *Service) CreateCampaign(ctx context.Context, c model.Campaign) (model.Campaign, error) {
	if err := c.Validate(); err != nil {
		return model.Campaign{}, err
	}
	created, err := s.campaigns.CreateCampaign(ctx, c)
	if err == nil { // gateways may have cached the id as naming nothing
		s.changed(ctx, c.ID)
	}
	return created, err
}

// CampaignStats combines Redis counters and MySQL orders.
type CampaignStats struct {
	Store      model.Stats
	OrdersInDB int64
	UnitsInDB  int64
}

// statsWait bounds Stats's Redis read: the counters come back in a
// millisecond, and with Redis down the client would retry for ~1.7 s before
// the operator hears it is unavailable.
const statsWait = 500 * time.Millisecond

// Stats returns a campaign's live statistics; with Redis unreachable, an
// error wrapping model.ErrUnavailable within statsWait.
func (s *Service) Stats(ctx context.Context, id string) (CampaignStats, error) {
	if !model.ValidCampaignID(id) {
		return CampaignStats{}, model.ErrNotFound
	}
	if _, err := s.lookup(ctx, id); err != nil {
		return CampaignStats{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, statsWait)
	st, err := s.stock.Stats(rctx, id)
	cancel()
	if err != nil {
		return CampaignStats{}, err
	}
	os, err := s.campaigns.CampaignOrderStats(ctx, id)
	if err != nil {
		return CampaignStats{}, err
	}
	return CampaignStats{Store: st, OrdersInDB: os.Orders, UnitsInDB: os.Units}, nil
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
	return PublicCampaign{Campaign: c, State: c.State(s.opts.Now()), SoldOut: cc.soldOut.Load(), Remaining: s.remaining(ctx, cc)}, nil
}

func (s *Service) refuse(reason string, err error) error {
	s.m.Refusals.WithLabelValues(reason).Inc()
	return err
}
