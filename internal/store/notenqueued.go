package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Not enqueued: an admitted request whose message may never have reached
// the queue. Every call of admit.lua that admits requests adds them, in the
// same call as their queued markers, to the campaign's (or bucket's)
// admissions set: one member, their ids, scored with the call's
// millisecond. The not-enqueued sweep (SweepNotEnqueued, notenqueued.lua)
// rejects, as not enqueued, the requests of the admissions set whose
// message can no longer be on its way: a gateway that died between
// admitting and publishing, a publish of unknown outcome (queue.ErrUnknown)
// whose message was not stored, an admission whose reply was lost. So every
// admitted request ends in one final result whether its message was stored
// or not, at one write per admission batch on the hot path and none on the
// worker's.

// notEnqueuedBudget bounds the requests one notenqueued.lua call looks at.
const notEnqueuedBudget = 2000

// SweepNotEnqueued, the not-enqueued sweep, gives a final rejected result
// with reason model.ReasonNotEnqueued to every request of the given tags
// (campaigns, or buckets of one: model.BucketTag) that is still queued and
// that the queue has moved past, and returns those results, for the caller
// to publish. The queue has moved past a request once a request admitted at
// least grace after it was decided, once it was admitted maxDelay ago and
// a request numbered after it was decided, or once its sale ended maxDelay
// ago (on Redis's clock; a resume restarts both waits; maxDelay 0 leaves
// both rules out). Each call also marks how far
// admissions have come, which later calls need to tell the first rule: the
// sweep must run often. Paused campaigns are left alone. The results stored
// before an error are returned with it.
func (s *Store) SweepNotEnqueued(ctx context.Context, tags []string, grace, maxDelay time.Duration) ([]model.Result, error) {
	var out []model.Result
	var errs []error
	for _, tag := range tags {
		results, err := s.sweepNotEnqueuedTag(ctx, tag, grace, maxDelay)
		out = append(out, results...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// sweepNotEnqueuedTag sweeps one tag, a script call at a time while there
// is more.
func (s *Store) sweepNotEnqueuedTag(ctx context.Context, tag string, grace, maxDelay time.Duration) ([]model.Result, error) {
	k := campaignKeys(tag)
	keys := []string{k.admissions, k.results, k.counters, k.meta, k.stock}
	owner, _, _ := model.SplitTag(tag)
	var out []model.Result
	for {
		reply, err := s.notEnqueued.Run(ctx, s.rdb, keys, grace.Milliseconds(), maxDelay.Milliseconds(), notEnqueuedBudget, model.ReasonNotEnqueued).Slice()
		if err != nil {
			return out, fmt.Errorf("not-enqueued sweep of %s: %w", tag, unavailable(err))
		}
		more, results, err := parseNotEnqueuedReply(owner, reply)
		if err != nil {
			return out, fmt.Errorf("not-enqueued sweep of %s: %w", tag, err)
		}
		out = append(out, results...)
		if !more {
			return out, nil
		}
	}
}

// parseNotEnqueuedReply is the one place that reads notenqueued.lua's reply.
func parseNotEnqueuedReply(campaignID string, reply []any) (more bool, results []model.Result, err error) {
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
