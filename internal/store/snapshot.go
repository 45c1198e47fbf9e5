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
	meta, err := s.rdb.HMGet(ctx, k.meta, "stock", "limit").Result()
	if err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: %w", campaignID, err)
	}
	if meta[0] == nil {
		return snap, nil
	}
	snap.Loaded = true
	if snap.Stock, err = parseInt(meta[0]); err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: stock: %w", campaignID, err)
	}
	if snap.Limit, err = parseInt(meta[1]); err != nil {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: limit: %w", campaignID, err)
	}
	if snap.Remaining, err = s.rdb.Get(ctx, k.stock).Int64(); err != nil && !errors.Is(err, redis.Nil) {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: remaining: %w", campaignID, err)
	}
	if snap.Sold, err = s.rdb.HGet(ctx, k.counters, "sold").Int64(); err != nil && !errors.Is(err, redis.Nil) {
		return model.Snapshot{}, fmt.Errorf("snapshot %s: sold: %w", campaignID, err)
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

// Rebuild overwrites a loaded campaign's sales counters with the given
// ledger (from the order table): remaining = stock - sold, per-user units,
// the sold-out flag, and a success result for every order. Results of other
// requests are kept. It runs as one MULTI/EXEC on the campaign's slot; the
// caller must make sure no worker is deducting (paused or finished sale).
func (s *Store) Rebuild(ctx context.Context, campaignID string, stock int64, orders []model.Order) error {
	k := campaignKeys(campaignID)
	var sold int64
	units := map[string]int64{}
	for _, o := range orders {
		sold += o.Quantity
		units[o.UserID] += o.Quantity
	}
	if sold > stock {
		return fmt.Errorf("rebuild %s: orders hold %d units, stock is %d: %w", campaignID, sold, stock, model.ErrConflict)
	}
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, k.stock, stock-sold, 0)
		p.HSet(ctx, k.counters, "sold", sold)
		p.Del(ctx, k.users)
		for u, n := range units {
			p.HSet(ctx, k.users, u, n)
		}
		for _, o := range orders {
			p.HSet(ctx, k.results, o.RequestID, encodeStored(model.Result{Status: model.StatusSuccess,
				Quantity: o.Quantity, OrderID: o.ID, UserID: o.UserID}))
		}
		if sold == stock {
			p.Set(ctx, k.soldout, "1", 0)
		} else {
			p.Del(ctx, k.soldout)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild %s: %w", campaignID, err)
	}
	return nil
}
