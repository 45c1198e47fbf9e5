package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/flashsale/flashsale/model"
)

// Campaign administration: listing, changing and deleting campaigns. A
// change or a delete reads the row under a lock and decides inside the
// transaction, so it cannot race another change, a pause or a load's
// epoch bump into a decision made on a stale row.

// CampaignPage lists campaigns newest first (by creation), limit at a time,
// only those in state at now unless state is "". Cursors work as in
// UserOrders.
func (db *DB) CampaignPage(ctx context.Context, state model.CampaignState, now time.Time, cursor string, limit int) (campaigns []model.Campaign, next string, err error) {
	q := db.gdb.WithContext(ctx).Model(&campaignRow{})
	now = now.UTC()
	switch state {
	case "":
	case model.StateUpcoming:
		q = q.Where("start_at > ?", now)
	case model.StateRunning:
		q = q.Where("start_at <= ? AND end_at > ? AND paused = ?", now, now, false)
	case model.StatePaused:
		q = q.Where("start_at <= ? AND end_at > ? AND paused = ?", now, now, true)
	case model.StateEnded:
		q = q.Where("end_at <= ?", now)
	default:
		return nil, "", model.Invalid("state", "must be upcoming, running, paused or ended")
	}
	rows, next, err := page(q, cursor, limit, campaignRow.key)
	if err != nil {
		return nil, "", fmt.Errorf("campaigns: %w", err)
	}
	out := make([]model.Campaign, len(rows))
	for i, r := range rows {
		out[i] = r.toModel()
	}
	return out, next, nil
}

// OpenCampaigns returns up to limit campaigns whose sale has not ended at
// now (upcoming or running, paused ones included), soonest start first.
func (db *DB) OpenCampaigns(ctx context.Context, now time.Time, limit int) ([]model.Campaign, error) {
	var rows []campaignRow
	err := db.gdb.WithContext(ctx).Where("end_at > ?", now.UTC()).Order("start_at").Order("id").
		Limit(min(max(limit, 1), maxPage)).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("open campaigns: %w", err)
	}
	out := make([]model.Campaign, len(rows))
	for i, r := range rows {
		out[i] = r.toModel()
	}
	return out, nil
}

// CampaignsEndingAfter returns every campaign whose sale ends after t, in
// no particular order: the workers' sweep of requests not enqueued looks at the
// ones Redis may still hold.
func (db *DB) CampaignsEndingAfter(ctx context.Context, t time.Time) ([]model.Campaign, error) {
	var rows []campaignRow
	if err := db.gdb.WithContext(ctx).Where("end_at > ?", t.UTC()).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("campaigns ending after %s: %w", t.Format(time.RFC3339), err)
	}
	out := make([]model.Campaign, len(rows))
	for i, r := range rows {
		out[i] = r.toModel()
	}
	return out, nil
}

func (r campaignRow) key() (time.Time, string) { return r.CreatedAt, r.ID }

// ChangeCampaign reads campaign id under a lock, asks change for its new
// values and stores them (name, limit, payment window, window, ended
// early), returning the campaign as stored. An error from change is
// returned as it is, with nothing changed.
func (db *DB) ChangeCampaign(ctx context.Context, id string, change func(model.Campaign) (model.Campaign, error)) (model.Campaign, error) {
	var out model.Campaign
	err := db.gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		row, err := db.lockCampaign(tx, id)
		if err != nil {
			return err
		}
		c, err := change(row.toModel())
		if err != nil {
			return err
		}
		c = c.WithDefaults()
		row.Name, row.PerUserLimit, row.PaymentWindowMS = c.Name, c.PerUserLimit, c.PaymentWindow.Milliseconds()
		row.StartAt, row.EndAt, row.EndedEarly, row.UpdatedAt = c.StartAt.UTC(), c.EndAt.UTC(), c.EndedEarly, now()
		row.ChallengeBits = c.ChallengeBits
		if err := tx.Select("name", "per_user_limit", "payment_window_ms", "start_at", "end_at", "ended_early", "challenge_bits", "updated_at").
			Updates(&row).Error; err != nil {
			return err
		}
		out = row.toModel()
		return nil
	})
	if err != nil {
		return model.Campaign{}, fmt.Errorf("change campaign %s: %w", id, err)
	}
	return out, nil
}

// DeleteCampaign deletes campaign id if allow, given the campaign and its
// count of orders read under a lock, says so; allow's error is returned
// as it is, with nothing deleted.
func (db *DB) DeleteCampaign(ctx context.Context, id string, allow func(c model.Campaign, orders int64) error) error {
	err := db.gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		row, err := db.lockCampaign(tx, id)
		if err != nil {
			return err
		}
		var orders int64
		if err := tx.Model(&orderRow{}).Where("campaign_id = ?", id).Count(&orders).Error; err != nil {
			return err
		}
		if err := allow(row.toModel(), orders); err != nil {
			return err
		}
		return tx.Where("id = ?", id).Delete(&campaignRow{}).Error
	})
	if err != nil {
		return fmt.Errorf("delete campaign %s: %w", id, err)
	}
	return nil
}

// lockCampaign reads a campaign's row inside tx, on MySQL with an
// exclusive lock held to the commit (SQLite runs one writer at a time).
func (db *DB) lockCampaign(tx *gorm.DB, id string) (campaignRow, error) {
	q := tx
	if db.driver == DriverMySQL {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	var row campaignRow
	err := q.Where("id = ?", id).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return campaignRow{}, fmt.Errorf("campaign %s: %w", id, model.ErrNotFound)
	}
	return row, err
}
