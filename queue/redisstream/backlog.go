package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/queue"
)

// Backlog reads every partition's backlog of topic in one pipelined round
// trip. A stream holds only unacknowledged entries (acknowledged ones are
// deleted), so its length less the group's pending count is the lag, and its
// first entry, whose ID is the time Redis added it, the oldest waiting
// message; ages are measured on Redis's clock (TIME), so hosts' clocks do not
// matter.
func (q *Queue) Backlog(ctx context.Context, topic string) ([]queue.Backlog, error) {
	if err := validTopic(topic); err != nil {
		return nil, fmt.Errorf("backlog %s: %w", topic, err)
	}
	n := q.opts.Partitions
	lengths := make([]*redis.IntCmd, n)
	pending := make([]*redis.XPendingCmd, n)
	oldest := make([]*redis.XMessageSliceCmd, n)
	var now *redis.TimeCmd
	// The pipeline's error is that of its first failed command; each is
	// looked at below, since a partition never consumed has no group yet.
	_, _ = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		for i := range n {
			s := streamKey(topic, i)
			lengths[i] = p.XLen(ctx, s)
			pending[i] = p.XPending(ctx, s, q.opts.Group)
			oldest[i] = p.XRangeN(ctx, s, "-", "+", 1)
		}
		return nil
	})
	if err := now.Err(); err != nil {
		return nil, fmt.Errorf("backlog %s: %w", topic, err)
	}
	out := make([]queue.Backlog, n)
	for i := range n {
		b := queue.Backlog{Partition: i}
		length, err := lengths[i].Result()
		if err != nil {
			return nil, fmt.Errorf("backlog %s: %w", streamKey(topic, i), err)
		}
		switch p, err := pending[i].Result(); {
		case err == nil:
			b.Pending = p.Count
		case !isNoGroup(err) && !errors.Is(err, redis.Nil):
			return nil, fmt.Errorf("backlog %s: %w", streamKey(topic, i), err)
		}
		b.Lag = max(length-b.Pending, 0)
		xs, err := oldest[i].Result()
		if err != nil {
			return nil, fmt.Errorf("backlog %s: %w", streamKey(topic, i), err)
		}
		if len(xs) > 0 {
			if added, ok := entryTime(xs[0].ID); ok {
				b.OldestAge = max(now.Val().Sub(added), 0)
			}
		}
		out[i] = b
	}
	return out, nil
}

// entryTime is when Redis added the stream entry id ("<ms>-<seq>").
func entryTime(id string) (time.Time, bool) {
	ms, _, _ := strings.Cut(id, "-")
	v, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(v), true
}
