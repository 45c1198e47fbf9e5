package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

func hasUnits(snap []bucketState) bool {
	return slices.ContainsFunc(snap, func(b bucketState) bool { return b.remaining > 0 })
}

// markSoldOut sets the campaign's sold-out flag when a steady scan finds
// every bucket empty, and takes it down otherwise; it reports whether the
// flag is up. Setting it is followed by a second scan: a release that
// landed meanwhile takes it down again (a release clears the flag after it
// adds its units, so one of the two sees the other).
func (s *Store) markSoldOut(ctx context.Context, campaignID string, n int) (bool, error) {
	// A bucket seen holding units in one read is enough to say no (the
	// usual answer while transfers even the buckets out).
	if snap, err := s.readBuckets(ctx, campaignID, n); err != nil {
		return false, err
	} else if hasUnits(snap) {
		return false, s.clearSoldOut(ctx, campaignID)
	}
	returns, err := s.returnsSeen(ctx, campaignID)
	if err != nil {
		return false, err
	}
	for pass := range 2 {
		snap, err := s.scan(ctx, campaignID, n)
		if err != nil {
			return false, err
		}
		if hasUnits(snap) {
			return false, s.clearSoldOut(ctx, campaignID)
		}
		if pass == 0 {
			if up, err := s.soldOutUnlessReturned(ctx, campaignID, returns); err != nil || !up {
				return false, err // refused: a unit came back since the first scan
			}
		}
	}
	return true, nil
}

// confirmSoldOut takes the campaign's sold-out flag, just put up, down
// again unless a steady scan still finds every bucket empty; it reports
// whether the flag stays.
func (s *Store) confirmSoldOut(ctx context.Context, campaignID string, n int) (bool, error) {
	snap, err := s.scan(ctx, campaignID, n)
	if err != nil {
		return false, err
	}
	if hasUnits(snap) {
		return false, s.clearSoldOut(ctx, campaignID)
	}
	return true, nil
}

// clearSoldOut takes a campaign's own sold-out flag down.
func (s *Store) clearSoldOut(ctx context.Context, campaignID string) error {
	if err := s.rdb.Del(ctx, campaignKeys(campaignID).soldout).Err(); err != nil {
		return fmt.Errorf("sold-out flag %s: %w", campaignID, unavailable(err))
	}
	return nil
}

// returnsSeen reads a campaign's returns counter (soldout.lua), "" before
// the first return.
func (s *Store) returnsSeen(ctx context.Context, campaignID string) (string, error) {
	v, err := s.rdb.HGet(ctx, campaignKeys(campaignID).meta, "returns").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("returns of %s: %w", campaignID, unavailable(err))
	}
	return v, nil
}

// soldOutUnlessReturned puts a campaign's own sold-out flag up (expiring
// with its other keys) unless its returns counter moved from returns, read
// before the scan that found every bucket empty; it reports whether the
// flag is up.
func (s *Store) soldOutUnlessReturned(ctx context.Context, campaignID, returns string) (bool, error) {
	k := campaignKeys(campaignID)
	up, err := s.soldOut.Run(ctx, s.rdb, []string{k.soldout, k.meta}, "up", returns).Int()
	if err != nil {
		return false, fmt.Errorf("sold-out flag %s: %w", campaignID, unavailable(err))
	}
	return up == 1, nil
}

// unitsReturned takes a campaign's own sold-out flag down after a release
// put units back into one of its buckets, and counts the return, so that a
// worker whose scan missed those units cannot put the flag up afterwards.
func (s *Store) unitsReturned(ctx context.Context, campaignID string) error {
	k := campaignKeys(campaignID)
	if err := s.runAcked(ctx, s.soldOut, []string{k.soldout, k.meta}, "down").Err(); err != nil {
		return fmt.Errorf("sold-out flag %s: %w", campaignID, unavailable(err))
	}
	return nil
}
