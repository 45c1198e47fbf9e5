package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/flashsale/flashsale/model"
)

// Degraded mode (issue 28): with Options.Degrade, while this process sees
// Redis out, a purchase that passes the checks needing no Redis is decided
// by the gateway itself, in MySQL, and not published: the queue may be gone
// with Redis (Redis Streams in the same server). The campaign is taken over
// first (Decider.TakeOver, once per campaign per outage): MySQL then decides
// it for every process, and the orders Redis decided before can no longer
// be stored (its epoch moved on), so nothing is sold twice. Purchases of one
// campaign that arrive while its decision is in flight share the next one,
// as the admitter's batches do (admit.go).
//
// The answer is the purchase route's: 202 with the request id, carrying its
// final result, which polls read from MySQL as well. What Redis gave the
// Redis path is kept here, in this process or in MySQL: rate limits
// (localLimits), Idempotency-Keys (Decider.ClaimKey) and the sold-out flag
// (a sold-out decision, and the campaign's count of units held on each
// refresh: cache.go). The proof-of-work gate is not: its spent challenges
// live in Redis, so a gated campaign is refused 503.
//
// When Redis is rebuilt from MySQL (a load hands the campaign back), a
// Decide fails model.ErrLedgerMoved: this gateway forgets the take-over,
// sends that purchase the Redis path (503 while Redis is still out to it)
// and keeps the campaign on the Redis path until it sees Redis again, so a
// gateway cut off from a Redis the others reach does not take the campaign
// back from them at every purchase.

// Decider decides purchases in MySQL while Redis is out (*sqlstore.DB).
type Decider interface {
	// TakeOver makes MySQL the decider of campaign id; taking over a
	// campaign MySQL decides already changes nothing.
	TakeOver(ctx context.Context, id string) (model.Campaign, error)
	// Decide decides a batch of campaign id's requests in one transaction,
	// as deduct.lua does: one result per deduction, in order (success with
	// its order, sold_out when nothing remains, rejected, limit_exceeded,
	// or the result that stands for a request decided before).
	// model.ErrLedgerMoved: MySQL no longer decides the campaign;
	// model.ErrPaused.
	Decide(ctx context.Context, id string, ds []model.Deduction, now time.Time) ([]model.Result, error)
	// ClaimKey makes requestID the holder of the Idempotency-Key key of
	// userID in campaignID unless a request holds it, and returns the
	// holder and its quantity.
	ClaimKey(ctx context.Context, campaignID, userID, key string, quantity int64, requestID string) (stored string, storedQty int64, err error)
	// KeyHolder returns the request holding the key and its quantity, or
	// model.ErrNotFound.
	KeyHolder(ctx context.Context, campaignID, userID, key string) (requestID string, quantity int64, err error)
	// DecidedStats counts campaign id as MySQL holds it while MySQL
	// decides it; decided is false while Redis does.
	DecidedStats(ctx context.Context, id string) (st model.Stats, decided bool, err error)
}

// maxDecideBatch caps the purchases of one Decide: one transaction holds
// the campaign's row for all of them.
const maxDecideBatch = 128

// decideTimeout bounds a take-over and a decision. One that outlives it
// may have committed all the same: its shoppers are told 503, and the
// request's result stands (a poll reads it; a retry with the same
// Idempotency-Key gets it back).
const decideTimeout = 2 * time.Second

// degraded is what this gateway keeps of the campaigns it decides in MySQL.
type degraded struct {
	mu        sync.Mutex
	campaigns map[string]*campaignDecider
	// marked is set while an entry is taken over or handed back: a
	// purchase that finds Redis back then clears them (redisBack).
	marked atomic.Bool
}

// campaignDecider is one campaign's decisions in MySQL. Its fields are
// guarded by degraded.mu.
type campaignDecider struct {
	takenOver bool      // TakeOver succeeded in this outage
	since     time.Time // when, for flashsale_degraded_seconds_total
	// handedBack: a Decide found the campaign back in Redis in this outage.
	handedBack bool
	deciding   bool // a decide loop runs
	pending    []*pendingDecision
}

type pendingDecision struct {
	d    model.Deduction
	done chan decision
}

// decision is a purchase's answer: its result, or err, a refusal counted
// under reason unless that is "".
type decision struct {
	result model.Result
	reason string
	err    error
}

