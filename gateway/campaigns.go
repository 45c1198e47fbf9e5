package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/model"
)

// Campaign management: creating, listing, reading, changing, ending early
// and deleting campaigns and reading their stats (admin), and the public
// view of one campaign and the list of the sales a shopper can still join. Every change is made in MySQL first, under the row's
// lock; Redis follows (a reload under a new epoch, or the ended-early
// flag), and then every gateway drops its cached copy (a changed event;
// the cache TTL is the fallback).

// Listing limits: a page holds defaultPage campaigns unless asked for up
// to maxPage; the public list holds at most maxListed, soonest first.
const (
	defaultPage = 20
	maxPage     = 100
	maxListed   = 100
)

// CampaignAdmin is what an admin reads of a campaign.
type CampaignAdmin struct {
	Campaign model.Campaign
	State    model.CampaignState
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

// ListCampaigns lists campaigns newest first, only those in state unless
// it is "".
func (s *Service) ListCampaigns(ctx context.Context, state model.CampaignState, cursor string, limit int) ([]CampaignAdmin, string, error) {
	switch {
	case state != "" && !state.Valid():
		return nil, "", model.Invalid("state", "must be upcoming, running, paused or ended")
	case limit == 0:
		limit = defaultPage
	case limit < 0 || limit > maxPage:
		return nil, "", model.Invalid("limit", fmt.Sprintf("must be between 1 and %d", maxPage))
	}
	now := s.opts.Now()
	cs, next, err := s.campaigns.CampaignPage(ctx, state, now, cursor, limit)
	if err != nil {
		return nil, "", err
	}
	out := make([]CampaignAdmin, len(cs))
	for i, c := range cs {
		out[i] = CampaignAdmin{Campaign: c, State: c.State(now)}
	}
	return out, next, nil
}

// AdminCampaign returns one campaign as an admin sees it.
func (s *Service) AdminCampaign(ctx context.Context, id string) (CampaignAdmin, error) {
	if !model.ValidCampaignID(id) {
		return CampaignAdmin{}, model.ErrNotFound
	}
	c, err := s.lookup(ctx, id)
	if err != nil {
		return CampaignAdmin{}, err
	}
	return CampaignAdmin{Campaign: c, State: c.State(s.opts.Now())}, nil
}

// ChangeCampaign applies an admin's patch (model.Campaign.Apply says what
// may change when). A campaign already loaded into Redis is loaded again
// from MySQL under a new epoch when its limit, window or payment window
// changed (reconcile.Load, as a preload does), so Redis never decides under
// values MySQL no longer has: any decision made under the old load is
// refused by MySQL and made again. Only before the start, so the reload
// drops no shopper's result.
func (s *Service) ChangeCampaign(ctx context.Context, id string, p model.CampaignPatch) (model.Campaign, error) {
	if !model.ValidCampaignID(id) {
		return model.Campaign{}, model.ErrNotFound
	}
	var before model.Campaign
	c, err := s.campaigns.ChangeCampaign(ctx, id, func(cur model.Campaign) (model.Campaign, error) {
		before = cur
		return cur.Apply(p, s.opts.Now())
	})
	if err != nil {
		return model.Campaign{}, err
	}
	reload := c.PerUserLimit != before.PerUserLimit || c.PaymentWindow != before.WithDefaults().PaymentWindow ||
		!c.StartAt.Equal(before.StartAt) || !c.EndAt.Equal(before.EndAt)
	if reload && c.Epoch > 0 {
		if c, err = reconcile.Load(ctx, s.campaigns, s.stock, id); err != nil {
			s.changed(ctx, id)
			return model.Campaign{}, fmt.Errorf("change %s: stored, but Redis was not loaded again (preload it): %w: %v", id, model.ErrUnavailable, err)
		}
	}
	s.changed(ctx, id)
	return c, nil
}

// EndEarly ends a running sale now (model.Campaign.EndEarly): in MySQL
// first, so every gateway refuses purchases (409 ended) once its cached
// copy goes, at once on the changed event; then in Redis, where the flag
// makes the workers reject every request still queued (ended_early): each
// admitted request gets its final result and nothing more is sold. A
// load under a new epoch takes the flag from MySQL itself. Ending twice
// changes nothing and answers the same.
func (s *Service) EndEarly(ctx context.Context, id string) (model.Campaign, error) {
	if !model.ValidCampaignID(id) {
		return model.Campaign{}, model.ErrNotFound
	}
	now := s.opts.Now()
	c, err := s.campaigns.ChangeCampaign(ctx, id, func(cur model.Campaign) (model.Campaign, error) {
		return cur.EndEarly(now)
	})
	if err != nil {
		return model.Campaign{}, err
	}
	s.changed(ctx, id)
	if _, err := s.stock.EndEarly(ctx, c); err != nil {
		return model.Campaign{}, fmt.Errorf("end %s: ended in MySQL, not yet in Redis (end it again): %w: %v", id, model.ErrUnavailable, err)
	}
	return c, nil
}

// DeleteCampaign deletes a campaign whose sale has not started and that
// nothing was admitted to: its Redis keys first, unless the admitted
// counter moved (model.ErrConflict), so nothing can be admitted after
// (admit.lua refuses a campaign not loaded); then its row, unless the
// sale started meanwhile (model.ErrSaleStarted) or it has orders
// (model.ErrConflict). A started sale is ended, never deleted: its orders
// are the ledger.
func (s *Service) DeleteCampaign(ctx context.Context, id string) error {
	if !model.ValidCampaignID(id) {
		return model.ErrNotFound
	}
	c, err := s.lookup(ctx, id)
	if err != nil {
		return err
	}
	if !s.opts.Now().Before(c.StartAt) {
		return fmt.Errorf("delete %s: %w", id, model.ErrSaleStarted)
	}
	if _, err := s.stock.Remove(ctx, id, 0); err != nil {
		return err
	}
	err = s.campaigns.DeleteCampaign(ctx, id, func(cur model.Campaign, orders int64) error {
		switch {
		case !s.opts.Now().Before(cur.StartAt):
			return fmt.Errorf("delete %s: %w", id, model.ErrSaleStarted)
		case orders > 0:
			return fmt.Errorf("delete %s: %d orders: %w", id, orders, model.ErrConflict)
		}
		return nil
	})
	s.changed(ctx, id)
	return err
}

// changed drops this gateway's cached copy of campaign id and tells the
// others to drop theirs.
func (s *Service) changed(ctx context.Context, id string) {
	s.applyEvent(model.Event{Type: model.EventChanged, CampaignID: id})
	if err := s.stock.PublishEvent(ctx, model.Event{Type: model.EventChanged, CampaignID: id}); err != nil {
		s.log.Warn("publish changed event", "campaign_id", id, "err", err)
	}
}

// CampaignStats combines Redis counters and MySQL orders.
type CampaignStats struct {
	Store      model.Stats
	OrdersInDB int64
	UnitsInDB  int64
	// InMySQL: Redis did not answer and MySQL decides the campaign
	// (degraded mode), so Store is Decider.DecidedStats's count.
	InMySQL bool
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
	inMySQL := false
	if err != nil && errors.Is(err, model.ErrUnavailable) && s.opts.Degrade {
		var derr error
		if st, inMySQL, derr = s.opts.Decider.DecidedStats(ctx, id); derr != nil {
			err = fmt.Errorf("%w; from MySQL: %w", err, derr)
		}
	}
	if err != nil && !inMySQL {
		return CampaignStats{}, err
	}
	os, err := s.campaigns.CampaignOrderStats(ctx, id)
	if err != nil {
		return CampaignStats{}, err
	}
	return CampaignStats{Store: st, OrdersInDB: os.Orders, UnitsInDB: os.Units, InMySQL: inMySQL}, nil
}

// PublicCampaign is what anyone may know about a campaign. Remaining is
// approximate (read at most once per campaign cache TTL), and -1 when
// Redis does not hold the campaign (not preloaded) or did not answer.
type PublicCampaign struct {
	Campaign  model.Campaign
	State     model.CampaignState
	SoldOut   bool
	Remaining int64
}

// publicList is the cached answer of the public listing: one MySQL query
// and one Redis round trip per cache TTL, whoever asks how often.
type publicList struct {
	mu       sync.Mutex // one refresh at a time
	loadedAt time.Time
	items    []PublicCampaign
}

func (l *publicList) drop() {
	l.mu.Lock()
	l.items, l.loadedAt = nil, time.Time{}
	l.mu.Unlock()
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

// OpenCampaigns lists the sales not ended yet (upcoming, running, paused),
// soonest start first, at most maxListed.
func (s *Service) OpenCampaigns(ctx context.Context) ([]PublicCampaign, error) {
	l := &s.list
	l.mu.Lock()
	defer l.mu.Unlock()
	now := s.opts.Now()
	if !l.loadedAt.IsZero() && now.Sub(l.loadedAt) < s.opts.CampaignCacheTTL {
		return l.items, nil
	}
	cs, err := s.campaigns.OpenCampaigns(ctx, now, maxListed)
	if err != nil {
		if l.items != nil { // the last good copy rather than nothing on a DB blip
			return l.items, nil
		}
		return nil, fmt.Errorf("open campaigns: %w: %v", model.ErrUnavailable, err)
	}
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	left, err := s.stock.Remaining(ctx, ids)
	if err != nil {
		// The list is MySQL's; only the remaining units are Redis's. With
		// Redis out the last list is served, or this one without them,
		// for a cache TTL: callers wait on this lock, so none should wait
		// on Redis after the first.
		if l.items != nil {
			l.loadedAt = now
			return l.items, nil
		}
		left = nil
	}
	items := make([]PublicCampaign, len(cs))
	for i, c := range cs {
		rem, ok := left[c.ID]
		if !ok {
			rem = -1
		}
		items[i] = PublicCampaign{Campaign: c, State: c.State(now), SoldOut: ok && rem <= 0, Remaining: rem}
	}
	l.items, l.loadedAt = items, now
	return items, nil
}

// remaining returns cc's approximate remaining units, re-read from Redis
// when older than the cache TTL by one caller at a time (the others take
// the value it replaces).
func (s *Service) remaining(ctx context.Context, cc *cachedCampaign) int64 {
	now := s.opts.Now()
	if now.UnixNano()-cc.remainingAt.Load() < int64(s.opts.CampaignCacheTTL) || s.opts.RedisDown() || !cc.remainingMu.TryLock() {
		return cc.remaining.Load()
	}
	defer cc.remainingMu.Unlock()
	left, err := s.stock.Remaining(ctx, []string{cc.id})
	if err != nil {
		return cc.remaining.Load()
	}
	rem, ok := left[cc.id]
	if !ok {
		rem = -1
	}
	cc.remaining.Store(rem)
	cc.remainingAt.Store(now.UnixNano())
	return rem
}

type campaignListResponse struct {
	Campaigns  []adminCampaignResponse `json:"campaigns"`
	NextCursor string                  `json:"next_cursor,omitempty"`
}

type adminCampaignResponse struct {
	campaignResponse
	State      model.CampaignState `json:"state"`
	Paused     bool                `json:"paused"`
	EndedEarly bool                `json:"ended_early"`
	// Loaded: preloaded at least once (its ledger epoch is past 0).
	Loaded bool `json:"loaded"`
}

func toAdminCampaignResponse(ca CampaignAdmin) adminCampaignResponse {
	return adminCampaignResponse{campaignResponse: toCampaignResponse(ca.Campaign), State: ca.State,
		Paused: ca.Campaign.Paused, EndedEarly: ca.Campaign.EndedEarly, Loaded: ca.Campaign.Epoch > 0}
}

func (h *Handlers) listCampaigns(c *gin.Context) {
	cursor, limit, err := pageQuery(c)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	cs, next, err := h.svc.ListCampaigns(c.Request.Context(), model.CampaignState(c.Query("state")), cursor, limit)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	out := campaignListResponse{Campaigns: make([]adminCampaignResponse, len(cs)), NextCursor: next}
	for i, ca := range cs {
		out.Campaigns[i] = toAdminCampaignResponse(ca)
	}
	c.JSON(http.StatusOK, out)
}

func (h *Handlers) getCampaign(c *gin.Context) {
	ca, err := h.svc.AdminCampaign(c.Request.Context(), c.Param("id"))
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toAdminCampaignResponse(ca))
}

// campaignPatchRequest is a PATCH body: absent (or null) fields stay.
type campaignPatchRequest struct {
	Name          *string    `json:"name"`
	PerUserLimit  *int64     `json:"per_user_limit"`
	PaymentWindow *string    `json:"payment_window"`
	StartAt       *time.Time `json:"start_at"`
	EndAt         *time.Time `json:"end_at"`
	ChallengeBits *int       `json:"challenge_bits"`
}

func (r campaignPatchRequest) toModel() (model.CampaignPatch, error) {
	p := model.CampaignPatch{Name: r.Name, PerUserLimit: r.PerUserLimit, StartAt: r.StartAt, EndAt: r.EndAt,
		ChallengeBits: r.ChallengeBits}
	if r.PaymentWindow != nil {
		d, err := time.ParseDuration(*r.PaymentWindow)
		if err != nil {
			return model.CampaignPatch{}, model.Invalid("payment_window", `must be a duration such as "10m" or "90s"`)
		}
		p.PaymentWindow = &d
	}
	return p, nil
}

func (h *Handlers) patchCampaign(c *gin.Context) {
	var req campaignPatchRequest
	if err := httpapi.DecodeJSON(c, &req); err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	p, err := req.toModel()
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	changed, err := h.svc.ChangeCampaign(c.Request.Context(), c.Param("id"), p)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toAdminCampaignResponse(CampaignAdmin{Campaign: changed, State: changed.State(h.svc.opts.Now())}))
}

