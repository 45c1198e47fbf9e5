package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Every admitted request is on its campaign's unseen set from the
// admission on (admit.lua, in the same script as its queued marker) until
// a worker sees it (deduct.lua, reject.lua) or its gateway withdraws it
// (withdraw.lua). SweepUnseen rejects, as not enqueued, those whose
// message can no longer be on its way (sweep.lua): a gateway that died
// between admitting and publishing, a publish of unknown outcome whose
// message was not stored, an admission whose reply was lost. So every
// admitted request ends in one final result whether its message was
// stored or not, with no write on the hot path beyond the admission's own.

// sweepBatch bounds the unseen requests one sweep.lua call looks at.
const sweepBatch = 500

// SweepUnseen gives a final rejected result with reason
// model.ReasonNotEnqueued to every request of the given tags (campaigns, or
// buckets of one: model.BucketTag) that no worker has seen, admitted more
// than maxDelay ago (on Redis's clock) and passed by the queue since, and
// returns those results, for the caller to publish. Paused campaigns are
// left alone, and so is a campaign resumed less than maxDelay ago. The
// results stored before an error are returned with it.
func (s *Store) SweepUnseen(ctx context.Context, tags []string, maxDelay time.Duration) ([]model.Result, error) {
	var out []model.Result
	var errs []error
	for _, tag := range tags {
		results, err := s.sweepTag(ctx, tag, maxDelay)
		out = append(out, results...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// sweepTag sweeps one tag in batches.
func (s *Store) sweepTag(ctx context.Context, tag string, maxDelay time.Duration) ([]model.Result, error) {
	k := campaignKeys(tag)
	keys := []string{k.unseen, k.results, k.counters, k.meta, k.stock}
	owner, _, _ := model.SplitTag(tag)
	var out []model.Result
	for {
		reply, err := s.sweep.Run(ctx, s.rdb, keys, maxDelay.Milliseconds(), sweepBatch, model.ReasonNotEnqueued).Slice()
		if err != nil {
			return out, fmt.Errorf("sweep unseen requests of %s: %w", tag, unavailable(err))
		}
		taken, results, err := parseSweepReply(owner, reply)
		if err != nil {
			return out, fmt.Errorf("sweep unseen requests of %s: %w", tag, err)
		}
		out = append(out, results...)
		if taken < sweepBatch { // else more may be due: each call takes off what it looked at
			return out, nil
		}
	}
}

// parseSweepReply is the one place that reads sweep.lua's reply.
func parseSweepReply(campaignID string, reply []any) (taken int64, results []model.Result, err error) {
	if len(reply) < 2 || len(reply)%2 != 0 {
		return 0, nil, fmt.Errorf("reply has %d elements, want 2 + pairs", len(reply))
	}
	left, ok1 := reply[0].(int64)
	taken, ok2 := reply[1].(int64)
	if !ok1 || !ok2 || left < 0 || taken < 0 || int(taken) < (len(reply)-2)/2 {
		return 0, nil, fmt.Errorf("reply counts malformed: %v, %v", reply[0], reply[1])
	}
	for i := 2; i < len(reply); i += 2 {
		rid, ok1 := reply[i].(string)
		v, ok2 := reply[i+1].(string)
		if !ok1 || !ok2 {
			return 0, nil, fmt.Errorf("reply[%d:%d] malformed: %v, %v", i, i+2, reply[i], reply[i+1])
		}
		r, err := decodeStored(rid, campaignID, v)
		if err != nil {
			return 0, nil, err
		}
		if r.Status != model.StatusRejected {
			return 0, nil, fmt.Errorf("request %s: status %q, want rejected", rid, r.Status)
		}
		results = append(results, r)
	}
	return taken, results, nil
}
