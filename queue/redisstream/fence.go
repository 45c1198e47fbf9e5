package redisstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// The fence. Every command that moves a partition's entries (reading new
// ones, claiming pending ones, resetting their counters, acknowledging them)
// runs through fenced, in a MULTI that executes only while the partition's
// lease holds the caller's value. It is an optimistic transaction (WATCH)
// rather than a Lua script because the read path is hot: a script that
// returns a batch converts every entry into Lua and back, at a cost to Redis
// the read cannot afford (docs/BENCHMARKS.md, "The partition lease's
// fence"). Streams and leases share a hash tag, so the transaction stays in
// one slot.

// fenceTries bounds how often fenced retries a transaction that a change of
// the lease key aborted while the key still held the caller's value (its own
// renewal, which touches the key too).
const fenceTries = 5

// fenced WATCHes l's key, reads it, and runs cmds in a MULTI only if it holds
// l's value; EXEC then fails if the key changed in between (a new holder, an
// expiry, a renewal), and fenced tries again from the read. If the lease no
// longer holds l's value, nothing runs, l is marked lost and the error is
// errLeaseLost. Otherwise it returns the transaction's error: the first
// failed command's, which may be redis.Nil.
func fenced(ctx context.Context, rdb redis.UniversalClient, l *lease, cmds func(p redis.Pipeliner)) error {
	for range fenceTries {
		err := rdb.Watch(ctx, func(tx *redis.Tx) error {
			v, err := tx.Get(ctx, l.key).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			if v != l.value {
				return errLeaseLost
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				cmds(p)
				return nil
			})
			return err
		}, l.key)
		switch {
		case errors.Is(err, redis.TxFailedErr):
			continue
		case errors.Is(err, errLeaseLost):
			l.markLost()
		}
		return err
	}
	return fmt.Errorf("lease %s changed during %d transactions in a row", l.key, fenceTries)
}

// readEntries reads up to count new entries of stream for l's holder. When
// there is nothing new it returns no entries and the ID after which new ones
// will come: the stream's last entry's (every entry in it was delivered), or
// "0-0" for an empty stream.
func readEntries(ctx context.Context, rdb redis.UniversalClient, l *lease, stream, group, consumer string, count int) ([]redis.XMessage, string, error) {
	var read *redis.XStreamSliceCmd
	var last *redis.XMessageSliceCmd
	err := fenced(ctx, rdb, l, func(p redis.Pipeliner) {
		read = p.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: group, Consumer: consumer, Streams: []string{stream, ">"}, Count: int64(count), Block: -1,
		})
		last = p.XRevRangeN(ctx, stream, "+", "-", 1)
	})
	if err != nil && !errors.Is(err, redis.Nil) { // redis.Nil: nothing new
		return nil, "", err
	}
	if res := read.Val(); len(res) > 0 && len(res[0].Messages) > 0 {
		return res[0].Messages, "", nil
	}
	xs, err := last.Result()
	if err != nil {
		return nil, "", err
	}
	if len(xs) == 0 {
		return nil, "0-0", nil
	}
	return nil, xs[0].ID, nil
}

// claimEntries takes over up to count of stream's pending entries from
// cursor start for l's holder (min-idle 0: only the holder works on them).
// It returns them and the next cursor, "0-0" after the last.
func claimEntries(ctx context.Context, rdb redis.UniversalClient, l *lease, stream, group, consumer, start string, count int) ([]redis.XMessage, string, error) {
	var claim *redis.XAutoClaimCmd
	err := fenced(ctx, rdb, l, func(p redis.Pipeliner) {
		claim = p.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: stream, Group: group, Consumer: consumer, MinIdle: 0, Start: start, Count: int64(count),
		})
	})
	if err != nil {
		return nil, "", err
	}
	return claim.Result()
}

// reclaimEntries claims the entries ids again for l's holder, which bumps
// their delivery counters, and returns those still in the stream.
func reclaimEntries(ctx context.Context, rdb redis.UniversalClient, l *lease, stream, group, consumer string, ids []string) ([]redis.XMessage, error) {
	var claim *redis.XMessageSliceCmd
	err := fenced(ctx, rdb, l, func(p redis.Pipeliner) {
		claim = p.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: group, Consumer: consumer, MinIdle: 0, Messages: ids})
	})
	if err != nil {
		return nil, err
	}
	return claim.Result()
}

// unreadEntries resets the delivery counters of ids for l's holder, as if
// they had never been delivered.
func unreadEntries(ctx context.Context, rdb redis.UniversalClient, l *lease, stream, group, consumer string, ids []string) error {
	return setDeliveryCounts(ctx, rdb, l, stream, group, consumer, map[int][]string{0: ids})
}

// setDeliveryCounts sets the delivery counters of the entries in counts (by
// the count they get) for l's holder, in one transaction.
func setDeliveryCounts(ctx context.Context, rdb redis.UniversalClient, l *lease, stream, group, consumer string, counts map[int][]string) error {
	return fenced(ctx, rdb, l, func(p redis.Pipeliner) {
		for n, ids := range counts {
			args := []any{"XCLAIM", stream, group, consumer, 0}
			for _, id := range ids {
				args = append(args, id)
			}
			args = append(args, "RETRYCOUNT", n, "JUSTID")
			p.Do(ctx, args...)
		}
	})
}

// ackEntries acknowledges and deletes the entries ids for l's holder.
// Deleting them keeps the stream to what is unacknowledged, with no trimming.
func ackEntries(ctx context.Context, rdb redis.UniversalClient, l *lease, stream, group string, ids []string) error {
	return fenced(ctx, rdb, l, func(p redis.Pipeliner) {
		p.XAck(ctx, stream, group, ids...)
		p.XDel(ctx, stream, ids...)
	})
}
