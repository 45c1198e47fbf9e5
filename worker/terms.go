package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Campaigns reads a campaign (sqlstore.DB): an order carries its campaign's
// price and payment window.
type Campaigns interface {
	Campaign(ctx context.Context, id string) (model.Campaign, error)
}

// terms are what a campaign's orders carry of it. Both are fixed when the
// campaign is created, so a worker reads them once per campaign.
type terms struct {
	price  int64
	window time.Duration
}

// termsCache holds the terms of the campaigns a worker has sold; its zero
// value is empty and ready.
type termsCache struct {
	mu sync.Mutex
	m  map[string]terms
}

// maxCachedTerms bounds the cache; past it the cache starts again empty.
const maxCachedTerms = 10_000

// applyTerms sets each order's Amount (price × quantity) and ExpiresAt (now +
// the payment window) from its campaign.
func (w *Worker) applyTerms(ctx context.Context, orders []model.Order, now time.Time) error {
	var (
		t        terms
		campaign string
	)
	for i := range orders {
		// A batch's orders are nearly always one campaign's.
		if i == 0 || orders[i].CampaignID != campaign {
			var err error
			if t, err = w.termsOf(ctx, orders[i].CampaignID); err != nil {
				return err
			}
			campaign = orders[i].CampaignID
		}
		orders[i].Amount = t.price * orders[i].Quantity
		orders[i].ExpiresAt = now.Add(t.window)
	}
	return nil
}

func (w *Worker) termsOf(ctx context.Context, campaignID string) (terms, error) {
	c := &w.terms
	c.mu.Lock()
	t, ok := c.m[campaignID]
	c.mu.Unlock()
	if ok {
		return t, nil
	}
	campaign, err := w.orders.Campaign(ctx, campaignID)
	if err != nil {
		return terms{}, fmt.Errorf("worker: terms of campaign %s: %w", campaignID, err)
	}
	t = terms{price: campaign.Price, window: campaign.WithDefaults().PaymentWindow}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedTerms {
		c.m = map[string]terms{}
	}
	c.m[campaignID] = t
	return t, nil
}
