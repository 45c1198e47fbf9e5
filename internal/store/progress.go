package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// minRateSpan keeps a rate read just after the first decisions from
// claiming a burst as the pace.
const minRateSpan = time.Second

// Progress returns the queue progress of each campaign (deduct.lua's
// watermark and its decision rate), in order, in one round trip: TIME and
// one HMGET per campaign, pipelined. The rate is the watermark's advance
// since the start of the last window, over the time since then by Redis's
// clock, so a stalled worker's rate falls as its stall goes on.
func (s *Store) Progress(ctx context.Context, campaignIDs []string) ([]model.QueueProgress, error) {
	if len(campaignIDs) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	clock := pipe.Time(ctx)
	reads := make([]*redis.SliceCmd, len(campaignIDs))
	for i, c := range campaignIDs {
		reads[i] = pipe.HMGet(ctx, campaignKeys(c).counters, "decided", "win_ms", "win_w", "prev_ms", "prev_w")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("progress of %d campaigns: %w", len(campaignIDs), unavailable(err))
	}
	now := clock.Val().UnixMilli()
	out := make([]model.QueueProgress, len(campaignIDs))
	for i, rd := range reads {
		var f [5]int64
		for j, v := range rd.Val() {
			str, ok := v.(string)
			if !ok {
				continue // nil: nothing decided yet
			}
			n, err := strconv.ParseInt(str, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("progress of %s: field %d: %q", campaignIDs[i], j, str)
			}
			f[j] = n
		}
		decided, fromMS, fromW := f[0], f[1], f[2]
		if f[3] != 0 {
			fromMS, fromW = f[3], f[4]
		}
		out[i].Decided = decided
		if fromMS != 0 && decided > fromW {
			span := max(time.Duration(now-fromMS)*time.Millisecond, minRateSpan)
			out[i].Rate = float64(decided-fromW) / span.Seconds()
		}
	}
	return out, nil
}
