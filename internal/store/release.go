package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// Release gives units of an order back to the campaign's sale: remaining
// rises, the buyer's units fall (so they may buy again within the limit)
// and the sold-out flag is cleared. It is idempotent per order id:
// released is true only for the call that gave the units back, and every
// later call changes nothing. A campaign whose stock is not in Redis is
// model.ErrNotLoaded, with nothing changed.
func (s *Store) Release(ctx context.Context, campaignID, orderID, userID string, units int64) (released bool, err error) {
	if units < 1 {
		return false, fmt.Errorf("release order %s: %w", orderID, model.Invalid("units", "must be at least 1"))
	}
	// A campaign of several buckets takes the units back into the buyer's
	// bucket, where their units and the order's id live (model.UserTag).
	n, err := s.rdb.HGet(ctx, campaignKeys(campaignID).meta, "buckets").Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("release order %s of %s: %w", orderID, campaignID, unavailable(err))
	}
	k := campaignKeys(model.BucketTag(campaignID, model.BucketOf(userID, n), n))
	code, err := s.runAcked(ctx, s.release,
		[]string{k.stock, k.users, k.soldout, k.counters, k.meta, k.released},
		orderID, userID, units).Int()
	if err != nil {
		return false, fmt.Errorf("release order %s of %s: %w", orderID, campaignID, err)
	}
	if n > 1 && code >= 0 {
		// After the units are in (soldout.lua), and on a repeated call
		// too: a crash may have come between the two.
		if err := s.unitsReturned(ctx, campaignID); err != nil {
			return false, fmt.Errorf("release order %s: %w", orderID, err)
		}
	}
	return parseReleaseReply(campaignID, orderID, code)
}

// parseReleaseReply is the one place that reads release.lua's reply.
func parseReleaseReply(campaignID, orderID string, code int) (bool, error) {
	switch code {
	case 1:
		return true, nil
	case 0:
		return false, nil
	case -1:
		return false, fmt.Errorf("release order %s of %s: %w", orderID, campaignID, model.ErrNotLoaded)
	}
	return false, fmt.Errorf("release order %s of %s: unexpected reply %d", orderID, campaignID, code)
}

// StockReturned tells every gateway that units of the campaign are back on
// sale (EventReturned), after a Release that returned them.
func (s *Store) StockReturned(ctx context.Context, campaignID string) error {
	return s.PublishEvent(ctx, model.Event{Type: model.EventReturned, CampaignID: campaignID})
}
