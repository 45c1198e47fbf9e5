package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// SpendChallenge records that challenge challengeID of a campaign bought
// for holder (the purchase's Idempotency-Key, "" for none), until
// expiresAt, when the challenge could no longer be spent anyway. It
// reports false when the challenge was spent before by another holder: a
// repeat of the same keyed purchase is not a second spend. One SET NX GET,
// so the key lives at most a challenge's lifetime and needs no sweep.
func (s *Store) SpendChallenge(ctx context.Context, campaignID, challengeID, holder string, expiresAt time.Time) (bool, error) {
	key := "fs:{" + campaignID + "}:challenge:" + challengeID
	prev, err := s.rdb.SetArgs(ctx, key, "k"+holder, redis.SetArgs{Mode: "NX", Get: true, ExpireAt: expiresAt}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("spend challenge of %s: %w", campaignID, unavailable(err))
	}
	return holder != "" && prev == "k"+holder, nil
}
