package worker

import (
	"context"
	"errors"

	"github.com/flashsale/flashsale/model"
)

// Restorer rebuilds a campaign Redis lost from MySQL
// (reconcile.Restorer): rebuilt says whether this call did.
type Restorer interface {
	Restore(ctx context.Context, campaignID, trigger string) (rebuilt bool, err error)
}

// restore asks the Restorer to rebuild the campaigns of a held batch when
// the hold says Redis may have lost them: deduct.lua found no campaign
// (model.ErrNotLoaded), or MySQL refused the orders because Redis decided
// them under an older epoch than its own (model.ErrLedgerMoved). It runs
// inline: the batch is held anyway, and once it returns the redelivery
// finds the campaign rebuilt. The Restorer checks each campaign (a
// paused or never loaded one is left alone), bounds the attempt and logs
// a failure; the hold is what the queue sees either way.
func (w *Worker) restore(ctx context.Context, err error, campaignIDs ...string) {
	if w.opts.Restorer == nil || w.opts.RedisDown() {
		return // nothing to restore into while Redis is out
	}
	var trigger string
	switch {
	case errors.Is(err, model.ErrNotLoaded):
		trigger = "deduct"
	case errors.Is(err, model.ErrLedgerMoved):
		trigger = "ledger_moved"
	default:
		return
	}
	for _, id := range campaignIDs {
		_, _ = w.opts.Restorer.Restore(ctx, id, trigger)
	}
}
