package store

import (
	"context"
	"fmt"

	"github.com/flashsale/flashsale/model"
)

// EndEarly writes c's end and ended-early flag into Redis, if Redis holds
// c.Epoch (a load under another epoch read them from MySQL itself):
// from then on deduct.lua rejects every request not decided yet
// (model.ReasonEndedEarly). written says whether it did.
func (s *Store) EndEarly(ctx context.Context, c model.Campaign) (written bool, err error) {
	var code int
	for _, tag := range tagsOf(c) {
		if code, err = s.endEarly.Run(ctx, s.rdb, []string{campaignKeys(tag).meta}, int64(c.Epoch), c.EndAt.UnixMilli()).Int(); err != nil {
			return false, fmt.Errorf("end %s early: %w", tag, err)
		}
	}
	return code == 1, nil
}
