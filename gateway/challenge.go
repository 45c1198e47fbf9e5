package gateway

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/model"
)

// The gate against bots: a campaign with ChallengeBits above 0 sells only
// to purchases carrying a solved challenge, fetched once the sale started
// (so no purchase is prepared in advance) and spent once.

const (
	challengePath = "/api/v1/campaigns/:id/challenge"
	// challengeHeader carries "<challenge>.<solution>" on a purchase.
	challengeHeader = "Flashsale-Challenge"
)

// Gate issues and checks challenges. The proof of work
// (internal/challenge) is one; a hosted captcha could be another. Verify
// must not do I/O: the gateway calls it before Redis. Both fail with
// model.ErrChallengeFailed for anything the shopper got wrong.
type Gate interface {
	Challenge(userID string, c model.Campaign) (model.Challenge, error)
	Verify(solution, userID string, c model.Campaign) (model.ChallengePass, error)
}

type challengeResponse struct {
	Challenge string    `json:"challenge"`
	Bits      int       `json:"bits"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (h *Handlers) challenge(c *gin.Context, userID string) {
	ch, err := h.svc.Challenge(c.Request.Context(), userID, c.Param("id"))
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, challengeResponse{Challenge: ch.Token, Bits: ch.Bits, ExpiresAt: ch.ExpiresAt})
}

// Challenge issues userID a challenge for campaign campaignID, once its
// sale is open.
func (s *Service) Challenge(ctx context.Context, userID, campaignID string) (model.Challenge, error) {
	if !model.ValidCampaignID(campaignID) {
		return model.Challenge{}, model.ErrNotFound
	}
	_, c, err := s.campaign(ctx, campaignID)
	if err != nil {
		return model.Challenge{}, err
	}
	if err := c.Window(s.opts.Now()); err != nil {
		return model.Challenge{}, fmt.Errorf("challenge for %s: %w", campaignID, err)
	}
	if s.opts.Gate == nil {
		return model.Challenge{}, fmt.Errorf("challenge for %s: no gate configured: %w", campaignID, model.ErrUnavailable)
	}
	return s.opts.Gate.Challenge(userID, c)
}

// verifyChallenge checks p's solution when c is gated; it touches nothing,
// so a refusal leaves stock, counters and rate budgets as they were. The
// pass is spent by admit.lua, in the batch's call: a challenge that
// admitted another purchase before is refused there, before anything else
// of the request is counted (store.Admit).
func (s *Service) verifyChallenge(p Purchase, c model.Campaign) (model.ChallengePass, error) {
	if c.ChallengeBits == 0 {
		return model.ChallengePass{}, nil
	}
	if p.Challenge == "" || s.opts.Gate == nil {
		return model.ChallengePass{}, s.refuse("challenge", model.ErrChallengeFailed)
	}
	pass, err := s.opts.Gate.Verify(p.Challenge, p.UserID, c)
	if err != nil {
		return model.ChallengePass{}, s.refuse("challenge", err)
	}
	return pass, nil
}
