package gateway

import (
	"context"
	"errors"
	"fmt"

	"github.com/flashsale/flashsale/model"
)

// deviceHeader carries the shopper's device id, if the client has one; the
// gateway passes it to the risk check and keeps nothing of it.
const deviceHeader = "Flashsale-Device"

// maxDeviceID bounds the device id passed on; a longer one is cut.
const maxDeviceID = 128

// Risk is the shop's own judgement of a purchase (the seeds' 风控): device
// fingerprints, account age, known farms, a fraud service. The gateway asks
// it once a purchase is well formed and its campaign known, before anything
// is counted for it: a refusal leaves stock, rate budgets
// and Idempotency-Keys as they were. Judge runs on the purchase path of
// every shopper, so it must answer within microseconds (a cache, not a
// network call per purchase). It returns nil to let the purchase go on, or
// an error wrapping model.ErrRiskRefused (403 risk_refused); any other
// error is 503 unavailable.
type Risk interface {
	Judge(ctx context.Context, p RiskView) error
}

// RiskView is what Risk sees of a purchase.
type RiskView struct {
	UserID     string
	CampaignID string
	Quantity   int64
	// ClientIP is the address the HTTP layer determined (trusted proxies
	// only); "" when unknown.
	ClientIP string
	// DeviceID is the Flashsale-Device header, "" when absent.
	DeviceID  string
	UserAgent string
}

// judge asks the risk check about p, if one is configured.
func (s *Service) judge(ctx context.Context, p Purchase) error {
	if s.opts.Risk == nil {
		return nil
	}
	err := s.opts.Risk.Judge(ctx, RiskView{UserID: p.UserID, CampaignID: p.CampaignID, Quantity: p.Quantity,
		ClientIP: p.ClientIP, DeviceID: p.DeviceID, UserAgent: p.UserAgent})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, model.ErrRiskRefused):
		return s.refuse("risk", err)
	default:
		return s.refuse("risk", fmt.Errorf("risk check: %w: %v", model.ErrUnavailable, err))
	}
}
