package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// The admitter coalesces the Redis and queue work of concurrent purchases: a
// purchase joins a pending list, and up to Options.AdmitConcurrency flush
// loops each take everything pending (up to Options.AdmitBatch), run it as one
// admit.lua call per campaign and one Publish, then answer every waiter.
//
// A batch is whatever arrived while the previous batches were in flight, so
// a lone purchase goes out at once and a burst shares round trips. Under
// load, a loop that finds fewer than AdmitBatch purchases pending while
// another batch is in flight first waits Options.AdmitLinger (a fraction of
// a round trip) for more: bigger batches pay the round trips' system calls
// and the script's fixed work less often per purchase (docs/BENCHMARKS.md).
// Per request the outcome is what admitting one by one would give:
// the script decides requests in order, idempotency included, and a failed
// publish withdraws exactly the requests it carried before they are told 503.
// A publish whose outcome is unknown (queue.ErrUnknown: the queue may have
// stored the messages) withdraws nothing: its requests stay admitted and
// are answered as published. Nothing more is needed: admit.lua adds every
// admission to the admissions set, and the workers' not-enqueued sweep
// rejects the ones whose message never arrives (store.SweepNotEnqueued),
// as it does those of a gateway that died before publishing.

// admitter is the pending list and its flush loops. Loops start on demand
// and end when nothing is pending, so it needs no lifecycle of its own.
type admitter struct {
	mu       sync.Mutex
	pending  []*pendingPurchase
	loops    int
	flushing int // loops with a batch in flight
}

// pendingPurchase is one purchase waiting for its batch.
type pendingPurchase struct {
	req     model.AdmitRequest
	buckets int    // the campaign's bucket count
	body    []byte // the queue message, encoded by the request's own goroutine
	done    chan admitAnswer
}

type admitAnswer struct {
	admitted Admitted
	err      error
}

// newRequestID mints the id of p's request, issued to its buyer
// (Options.Issuer): its tag (its bucket's, or its campaign's) and a
// UUIDv7, so a gateway's ids increase (model.OrderIDOf).
func (s *Service) newRequestID(p Purchase) string {
	return s.opts.Issuer.New(cmp.Or(p.tag, p.CampaignID), p.UserID)
}

func (s *Service) enqueue(ctx context.Context, p Purchase, pass model.ChallengePass) (Admitted, error) {
	a := model.AdmitRequest{
		RequestID:      s.newRequestID(p),
		CampaignID:     p.CampaignID,
		Tag:            p.tag,
		UserID:         p.UserID,
		Quantity:       p.Quantity,
		IdempotencyKey: p.IdempotencyKey,
		ClientIP:       p.ClientIP,
		Challenge:      pass,
	}
	body, err := model.EncodePurchaseRequest(model.PurchaseRequest{RequestID: a.RequestID, CampaignID: p.CampaignID,
		UserID: p.UserID, Quantity: p.Quantity, AdmittedAt: s.opts.Now().UTC()})
	if err != nil {
		return Admitted{}, fmt.Errorf("encode request: %w", err)
	}
	pp := &pendingPurchase{req: a, buckets: p.buckets, body: body, done: make(chan admitAnswer, 1)}
	s.submit(pp)
	// The batch runs detached from ctx and is bounded by PublishTimeout per
	// step: once submitted, the outcome must be known before answering, or a
	// published request could be reported as refused.
	ans := <-pp.done
	return ans.admitted, ans.err
}

// submit adds p to the pending list and starts a flush loop if fewer than
// AdmitConcurrency are running.
func (s *Service) submit(p *pendingPurchase) {
	ad := &s.admitter
	ad.mu.Lock()
	if ad.flushing > 0 && s.opts.RedisDown() {
		ad.mu.Unlock()
		p.done <- admitAnswer{err: s.redisOut(p.req)}
		return
	}
	ad.pending = append(ad.pending, p)
	start := ad.loops < s.opts.AdmitConcurrency
	if start {
		ad.loops++
	}
	ad.mu.Unlock()
	if start {
		go s.flushLoop()
	}
}

// redisOut is the refusal of a purchase not sent to Redis because Redis is
// out and a batch in flight already probes it.
func (s *Service) redisOut(a model.AdmitRequest) error {
	return s.refuse("unavailable", fmt.Errorf("admit %s: %w: redis is out", a.RequestID, model.ErrUnavailable))
}

