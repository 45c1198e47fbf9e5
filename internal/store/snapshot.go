package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// Snapshot reads a campaign's sales state. It scans the results hash, so it
// is meant for paused or finished campaigns and tools, not the hot path.
func (s *Store) Snapshot(ctx context.Context, campaignID string) (model.Snapshot, error) {
	k := campaignKeys(campaignID)
	snap := model.Snapshot{Units: map[string]int64{}, Successes: map[string]model.Result{}}
	meta, err := s.rdb.HMGet(ctx, k.meta, "stock", "limit", "epoch").Result()
	if err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: %w", campaignID, err)
	}
	if meta[0] == nil {
		// Leftovers of a campaign not loaded (rate-limit state) may still
		// have counted admissions: Remove checks against this count.
		if snap.Admitted, err = s.rdb.HGet(ctx, k.counters, "admitted").Int64(); err != nil && !errors.Is(err, redis.Nil) {
			return model.Snapshot{}, fmt.Errorf("snapshot %s: admitted: %w", campaignID, err)
		}
		return snap, nil
	}
	snap.Loaded = true
	if snap.Stock, err = parseInt(meta[0]); err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: stock: %w", campaignID, err)
	}
	if snap.Limit, err = parseInt(meta[1]); err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: limit: %w", campaignID, err)
	}
	if meta[2] != nil {
		if snap.Epoch, err = parseInt(meta[2]); err != nil {
			return model.Snapshot{}, fmt.Errorf("snapshot %s: epoch: %w", campaignID, err)
		}
	}
	if snap.Remaining, err = s.rdb.Get(ctx, k.stock).Int64(); err != nil && !errors.Is(err, redis.Nil) {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: remaining: %w", campaignID, err)
	}
	counters, err := s.rdb.HMGet(ctx, k.counters, "sold", "admitted").Result()
	if err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: counters: %w", campaignID, err)
	}
	for i, n := range []*int64{&snap.Sold, &snap.Admitted} {
		if counters[i] == nil {
			continue
		}
		if *n, err = parseInt(counters[i]); err != nil {
			return model.Snapshot{}, fmt.Errorf("snapshot %s: counter %d: %w", campaignID, i, err)
		}
	}
	n, err := s.rdb.Exists(ctx, k.soldout).Result()
	if err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: sold-out flag: %w", campaignID, err)
	}
	snap.SoldOut = n == 1
	users, err := s.rdb.HGetAll(ctx, k.users).Result()
	if err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: users: %w", campaignID, err)
	}
	for u, v := range users {
		if snap.Units[u], err = strconv.ParseInt(v, 10, 64); err != nil {
			return model.Snapshot{}, fmt.Errorf("snapshot %s: units of %s: %w", campaignID, u, err)
		}
	}
	iter := s.rdb.HScan(ctx, k.results, 0, "", 1000).Iterator()
	for iter.Next(ctx) {
		rid := iter.Val()
		if !iter.Next(ctx) {
			break
		}
		r, err := decodeStored(rid, campaignID, iter.Val())
		if err != nil {
			return model.Snapshot{}, fmt.Errorf("snapshot %s: %w", campaignID, err)
		}
		switch {
		case r.Status == model.StatusSuccess:
			snap.Successes[rid] = r
		case !r.Status.Final():
			snap.Queued++
		}
	}
	if err := iter.Err(); err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: results: %w", campaignID, err)
	}
	return snap, nil
}

func parseInt(v any) (int64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("got %T, want a string", v)
	}
	return strconv.ParseInt(s, 10, 64)
}
