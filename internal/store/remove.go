package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// Remove deletes every key of a campaign (remove.lua), unless its admitted
// counter is no longer admitted, the count the caller's checks saw
// (model.ErrConflict, nothing changed). removed is the number of keys
// deleted.
func (s *Store) Remove(ctx context.Context, campaignID string, admitted int64) (removed int64, err error) {
	k := campaignKeys(campaignID)
	n, err := s.remove.Run(ctx, s.rdb, []string{k.counters, k.meta, k.stock, k.soldout, k.users, k.results, k.idem,
		k.released, k.unknown, k.campaignLimit, k.userLimits, k.ipLimits}, admitted).Int64()
	if err != nil {
		return 0, fmt.Errorf("remove %s: %w", campaignID, err)
	}
	if n < 0 {
		return 0, fmt.Errorf("remove %s: requests were admitted since it was checked: %w", campaignID, model.ErrConflict)
	}
	return n, nil
}

// Remaining reads the units left of each of campaignIDs in one round trip;
// a campaign Redis does not hold is absent from the map.
func (s *Store) Remaining(ctx context.Context, campaignIDs []string) (map[string]int64, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(campaignIDs))
	for i, id := range campaignIDs {
		cmds[i] = pipe.Get(ctx, campaignKeys(id).stock)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("remaining of %d campaigns: %w", len(campaignIDs), err)
	}
	out := make(map[string]int64, len(campaignIDs))
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("remaining of %s: %w", campaignIDs[i], err)
		}
		out[campaignIDs[i]] = n
	}
	return out, nil
}
