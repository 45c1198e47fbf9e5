package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Every call of admit.lua that admits requests records them, in the same
// call as their queued markers: a member of the campaign's (or bucket's)
// admissions set, their ids, scored with the call's millisecond.
// SweepNotEnqueued rejects, as not enqueued, the recorded requests whose
// message can no longer be on its way (sweep.lua): a gateway that died
// between admitting and publishing, a publish of unknown outcome whose
// message was not stored, an admission whose reply was lost. So every
// admitted request ends in one final result whether its message was stored
// or not, at one write per admission batch on the hot path and none on the
// worker's.

// sweepBudget bounds the requests one sweep.lua call looks at.
const sweepBudget = 2000

// SweepNotEnqueued gives a final rejected result with reason
// model.ReasonNotEnqueued to every request of the given tags (campaigns, or
// buckets of one: model.BucketTag) that is still queued, was admitted more
// than maxDelay ago (on Redis's clock) and that the queue has moved past,
// and returns those results, for the caller to publish. Paused campaigns
// are left alone, and so is a campaign resumed less than maxDelay ago. The
// results stored before an error are returned with it.
func (s *Store) SweepNotEnqueued(ctx context.Context, tags []string, maxDelay time.Duration) ([]model.Result, error) {
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

// sweepTag sweeps one tag, a script call at a time while there is more.
func (s *Store) sweepTag(ctx context.Context, tag string, maxDelay time.Duration) ([]model.Result, error) {
	k := campaignKeys(tag)
	keys := []string{k.admissions, k.results, k.counters, k.meta, k.stock}
	owner, _, _ := model.SplitTag(tag)
	var out []model.Result
	for {
		reply, err := s.sweep.Run(ctx, s.rdb, keys, maxDelay.Milliseconds(), sweepBudget, model.ReasonNotEnqueued).Slice()
		if err != nil {
			return out, fmt.Errorf("sweep %s: %w", tag, unavailable(err))
		}
		more, results, err := parseSweepReply(owner, reply)
		if err != nil {
			return out, fmt.Errorf("sweep %s: %w", tag, err)
		}
		out = append(out, results...)
		if !more {
			return out, nil
		}
	}
}

// parseSweepReply is the one place that reads sweep.lua's reply.
func parseSweepReply(campaignID string, reply []any) (more bool, results []model.Result, err error) {
	if len(reply) < 2 || len(reply)%2 != 0 {
		return false, nil, fmt.Errorf("reply has %d elements, want 2 + pairs", len(reply))
	}
	left, ok1 := reply[0].(int64)
	flag, ok2 := reply[1].(int64)
	if !ok1 || !ok2 || left < 0 || (flag != 0 && flag != 1) {
		return false, nil, fmt.Errorf("reply counts malformed: %v, %v", reply[0], reply[1])
	}
	for i := 2; i < len(reply); i += 2 {
		rid, ok1 := reply[i].(string)
		v, ok2 := reply[i+1].(string)
		if !ok1 || !ok2 {
			return false, nil, fmt.Errorf("reply[%d:%d] malformed: %v, %v", i, i+2, reply[i], reply[i+1])
		}
		r, err := decodeStored(rid, campaignID, v)
		if err != nil {
			return false, nil, err
		}
		if r.Status != model.StatusRejected {
			return false, nil, fmt.Errorf("request %s: status %q, want rejected", rid, r.Status)
		}
		results = append(results, r)
	}
	return flag == 1, results, nil
}
