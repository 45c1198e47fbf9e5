package store

import (
	"context"
	"fmt"

	"github.com/flashsale/flashsale/model"
)

// SetPaused writes c.Paused into Redis, if Redis holds c.Epoch: a load
// under another epoch read the flag from MySQL itself. written says whether
// it did.
func (s *Store) SetPaused(ctx context.Context, c model.Campaign) (written bool, err error) {
	paused := "0"
	if c.Paused {
		paused = "1"
	}
	// Buckets first, the campaign's own tag (its Projection) last.
	var code int
	for _, tag := range tagsOf(c) {
		if code, err = s.paused.Run(ctx, s.rdb, []string{campaignKeys(tag).meta}, int64(c.Epoch), paused).Int(); err != nil {
			return false, fmt.Errorf("set paused %s: %w", tag, err)
		}
	}
	return code == 1, nil
}
