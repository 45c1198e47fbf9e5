package store

import (
	"context"
	"fmt"

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
	k := campaignKeys(campaignID)
	code, err := s.release.Run(ctx, s.rdb,
		[]string{k.stock, k.users, k.soldout, k.counters, k.meta, k.released},
		orderID, userID, units).Int()
	if err != nil {
		return false, fmt.Errorf("release order %s of %s: %w", orderID, campaignID, err)
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
