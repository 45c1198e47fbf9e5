package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// A restore rebuilds a campaign Redis lost from MySQL without an operator
// (reconcile.Restorer): Behind says whether Redis lost it, and the restore
// lock lets one process at a time rebuild it.

// Behind reports whether Redis lacks some of campaign c's load c.Epoch:
// its own tag or a bucket not loaded, or loaded under an older epoch (a
// restart that lost it, a failover to a replica that lagged a load
// behind). Every tag is read, in one round trip: a cluster may lose the
// shard of one bucket only.
func (s *Store) Behind(ctx context.Context, c model.Campaign) (bool, error) {
	tags := tagsOf(c)
	cmds := make([]*redis.SliceCmd, len(tags))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, tag := range tags {
			cmds[i] = p.HMGet(ctx, campaignKeys(tag).meta, "stock", "epoch")
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("behind %s: %w", c.ID, err)
	}
	for i, cmd := range cmds {
		v := cmd.Val()
		if v[0] == nil {
			return true, nil
		}
		var epoch int64
		if v[1] != nil { // a campaign loaded before epochs existed has none
			if epoch, err = parseInt(v[1]); err != nil {
				return false, fmt.Errorf("behind %s: epoch of %s: %w", c.ID, tags[i], err)
			}
		}
		if model.Epoch(epoch) < c.Epoch {
			return true, nil
		}
	}
	return false, nil
}

// LockRestore takes campaign campaignID's restore lock for ttl and returns
// the token that releases it, or "" when another holder has it. The TTL
// frees the lock of a process that died holding it.
func (s *Store) LockRestore(ctx context.Context, campaignID string, ttl time.Duration) (string, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	token := hex.EncodeToString(b)
	err := s.rdb.SetArgs(ctx, campaignKeys(campaignID).restore, token, redis.SetArgs{Mode: "NX", TTL: ttl}).Err()
	switch {
	case errors.Is(err, redis.Nil):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("restore lock %s: %w", campaignID, err)
	}
	return token, nil
}

// UnlockRestore releases campaign campaignID's restore lock if token still
// holds it (restore.lua); released says whether it did.
func (s *Store) UnlockRestore(ctx context.Context, campaignID, token string) (released bool, err error) {
	n, err := s.restore.Run(ctx, s.rdb, []string{campaignKeys(campaignID).restore}, token).Int()
	if err != nil {
		return false, fmt.Errorf("restore unlock %s: %w", campaignID, err)
	}
	return n == 1, nil
}
