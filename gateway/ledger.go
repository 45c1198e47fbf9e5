package gateway

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/model"
)

// The ledger's admin side: loading a campaign into Redis from its orders in
// MySQL (preload, which rebuilds what Redis lost, as the restore a purchase
// starts does without an operator), and pausing a sale. The
// orders are the ledger; Redis is its projection, loaded under an epoch
// that fences each load's orders from the next (reconcile.Load).

// registerLedger mounts the pause and resume routes on the admin group.
func (h *Handlers) registerLedger(g gin.IRouter) {
	g.POST("/campaigns/:id/pause", h.pause(true))
	g.POST("/campaigns/:id/resume", h.pause(false))
}

func (h *Handlers) pause(paused bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		got, err := h.svc.Pause(c.Request.Context(), c.Param("id"), paused)
		if err != nil {
			httpapi.Abort(c, h.log, err)
			return
		}
		c.JSON(http.StatusOK, gin.H{"campaign_id": got.ID, "paused": got.Paused})
	}
}

// Preload loads a campaign into Redis and tells every gateway. What it does
// depends on what Redis holds (preloadOutcome): nothing when it holds the
// campaign's current load with the same values; a load from the ledger
// otherwise, which after a loss of Redis is a rebuild.
func (s *Service) Preload(ctx context.Context, id string, force bool) (model.PreloadOutcome, error) {
	if !model.ValidCampaignID(id) {
		return "", model.ErrNotFound
	}
	c, err := s.lookup(ctx, id)
	if err != nil {
		return "", err
	}
	p, err := s.stock.Projection(ctx, id)
	if err != nil {
		return "", err
	}
	out, err := preloadOutcome(c, p, s.opts.Now(), force)
	if err != nil || out == model.PreloadUnchanged {
		return out, err
	}
	if _, err := reconcile.Load(ctx, s.campaigns, s.stock, id); err != nil {
		return "", err
	}
	s.applyEvent(model.Event{Type: model.EventReset, CampaignID: id})
	if err := s.stock.PublishEvent(ctx, model.Event{Type: model.EventReset, CampaignID: id}); err != nil {
		s.log.Warn("publish reset event", "campaign_id", id, "err", err)
	}
	return out, nil
}

// preloadOutcome decides a preload of c, given what Redis holds of it (p):
//   - p is c's current load (its epoch) with c's values: unchanged.
//   - p is c's current load with other values: loaded again, unless the
//     sale has started (model.ErrSaleStarted) and force is not set. A load
//     is from the ledger, so even a forced one never sells units that
//     active orders hold.
//   - c was never loaded: loaded.
//   - c was loaded but Redis has none of it, or an older epoch (a failover
//     to a replica that lagged): rebuilt.
//
// A p of a later epoch than c is a load that ran since c was read:
// unchanged.
func preloadOutcome(c model.Campaign, p model.Projection, now time.Time, force bool) (model.PreloadOutcome, error) {
	switch {
	case p.Loaded && p.Epoch >= c.Epoch:
		if p.Epoch > c.Epoch || (p.Stock == c.Stock && p.Limit == c.PerUserLimit &&
			p.StartAt.Equal(c.StartAt.Truncate(time.Millisecond)) && p.EndAt.Equal(c.EndAt.Truncate(time.Millisecond))) {
			return model.PreloadUnchanged, nil
		}
		if !now.Before(p.StartAt) && !force {
			return "", fmt.Errorf("preload %s: %w", c.ID, model.ErrSaleStarted)
		}
		return model.PreloadLoaded, nil
	case c.Epoch == 0:
		return model.PreloadLoaded, nil
	}
	return model.PreloadRebuilt, nil
}

// Pause pauses (or resumes) a campaign's sale: durably in MySQL first, then
// in Redis so workers hold its requests (a load under a new epoch takes the
// flag from MySQL itself), then every gateway drops its cached copy so it
// refuses purchases (409 paused) at once; its cache TTL is the fallback
// when the event is lost. Pausing twice changes nothing.
//
// Two admins pausing and resuming at once commit in one order in MySQL and
// may write Redis in the other, so after its write each reads MySQL back
// and writes again until Redis holds what it read: the last write is then
// followed by a read of MySQL's last commit (a commit after that read is
// another admin's, whose own write comes later still).
func (s *Service) Pause(ctx context.Context, id string, paused bool) (model.Campaign, error) {
	if !model.ValidCampaignID(id) {
		return model.Campaign{}, model.ErrNotFound
	}
	c, err := s.campaigns.SetPaused(ctx, id, paused)
	if err != nil {
		return model.Campaign{}, err
	}
	committed := c
	for {
		if _, err := s.stock.SetPaused(ctx, c); err != nil {
			return model.Campaign{}, fmt.Errorf("pause %s: %w: %v", id, model.ErrUnavailable, err)
		}
		now, err := s.campaigns.Campaign(ctx, id)
		if err != nil {
			return model.Campaign{}, fmt.Errorf("pause %s: read back: %w", id, err)
		}
		if now.Paused == c.Paused && now.Epoch == c.Epoch {
			break
		}
		c = now
	}
	c = committed
	s.applyEvent(model.Event{Type: model.EventChanged, CampaignID: id})
	if err := s.stock.PublishEvent(ctx, model.Event{Type: model.EventChanged, CampaignID: id}); err != nil {
		s.log.Warn("publish changed event", "campaign_id", id, "err", err)
	}
	return c, nil
}

// Restorer rebuilds a campaign Redis lost from MySQL
// (reconcile.Restorer): in the background, at most one attempt per
// campaign at a time in this process, calling rebuilt if that attempt
// rebuilt it.
type Restorer interface {
	RestoreInBackground(ctx context.Context, campaignID, trigger string, rebuilt func())
}

// notLoaded is the refusal of an admitted purchase whose campaign has no
// stock in Redis: never loaded (409 not_loaded), or loaded before, so Redis
// lost it (503 unavailable, while a restore rebuilds it from MySQL).
func (s *Service) notLoaded(a model.AdmitRequest) error {
	if cc := s.cache.get(a.CampaignID); cc != nil {
		if snap := cc.snap.Load(); snap != nil && snap.campaign.Epoch > 0 {
			s.restore(a.CampaignID, "admit")
			return s.refuse("lost", fmt.Errorf("admit %s: campaign state lost in Redis, being restored from MySQL: %w", a.RequestID, model.ErrUnavailable))
		}
	}
	return s.refuse("not_loaded", fmt.Errorf("admit %s: %w", a.RequestID, model.ErrNotLoaded))
}

// restore rebuilds campaign id from MySQL in the background (the Restorer
// logs a failure and bounds the attempts; the next purchase tries again),
// and drops the cached campaign once it is rebuilt: this gateway's events
// subscription may not be back yet after Redis restarted.
func (s *Service) restore(id, trigger string) {
	if s.opts.Restorer == nil {
		return
	}
	s.opts.Restorer.RestoreInBackground(context.Background(), id, trigger, func() {
		s.applyEvent(model.Event{Type: model.EventReset, CampaignID: id})
	})
}
