package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/flashsale/flashsale/model"
)

// The ledger's side of loading a campaign into Redis: the epoch that fences
// the orders of one load from the next (see InsertOrders), and the paused
// flag a load carries over.

// BumpEpoch starts a new epoch of a campaign: it moves ledger_epoch on by
// one in a transaction of its own, committed before it reads anything
// else, then returns the campaign as it is now and all its orders. Every
// order stored under an earlier epoch committed before the bump (its
// insert's locking read held the bump back), so the orders returned are
// every order that will ever exist under an earlier epoch.
//
// The same UPDATE hands a campaign MySQL decides back to Redis
// (decided_in_mysql = false): a Decide that locked the row first committed
// first, so its orders are among those returned, and every Decide after it
// is refused (model.ErrLedgerMoved).
func (db *DB) BumpEpoch(ctx context.Context, id string) (model.Campaign, []model.Order, error) {
	c, err := db.updateCampaign(ctx, id, "`ledger_epoch` = `ledger_epoch` + 1, `decided_in_mysql` = FALSE")
	if err != nil {
		return model.Campaign{}, nil, fmt.Errorf("bump epoch: %w", err)
	}
	orders, err := db.CampaignOrders(ctx, id)
	if err != nil {
		return model.Campaign{}, nil, fmt.Errorf("bump epoch: %w", err)
	}
	return c, orders, nil
}

// SetPaused pauses or resumes a campaign and returns it as it is now;
// setting the flag it has already changes nothing.
func (db *DB) SetPaused(ctx context.Context, id string, paused bool) (model.Campaign, error) {
	set := "`paused` = FALSE"
	if paused {
		set = "`paused` = TRUE"
	}
	c, err := db.updateCampaign(ctx, id, set)
	if err != nil {
		return model.Campaign{}, fmt.Errorf("set paused: %w", err)
	}
	return c, nil
}

// updateCampaign applies set to a campaign's row and reads the row back in
// the same transaction, so what it returns is what the update committed.
func (db *DB) updateCampaign(ctx context.Context, id, set string) (model.Campaign, error) {
	var row campaignRow
	err := db.gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Rows affected would not tell a missing campaign from an unchanged
		// one (MySQL counts changed rows): the read does.
		if err := tx.Exec("UPDATE `campaigns` SET "+set+", `updated_at` = ? WHERE `id` = ?", now(), id).Error; err != nil {
			return err
		}
		return tx.Where("id = ?", id).Take(&row).Error
	})
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return model.Campaign{}, fmt.Errorf("campaign %s: %w", id, model.ErrNotFound)
	}
	if err != nil {
		return model.Campaign{}, fmt.Errorf("campaign %s: %w", id, err)
	}
	return row.toModel(), nil
}
