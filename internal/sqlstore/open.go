package sqlstore

import (
	"context"
	"fmt"
	"time"
)

// maxOpenCampaigns bounds OpenCampaignIDs, and so the series of the stock
// gauge it feeds.
const maxOpenCampaigns = 500

// OpenCampaignIDs returns the ids of the campaigns whose sale window holds
// at, in id order, at most 500 (the stock gauge's campaigns).
func (db *DB) OpenCampaignIDs(ctx context.Context, at time.Time) ([]string, error) {
	var ids []string
	at = at.UTC()
	err := db.gdb.WithContext(ctx).Model(&campaignRow{}).Where("start_at <= ? AND end_at > ?", at, at).
		Order("id").Limit(maxOpenCampaigns).Pluck("id", &ids).Error
	if err != nil {
		return nil, fmt.Errorf("open campaigns: %w", err)
	}
	return ids, nil
}