func (h *Handlers) endCampaign(c *gin.Context) {
	ended, err := h.svc.EndEarly(c.Request.Context(), c.Param("id"))
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toAdminCampaignResponse(CampaignAdmin{Campaign: ended, State: ended.State(h.svc.opts.Now())}))
}

func (h *Handlers) deleteCampaign(c *gin.Context) {
	if err := h.svc.DeleteCampaign(c.Request.Context(), c.Param("id")); err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.Status(http.StatusNoContent)
}

type publicCampaignResponse struct {
	ID            string              `json:"id"`
	Name          string              `json:"name"`
	PerUserLimit  int64               `json:"per_user_limit"`
	Price         int64               `json:"price"`
	PaymentWindow string              `json:"payment_window"`
	StartAt       time.Time           `json:"start_at"`
	EndAt         time.Time           `json:"end_at"`
	State         model.CampaignState `json:"state"`
	SoldOut       bool                `json:"sold_out"`
	// ChallengeBits > 0: a purchase needs a solved challenge (0: none).
	ChallengeBits int `json:"challenge_bits"`
	// Remaining is approximate (up to a cache TTL old); absent until the
	// campaign is preloaded.
	Remaining *int64 `json:"remaining,omitempty"`
}

func toPublicCampaignResponse(pc PublicCampaign) publicCampaignResponse {
	out := publicCampaignResponse{ID: pc.Campaign.ID, Name: pc.Campaign.Name, PerUserLimit: pc.Campaign.PerUserLimit,
		Price: pc.Campaign.Price, PaymentWindow: pc.Campaign.PaymentWindow.String(), StartAt: pc.Campaign.StartAt,
		EndAt: pc.Campaign.EndAt, State: pc.State, SoldOut: pc.SoldOut, ChallengeBits: pc.Campaign.ChallengeBits}
	if pc.Remaining >= 0 {
		rem := pc.Remaining
		out.Remaining = &rem
	}
	return out
}

func (h *Handlers) publicCampaign(c *gin.Context) {
	pc, err := h.svc.Campaign(c.Request.Context(), c.Param("id"))
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toPublicCampaignResponse(pc))
}

func (h *Handlers) openCampaigns(c *gin.Context) {
	items, err := h.svc.OpenCampaigns(c.Request.Context())
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	out := struct {
		Campaigns []publicCampaignResponse `json:"campaigns"`
	}{Campaigns: make([]publicCampaignResponse, len(items))}
	for i, pc := range items {
		out.Campaigns[i] = toPublicCampaignResponse(pc)
	}
	c.JSON(http.StatusOK, out)
}