// flushLoop flushes pending purchases until there are none.
func (s *Service) flushLoop() {
	ad := &s.admitter
	lingered := false
	for {
		ad.mu.Lock()
		n := min(len(ad.pending), s.opts.AdmitBatch)
		if n == 0 {
			ad.loops--
			ad.mu.Unlock()
			return
		}
		if ad.flushing > 0 && s.opts.RedisDown() {
			// What queued up while a batch found Redis out need not wait
			// for the next: the one in flight probes it.
			refused := slices.Clone(ad.pending)
			clear(ad.pending)
			ad.pending = ad.pending[:0]
			ad.mu.Unlock()
			for _, p := range refused {
				p.done <- admitAnswer{err: s.redisOut(p.req)}
			}
			continue
		}
		if n < s.opts.AdmitBatch && ad.flushing > 0 && s.opts.AdmitLinger > 0 && !lingered {
			// More purchases arrive while the other batch is in flight;
			// with none in flight, nothing is waited for.
			ad.mu.Unlock()
			lingered = true
			time.Sleep(s.opts.AdmitLinger)
			continue
		}
		lingered = false
		batch := make([]*pendingPurchase, n)
		copy(batch, ad.pending)
		rest := copy(ad.pending, ad.pending[n:])
		clear(ad.pending[rest:])
		ad.pending = ad.pending[:rest]
		ad.flushing++
		ad.mu.Unlock()
		s.flush(batch)
		ad.mu.Lock()
		ad.flushing--
		ad.mu.Unlock()
	}
}

// flush admits one batch: one script call per campaign (concurrently when a
// batch spans campaigns), then one Publish for every new request.
func (s *Service) flush(batch []*pendingPurchase) {
	groups := groupByCampaign(batch)
	admitted := make([][]*pendingPurchase, len(groups))
	if len(groups) == 1 {
		admitted[0] = s.admitGroup(groups[0])
	} else {
		var wg sync.WaitGroup
		for i, g := range groups {
			wg.Go(func() { admitted[i] = s.admitGroup(g) })
		}
		wg.Wait()
	}
	var fresh []*pendingPurchase
	for _, a := range admitted {
		fresh = append(fresh, a...)
	}
	if len(fresh) == 0 {
		return
	}

	msgs := make([]queue.Message, len(fresh))
	for i, p := range fresh {
		// A bucket's requests are one partition: its own worker decides them.
		msgs[i] = queue.Message{ID: p.req.RequestID, Key: p.req.KeyTag(), Body: p.body}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.PublishTimeout)
	defer cancel()
	start := time.Now()
	// The breaker counts this publish; when it is open (or half-open with a
	// probe already out) the batch is refused without waiting on the queue.
	_, err := s.breaker.Execute(func() (struct{}, error) {
		return struct{}{}, s.pub.Publish(ctx, s.opts.Topic, msgs...)
	})
	metrics.Since(s.m.PublishLatency, start)
	if errors.Is(err, queue.ErrUnknown) {
		s.keepUnknown(fresh, err)
		err = nil
	}
	if err == nil {
		for _, p := range fresh {
			p.done <- admitAnswer{admitted: Admitted{RequestID: p.req.RequestID}}
		}
		return
	}

	// Leave nothing behind: the shoppers are told 503 and may retry.
	uctx, ucancel := context.WithTimeout(context.Background(), s.opts.PublishTimeout)
	defer ucancel()
	reqs := admitRequests(fresh)
	if werr := s.stock.Withdraw(uctx, reqs); werr != nil {
		s.noteMaybeNotEnqueued(reqs, werr)
	}
	for _, p := range fresh {
		p.done <- admitAnswer{err: s.refuse("unavailable", fmt.Errorf("publish %s: %w: %v", p.req.RequestID, model.ErrUnavailable, err))}
	}
}

// keepUnknown keeps the requests of a publish whose outcome is unknown
// admitted (queued marker, Idempotency-Key, count, and the admissions set
// that the workers' not-enqueued sweep reads). Withdrawing them instead would
// tell a shopper "failed" about a purchase a worker may still decide, and
// make a retry with the same key a second request.
func (s *Service) keepUnknown(fresh []*pendingPurchase, cause error) {
	s.m.PublishUnknown.Add(float64(len(fresh)))
	s.log.Warn("publish outcome unknown; the requests stay queued, and are rejected as not enqueued if their message never comes",
		"count", len(fresh), "campaign_id", fresh[0].req.CampaignID, "request_id", fresh[0].req.RequestID, "err", cause)
}

