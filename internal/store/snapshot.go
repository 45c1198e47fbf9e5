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
// A campaign of several buckets is their sum: units, successes and
// counters from the buckets, definition and flag from its own tag.
func (s *Store) Snapshot(ctx context.Context, campaignID string) (model.Snapshot, error) {
	snap, n, err := s.snapshotTag(ctx, campaignID, campaignID)
	if err != nil || n <= 1 || !snap.Loaded {
		return snap, err
	}
	snap.Remaining, snap.Sold, snap.Admitted, snap.Queued = 0, 0, 0, 0
	for _, tag := range bucketTags(campaignID, int(n), false) {
		b, _, err := s.snapshotTag(ctx, campaignID, tag)
		if err != nil {
			return model.Snapshot{}, err
		}
		snap.Remaining += b.Remaining
		snap.Sold += b.Sold
		snap.Admitted += b.Admitted
		snap.Queued += b.Queued
		for u, v := range b.Units {
			snap.Units[u] += v
		}
		for rid, r := range b.Successes {
			snap.Successes[rid] = r
		}
		snap.Lost = append(snap.Lost, b.Lost...)
	}
	return snap, nil
}

// snapshotTag reads what one tag holds, and the campaign's bucket count
// its meta records.
func (s *Store) snapshotTag(ctx context.Context, campaignID, tag string) (model.Snapshot, int64, error) {
	k := campaignKeys(tag)
	snap := model.Snapshot{Units: map[string]int64{}, Successes: map[string]model.Result{}}
	var buckets int64
	meta, err := s.rdb.HMGet(ctx, k.meta, "stock", "limit", "epoch", "buckets").Result()
	if err != nil {
		return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: %w", tag, err)
	}
	if meta[0] == nil {
		// Leftovers of a campaign not loaded (rate-limit state) may still
		// have counted admissions: Remove checks against this count.
		if snap.Admitted, err = s.rdb.HGet(ctx, k.counters, "admitted").Int64(); err != nil && !errors.Is(err, redis.Nil) {
			return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: admitted: %w", tag, err)
		}
		return snap, 0, nil
	}
	snap.Loaded = true
	if meta[3] != nil {
		if buckets, err = parseInt(meta[3]); err != nil {
			return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: buckets: %w", tag, err)
		}
	}
	if snap.Stock, err = parseInt(meta[0]); err != nil {
		return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: stock: %w", tag, err)
	}
	if snap.Limit, err = parseInt(meta[1]); err != nil {
		return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: limit: %w", tag, err)
	}
	if meta[2] != nil {
		epoch, err := parseInt(meta[2])
		if err != nil {
			return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: epoch: %w", tag, err)
		}
		snap.Epoch = model.Epoch(epoch)
	}
	if snap.Remaining, err = s.rdb.Get(ctx, k.stock).Int64(); err != nil && !errors.Is(err, redis.Nil) {
		return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: remaining: %w", tag, err)
	}
	counters, err := s.rdb.HMGet(ctx, k.counters, "sold", "admitted").Result()
	if err != nil {
		return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: counters: %w", tag, err)
	}
	for i, n := range []*int64{&snap.Sold, &snap.Admitted} {
		if counters[i] == nil {
			continue
		}
		if *n, err = parseInt(counters[i]); err != nil {
			return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: counter %d: %w", tag, i, err)
		}
	}
	n, err := s.rdb.Exists(ctx, k.soldout).Result()
	if err != nil {
		return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: sold-out flag: %w", tag, err)
	}
	snap.SoldOut = n == 1
	users, err := s.rdb.HGetAll(ctx, k.users).Result()
	if err != nil {
		return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: users: %w", tag, err)
	}
	for u, v := range users {
		if snap.Units[u], err = strconv.ParseInt(v, 10, 64); err != nil {
			return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: units of %s: %w", tag, u, err)
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
			return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: %w", tag, err)
		}
		switch {
		case r.Status == model.StatusSuccess:
			snap.Successes[rid] = r
		case r.Status == model.StatusRejected && r.Reason == model.ReasonLost:
			snap.Lost = append(snap.Lost, rid)
		case !r.Status.Final():
			snap.Queued++
		}
	}
	if err := iter.Err(); err != nil {
		return model.Snapshot{}, 0, fmt.Errorf("snapshot %s: results: %w", tag, err)
	}
	return snap, buckets, nil
}

func parseInt(v any) (int64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("got %T, want a string", v)
	}
	return strconv.ParseInt(s, 10, 64)
}