// inMySQL reports whether a purchase of campaignID is decided in MySQL. It
// costs two atomic loads unless Redis is out or was just seen back.
func (s *Service) inMySQL(campaignID string) bool {
	if !s.opts.Degrade {
		return false
	}
	d := &s.degraded
	if !s.opts.RedisDown() {
		if d.marked.Load() {
			s.redisBack()
		}
		return false
	}
	if !d.marked.Load() {
		return true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	cd := d.campaigns[campaignID]
	return cd == nil || !cd.handedBack
}

// RedisAnswers tells the gateway that Redis answers again (the process's
// hand-back loop does, each second): a gateway nobody buys from after an
// outage ends it too, so its campaigns stop being counted as decided in
// MySQL (the degraded gauge, the alert) and are handed back.
func (s *Service) RedisAnswers() {
	if s.opts.Degrade && s.degraded.marked.Load() && !s.opts.RedisDown() {
		s.redisBack()
	}
}

// redisBack ends the outage for this gateway: a later one takes its
// campaigns over again. A campaign stays decided in MySQL until Redis is
// rebuilt from it (a purchase on the Redis path gets there: the orders its
// worker decided in Redis are refused, which restores the campaign).
func (s *Service) redisBack() {
	d := &s.degraded
	d.mu.Lock()
	defer d.mu.Unlock()
	d.marked.Store(false)
	for id, cd := range d.campaigns {
		if cd.takenOver {
			s.stoppedDeciding(cd)
			s.log.Info("no longer deciding campaign in MySQL: Redis is back", "campaign_id", id)
			// Redis is rebuilt from MySQL (handed back) before its
			// workers decide from a state older than the ledger's.
			s.restore(id, "handback")
		}
		cd.takenOver, cd.handedBack = false, false
		if !cd.deciding {
			delete(d.campaigns, id)
		}
	}
}

// purchaseInMySQL is Purchase decided in MySQL, from where the checks that
// need no Redis end.
func (s *Service) purchaseInMySQL(ctx context.Context, cc *cachedCampaign, c model.Campaign, p Purchase) (Admitted, error) {
	if c.Epoch == 0 { // never preloaded: refused as the Redis path refuses it
		return Admitted{}, s.refuse("not_loaded", fmt.Errorf("purchase of %s: %w", c.ID, model.ErrNotLoaded))
	}
	if c.ChallengeBits > 0 {
		// A challenge is spent in Redis (admit.lua): without it one
		// solution would buy any number of times.
		return Admitted{}, s.refuse("unavailable", fmt.Errorf("purchase in %s: %w: its challenges are checked in Redis, which is out", c.ID, model.ErrUnavailable))
	}
	now := s.opts.Now()
	if err := c.Window(now); err != nil {
		return s.earlierInMySQL(ctx, p, false, "window", err)
	}
	if c.Paused {
		return s.earlierInMySQL(ctx, p, false, "paused", model.ErrPaused)
	}
	if cc.soldOut.Load() {
		return s.earlierInMySQL(ctx, p, true, "sold_out", model.ErrSoldOut)
	}
	// As admit.lua: the rate limits first, so a replay counts too.
	if reason, wait := s.limits.allow(p, now); wait > 0 {
		retry := int((wait + time.Second - 1) / time.Second)
		return Admitted{}, s.refuse(reason, &model.RateLimitError{RetryAfterSeconds: max(retry, 1)})
	}
	id := s.newRequestID(p)
	existing := false
	if p.IdempotencyKey != "" {
		// A key used while Redis decided is not known here: a retry of it
		// after the switch is a new request (the per-user limit still
		// holds, counted from the orders).
		stored, qty, err := s.opts.Decider.ClaimKey(ctx, p.CampaignID, p.UserID, p.IdempotencyKey, p.Quantity, id)
		switch {
		case err != nil:
			return Admitted{}, s.refuse("unavailable", fmt.Errorf("%w: %v", model.ErrUnavailable, err))
		case stored == id:
		case qty != p.Quantity:
			return Admitted{}, s.refuse("idempotency_key_reused", model.ErrIdempotencyKeyReused)
		default:
			// The holder is decided again: Decide answers the result that
			// stands, or decides it now if its gateway died before it did.
			id, existing = stored, true
		}
	}
	return s.decideOrRedis(ctx, p, id, existing)
}

// decideOrRedis decides request id of p in MySQL. A campaign handed back to
// Redis meanwhile sends p the Redis path, 503 while Redis is out.
func (s *Service) decideOrRedis(ctx context.Context, p Purchase, id string, existing bool) (Admitted, error) {
	ans := s.decide(p.CampaignID, model.Deduction{RequestID: id, UserID: p.UserID, Quantity: p.Quantity, OrderID: model.OrderIDOf(id)})
	switch {
	case errors.Is(ans.err, model.ErrLedgerMoved) && s.opts.RedisDown():
		return Admitted{}, s.refuse("unavailable", fmt.Errorf("purchase %s: %w: redis is out", id, model.ErrUnavailable))
	case errors.Is(ans.err, model.ErrLedgerMoved):
		return s.enqueue(ctx, p, model.ChallengePass{})
	case ans.err != nil && ans.reason != "":
		return Admitted{}, s.refuse(ans.reason, ans.err)
	case ans.err != nil:
		return Admitted{}, ans.err
	}
	return Admitted{RequestID: id, Existing: existing, Result: ans.result}, nil
}

// earlierInMySQL is earlierOr while MySQL decides: the request p's key
// holds, if any, else err. decide says the sale is open, so the holder's
// result may be decided; otherwise it is answered as queued, and its poll
// reads its result.
func (s *Service) earlierInMySQL(ctx context.Context, p Purchase, decide bool, reason string, err error) (Admitted, error) {
	if p.IdempotencyKey == "" {
		return Admitted{}, s.refuse(reason, err)
	}
	id, qty, kerr := s.opts.Decider.KeyHolder(ctx, p.CampaignID, p.UserID, p.IdempotencyKey)
	switch {
	case errors.Is(kerr, model.ErrNotFound):
		return Admitted{}, s.refuse(reason, err)
	case kerr != nil:
		return Admitted{}, s.refuse("unavailable", fmt.Errorf("%w: %v", model.ErrUnavailable, kerr))
	case qty != p.Quantity:
		return Admitted{}, s.refuse("idempotency_key_reused", model.ErrIdempotencyKeyReused)
	case decide:
		return s.decideOrRedis(ctx, p, id, true)
	}
	return Admitted{RequestID: id, Existing: true, Result: model.Result{RequestID: id, CampaignID: p.CampaignID,
		UserID: p.UserID, Status: model.StatusQueued, Quantity: p.Quantity}}, nil
}

// decide adds d to campaignID's next decision and waits for its result.
// The decision runs detached from the shopper's context, bounded by
// decideTimeout: once it is sent, its outcome must be known before
// answering.
func (s *Service) decide(campaignID string, d model.Deduction) decision {
	pd := &pendingDecision{d: d, done: make(chan decision, 1)}
	dg := &s.degraded
	dg.mu.Lock()
	if dg.campaigns == nil {
		dg.campaigns = map[string]*campaignDecider{}
	}
	cd := dg.campaigns[campaignID]
	if cd == nil {
		cd = &campaignDecider{}
		dg.campaigns[campaignID] = cd
	}
	cd.pending = append(cd.pending, pd)
	start := !cd.deciding
	cd.deciding = true
	dg.mu.Unlock()
	if start {
		go s.decideLoop(campaignID, cd)
	}
	return <-pd.done
}

// decideLoop decides campaignID's pending purchases, up to maxDecideBatch
// at a time, until there are none: what arrives during a decision goes in
// the next.
func (s *Service) decideLoop(campaignID string, cd *campaignDecider) {
	dg := &s.degraded
	for {
		dg.mu.Lock()
		n := min(len(cd.pending), maxDecideBatch)
		if n == 0 {
			cd.deciding = false
			if !cd.takenOver && !cd.handedBack && dg.campaigns[campaignID] == cd {
				delete(dg.campaigns, campaignID)
			}
			dg.mu.Unlock()
			return
		}
		batch := slices.Clone(cd.pending[:n])
		rest := copy(cd.pending, cd.pending[n:])
		clear(cd.pending[rest:])
		cd.pending = cd.pending[:rest]
		takenOver, handedBack := cd.takenOver, cd.handedBack
		dg.mu.Unlock()

		var ans []decision
		if handedBack {
			ans = repeat(len(batch), decision{err: fmt.Errorf("decide in %s: %w", campaignID, model.ErrLedgerMoved)})
		} else {
			ans = s.decideBatch(campaignID, cd, batch, takenOver)
		}
		for i, pd := range batch {
			pd.done <- ans[i]
		}
	}
}

// decideBatch takes campaignID over unless it is already, decides batch in
// one Decide and returns each purchase's answer. Purchases of one request
// (one Idempotency-Key sent twice) share its deduction.
func (s *Service) decideBatch(campaignID string, cd *campaignDecider, batch []*pendingDecision, takenOver bool) []decision {
	ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
	defer cancel()
	fail := func(reason string, err error) []decision {
		return repeat(len(batch), decision{reason: reason, err: err})
	}
	if !takenOver {
		c, err := s.opts.Decider.TakeOver(ctx, campaignID)
		if err != nil {
			return fail(s.decideError(campaignID, err))
		}
		s.markTakenOver(cd, c)
	}

	var ds []model.Deduction
	at := make([]int, len(batch)) // batch[i]'s deduction in ds
	index := make(map[string]int, len(batch))
	for i, pd := range batch {
		j, ok := index[pd.d.RequestID]
		if !ok {
			j = len(ds)
			index[pd.d.RequestID] = j
			ds = append(ds, pd.d)
		}
		at[i] = j
	}
	results, err := s.opts.Decider.Decide(ctx, campaignID, ds, s.opts.Now())
	if errors.Is(err, model.ErrLedgerMoved) {
		s.markHandedBack(campaignID, cd)
	}
	if err != nil {
		return fail(s.decideError(campaignID, err))
	}
	if len(results) != len(ds) {
		return fail("", fmt.Errorf("decide in %s: got %d results for %d requests", campaignID, len(results), len(ds)))
	}
	for _, r := range results {
		s.m.DegradedDecisions.WithLabelValues("gateway", string(r.Status)).Inc()
	}
	for _, r := range results {
		// Sold out is nothing left (fewer units than asked for is rejected).
		if r.Status == model.StatusSoldOut {
			if sc := s.cache.get(campaignID); sc != nil {
				sc.soldOut.Store(true)
			}
			break
		}
	}
	out := make([]decision, len(batch))
	for i := range batch {
		out[i] = decision{result: results[at[i]]}
	}
	return out
}

// decideError is the answer to the purchases of a failed take-over or
// decision, and the reason it is counted under ("" for a hand-back, which
// sends them the Redis path).
func (s *Service) decideError(campaignID string, err error) (reason string, _ error) {
	switch {
	case errors.Is(err, model.ErrLedgerMoved):
		return "", fmt.Errorf("decide in %s: %w", campaignID, err)
	case errors.Is(err, model.ErrPaused):
		// Paused since the cached copy was read: the next purchase reloads it.
		s.applyEvent(model.Event{Type: model.EventChanged, CampaignID: campaignID})
		return "paused", fmt.Errorf("decide in %s: %w", campaignID, err)
	case errors.Is(err, model.ErrNotFound):
		return "not_found", fmt.Errorf("decide in %s: %w", campaignID, err)
	}
	return "unavailable", fmt.Errorf("decide in %s: %w: %v", campaignID, model.ErrUnavailable, err)
}

// markTakenOver marks cd taken over in this outage, and logs the first time.
func (s *Service) markTakenOver(cd *campaignDecider, c model.Campaign) {
	dg := &s.degraded
	dg.mu.Lock()
	defer dg.mu.Unlock()
	if cd.takenOver {
		return
	}
	cd.takenOver, cd.since = true, s.opts.Now()
	dg.marked.Store(true)
	s.m.Degraded.WithLabelValues("gateway").Inc()
	s.log.Warn("deciding campaign in MySQL: Redis is out", "campaign_id", c.ID, "epoch", c.Epoch)
}

// stoppedDeciding counts the end of cd's time decided in MySQL here.
func (s *Service) stoppedDeciding(cd *campaignDecider) {
	s.m.Degraded.WithLabelValues("gateway").Dec()
	s.m.DegradedSeconds.WithLabelValues("gateway").Add(s.opts.Now().Sub(cd.since).Seconds())
}

// markHandedBack marks cd handed back to Redis in this outage.
func (s *Service) markHandedBack(campaignID string, cd *campaignDecider) {
	dg := &s.degraded
	dg.mu.Lock()
	defer dg.mu.Unlock()
	if cd.handedBack {
		return
	}
	if cd.takenOver {
		s.stoppedDeciding(cd)
	}
	cd.takenOver, cd.handedBack = false, true
	dg.marked.Store(true)
	s.log.Info("no longer deciding campaign in MySQL: it was loaded into Redis again", "campaign_id", campaignID)
}

func repeat(n int, d decision) []decision {
	out := make([]decision, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// maxLimiters bounds each limiterSet; minSweep is the size of its first
// sweep.
const (
	maxLimiters = 1 << 17
	minSweep    = 1024
)

// localLimits are Options.RateLimits while MySQL decides, kept in this
// process: each gateway admits up to the rates, so n gateways admit n
// times the campaign's rate (MySQL, deciding, is the bound that holds).
// The per-campaign limit is the whole campaign's, buckets or not: MySQL
// decides them as one.
type localLimits struct {
	ip, user, campaign limiterSet
}

func newLocalLimits(l model.RateLimits) localLimits {
	set := func(r, burst int) limiterSet {
		return limiterSet{limit: rate.Limit(max(r, 0)), burst: max(burst, 1), max: maxLimiters, m: map[string]*rate.Limiter{}, sweepAt: minSweep}
	}
	return localLimits{ip: set(l.IPRate, l.IPBurst), user: set(l.UserRate, l.UserBurst), campaign: set(l.CampaignRate, l.CampaignBurst)}
}

// allow counts p against the per-IP, per-user and per-campaign limits, in
// admit.lua's order and with its costs: a refusal by the user's limit
// costs the address nothing, one by the campaign's costs both. A refusal
// says which limit (its Refusals reason) and how long until it lets one
// through.
func (l *localLimits) allow(p Purchase, now time.Time) (reason string, wait time.Duration) {
	var ip *rate.Reservation
	if p.ClientIP != "" {
		if ip, wait = l.ip.take(p.CampaignID+"|"+p.ClientIP, now); wait > 0 {
			return "rate_ip", wait
		}
	}
	// Campaign ids have no '|': the key is unambiguous for any user id.
	if _, wait = l.user.take(p.CampaignID+"|"+p.UserID, now); wait > 0 {
		if ip != nil {
			ip.CancelAt(now)
		}
		return "rate_user", wait
	}
	if _, wait = l.campaign.take(p.CampaignID, now); wait > 0 {
		return "rate_campaign", wait
	}
	return "", 0
}

// limiterSet is one kind of limit's token buckets by key. An idle bucket,
// full again, is dropped: a new one is the same.
type limiterSet struct {
	limit   rate.Limit // 0: no limit
	burst   int
	max     int // maxLimiters
	mu      sync.Mutex
	m       map[string]*rate.Limiter
	sweepAt int // the size that makes the next insert sweep
}

// take counts one event of key at now. A refusal counts nothing and says
// how long until a token; a request let through gets its reservation
// (nil with no limit), to give back if a later limit refuses it.
func (l *limiterSet) take(key string, now time.Time) (*rate.Reservation, time.Duration) {
	if l.limit == 0 {
		return nil, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.m[key]
	if lim == nil {
		if len(l.m) >= l.sweepAt {
			l.sweep(now)
		}
		lim = rate.NewLimiter(l.limit, l.burst)
		l.m[key] = lim
	}
	r := lim.ReserveN(now, 1)
	if wait := r.DelayFrom(now); wait > 0 {
		r.CancelAt(now)
		return nil, wait
	}
	return r, 0
}

// sweep drops the full buckets, then arbitrary ones down to half of
// l.max (those keys start afresh: only more shoppers active at once
// than that get there). The next sweep waits until the set doubled, so
// sweeping costs O(1) an insert.
func (l *limiterSet) sweep(now time.Time) {
	for k, lim := range l.m {
		if lim.TokensAt(now) >= float64(l.burst) {
			delete(l.m, k)
		}
	}
	for k := range l.m {
		if len(l.m) <= l.max/2 {
			break
		}
		delete(l.m, k)
	}
	l.sweepAt = min(max(2*len(l.m), minSweep), l.max)
}