// noteMaybeNotEnqueued counts and logs requests answered 503 whose
// admission may be stored all the same (admit.lua's reply was lost, or a
// withdraw failed): maybe not enqueued, a queued marker that no message
// will decide. The workers' not-enqueued sweep rejects the stored ones
// (not_enqueued). Not withdrawn: a shopper who retries with the same
// Idempotency-Key meanwhile gets the stored request back, and a withdraw
// landing after that would delete it under them.
func (s *Service) noteMaybeNotEnqueued(reqs []model.AdmitRequest, cause error) {
	s.m.MaybeNotEnqueued.Add(float64(len(reqs)))
	s.log.Warn("maybe not enqueued: answered 503, but the admission may be stored; a stored request ends rejected (not_enqueued)",
		"count", len(reqs), "campaign_id", reqs[0].CampaignID, "request_id", reqs[0].RequestID, "err", cause)
}

func admitRequests(ps []*pendingPurchase) []model.AdmitRequest {
	reqs := make([]model.AdmitRequest, len(ps))
	for i, p := range ps {
		reqs[i] = p.req
	}
	return reqs
}

// admitGroup runs one campaign's share of a batch through admit.lua, answers
// every request that is settled there and returns the new ones to publish.
func (s *Service) admitGroup(group []*pendingPurchase) []*pendingPurchase {
	reqs := make([]model.AdmitRequest, len(group))
	for i, p := range group {
		reqs[i] = p.req
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.PublishTimeout)
	defer cancel()
	replies, err := s.stock.Admit(ctx, reqs[0].KeyTag(), reqs, s.opts.RateLimits.PerBucket(group[0].buckets))
	if err != nil {
		if errors.Is(err, model.ErrMaybeNotEnqueued) {
			s.noteMaybeNotEnqueued(reqs, err)
		}
		for _, p := range group {
			p.done <- admitAnswer{err: s.refuse("unavailable", fmt.Errorf("%w: %v", model.ErrUnavailable, err))}
		}
		return nil
	}
	var fresh []*pendingPurchase
	for i, p := range group {
		switch a := replies[i]; a.Code {
		case model.Admitted:
			fresh = append(fresh, p)
		case model.AdmitExisting:
			p.done <- admitAnswer{admitted: Admitted{RequestID: a.RequestID, Existing: true, Result: a.Result}}
		case model.AdmitKeyReused:
			p.done <- admitAnswer{err: s.refuse("idempotency_key_reused", model.ErrIdempotencyKeyReused)}
		case model.AdmitChallengeSpent:
			p.done <- admitAnswer{err: s.refuse("challenge", fmt.Errorf("%w: already spent", model.ErrChallengeFailed))}
		case model.AdmitNotLoaded:
			p.done <- admitAnswer{err: s.notLoaded(p.req)}
		case model.AdmitUserRateLimited, model.AdmitCampaignRateLimited, model.AdmitIPRateLimited:
			reason := map[model.AdmitCode]string{model.AdmitUserRateLimited: "rate_user",
				model.AdmitCampaignRateLimited: "rate_campaign", model.AdmitIPRateLimited: "rate_ip"}[a.Code]
			retry := int((a.RetryAfter + time.Second - 1) / time.Second)
			p.done <- admitAnswer{err: s.refuse(reason, &model.RateLimitError{RetryAfterSeconds: max(retry, 1)})}
		default:
			p.done <- admitAnswer{err: fmt.Errorf("admit %s: unknown outcome %d", p.req.RequestID, a.Code)}
		}
	}
	return fresh
}

// groupByCampaign splits a batch by campaign (by bucket in a campaign of
// several), keeping arrival order.
func groupByCampaign(batch []*pendingPurchase) [][]*pendingPurchase {
	if first := batch[0].req.KeyTag(); allCampaign(batch, first) {
		return [][]*pendingPurchase{batch}
	}
	var groups [][]*pendingPurchase
	index := map[string]int{}
	for _, p := range batch {
		i, ok := index[p.req.KeyTag()]
		if !ok {
			i = len(groups)
			index[p.req.KeyTag()] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], p)
	}
	return groups
}

func allCampaign(batch []*pendingPurchase, id string) bool {
	for _, p := range batch {
		if p.req.KeyTag() != id {
			return false
		}
	}
	return true
}
