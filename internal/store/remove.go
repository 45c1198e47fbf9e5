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
//
// A campaign of several buckets goes bucket by bucket, each checked
// against its own count (admitted is their sum, as Snapshot reads it),
// and its own tag last.
func (s *Store) Remove(ctx context.Context, campaignID string, admitted int64) (removed int64, err error) {
	buckets, err := s.rdb.HGet(ctx, campaignKeys(campaignID).meta, "buckets").Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("remove %s: %w", campaignID, err)
	}
	if buckets <= 1 {
		return s.removeTag(ctx, campaignID, admitted)
	}
	tags := bucketTags(campaignID, buckets, false)
	counts := make([]int64, len(tags))
	var sum int64
	for i, tag := range tags {
		if counts[i], err = s.rdb.HGet(ctx, campaignKeys(tag).counters, "admitted").Int64(); err != nil && !errors.Is(err, redis.Nil) {
			return 0, fmt.Errorf("remove %s: %w", tag, err)
		}
		sum += counts[i]
	}
	if sum != admitted {
		return 0, fmt.Errorf("remove %s: requests were admitted since it was checked: %w", campaignID, model.ErrConflict)
	}
	for i, tag := range tags {
		n, err := s.removeTag(ctx, tag, counts[i])
		if err != nil {
			return removed, err
		}
		removed += n
	}
	own, err := s.rdb.HGet(ctx, campaignKeys(campaignID).counters, "admitted").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return removed, fmt.Errorf("remove %s: %w", campaignID, err)
	}
	n, err := s.removeTag(ctx, campaignID, own)
	return removed + n, err
}

func (s *Store) removeTag(ctx context.Context, tag string, admitted int64) (int64, error) {
	k := campaignKeys(tag)
	n, err := s.remove.Run(ctx, s.rdb, []string{k.counters, k.meta, k.stock, k.soldout, k.users, k.results, k.idem,
		k.released, k.admissions, k.campaignLimit, k.userLimits, k.ipLimits, k.xfer, k.xpend, k.got}, admitted).Int64()
	if err != nil {
		return 0, fmt.Errorf("remove %s: %w", tag, err)
	}
	if n < 0 {
		return 0, fmt.Errorf("remove %s: requests were admitted since it was checked: %w", tag, model.ErrConflict)
	}
	return n, nil
}
