// Package gateway is the shopper- and admin-facing HTTP API: campaign
// administration, and admitting purchases (auth, validation, sale window,
// local sold-out flag, rate limits, idempotency) up to a publish to the
// queue. It answers at once with a request id; the outcome arrives later
// through the notifier. gateway.go holds the service and its event loop;
// campaigns.go creating, changing and reading campaigns. One purchase reads
// top to bottom from http.go (its route) through purchase.go (the handler,
// its decoder, the service call and the answer), cache.go (the campaign it
// buys from, cached) and admit.go (the Redis call and the publish it shares
// with concurrent purchases).
package gateway

import (
	"context"
	"crypto/rand"
	"log/slog"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/requestid"
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
	// CampaignIDs returns the ids of the campaigns, at most limit + 1 (one
	// more than limit says there are more).
	CampaignIDs(ctx context.Context, limit int) ([]string, error)
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
	// RedisDown, when set, reports whether this process sees Redis out
	// (store.Guard.Down). While it does, a purchase that would wait behind
	// an admission batch already in flight (the probe that finds Redis
	// back) is refused 503 at once, and the public campaign reads answer
	// from the cache without asking Redis, so nobody waits on a frozen
	// Redis more than once.
	RedisDown func() bool
	// Degrade has the gateway decide purchases in MySQL through Decider
	// while RedisDown reports Redis out, instead of refusing them
	// (degraded.go). It needs Decider.
	Degrade bool
	Decider Decider
	// Gate checks purchases of campaigns with ChallengeBits above 0
	// (challenge.go); nil refuses them all.
	Gate Gate
	// Risk is the shop's own check of each purchase (risk.go); nil lets
	// every purchase through.
	Risk Risk
	// Restorer rebuilds a campaign Redis lost from MySQL (ledger.go); nil
	// leaves it to an operator's preload.
	Restorer Restorer
	// Issuer mints the request ids, each issued to its buyer, under the key
	// every notifier of the deployment holds: their lost rule answers only
	// ids it recognises. Nil: a key of this process alone, so no notifier
	// answers its ids once Redis lost them.
	Issuer *requestid.Issuer
	Now    func() time.Time
}

func (o Options) withDefaults() Options {
	if o.RedisDown == nil {
		o.RedisDown = func() bool { return false }
	}
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
	if o.Issuer == nil {
		o.Issuer = requestid.NewIssuer([]byte(rand.Text()))
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
	dir       directory
	list      publicList
	// degraded and limits serve purchases decided in MySQL (degraded.go).
	degraded degraded
	limits   localLimits
}

// New returns a Service.
func New(log *slog.Logger, stock Stock, campaigns Campaigns, pub queue.Publisher, m *metrics.Metrics, opts Options) *Service {
	opts = opts.withDefaults()
	if opts.Degrade && opts.Decider == nil {
		panic("gateway: Options.Degrade without a Decider")
	}
	return &Service{log: log, stock: stock, campaigns: campaigns, pub: pub, m: m, opts: opts, limits: newLocalLimits(opts.RateLimits),
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
		s.dir.drop() // a campaign created or deleted
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

func (s *Service) refuse(reason string, err error) error {
	s.m.Refusals.WithLabelValues(reason).Inc()
	return err
}
