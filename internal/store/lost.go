package store

import (
	"context"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Lost finishes a request whose state died with Redis (lost.lua): when
// requestID has no result, the caller found no order for it in MySQL, and
// the queue has passed it (a request admitted the grace after it was
// decided; or it was admitted, or its sale ended, maxDelay ago; or its
// bucket is empty and no other can refill it), it
// stores a final rejected result with reason model.ReasonLost owned by
// userID, counted in the tag's lost counter. It returns the result that
// stands, as a shopper may see it: the stored one (whoever owns it), the
// one written now, or a queued result of userID with nothing written while
// the queue has not passed the request. A malformed id or an id whose time
// is outside the sale is model.ErrNotFound; a campaign not loaded in Redis
// (never, or Redis lost it) is model.ErrNotLoaded.
func (s *Store) Lost(ctx context.Context, requestID, userID string, grace, maxDelay time.Duration) (model.Result, error) {
	tag, ok := model.TagOfRequest(requestID)
	admitted, _ := model.AdmittedAt(requestID)
	if !ok {
		return model.Result{}, fmt.Errorf("lost %q: %w", requestID, model.ErrNotFound)
	}
	campaignID, _, _ := model.SplitTag(tag)
	soldOut := false
	if tag != campaignID {
		// A bucket of several: only the campaign's sold-out flag says no
		// other bucket can refill this one, and it lives in another slot.
		var err error
		if soldOut, err = s.SoldOut(ctx, campaignID); err != nil {
			return model.Result{}, fmt.Errorf("lost %s: %w", requestID, unavailable(err))
		}
	}
	k := campaignKeys(tag)
	reply, err := s.lost.Run(ctx, s.rdb, []string{k.results, k.counters, k.meta, k.stock},
		requestID, userID, admitted.UnixMilli(), grace.Milliseconds(), maxDelay.Milliseconds(), model.AdmissionSkew.Milliseconds(),
		model.ReasonLost, soldOut).Slice()
	if err != nil {
		return model.Result{}, fmt.Errorf("lost %s: %w", requestID, unavailable(err))
	}
	r, err := parseLostReply(requestID, campaignID, userID, reply)
	if err != nil {
		return model.Result{}, fmt.Errorf("lost %s: %w", requestID, err)
	}
	return r, nil
}

// parseLostReply is the one place that reads lost.lua's reply.
func parseLostReply(requestID, campaignID, userID string, reply []any) (model.Result, error) {
	if len(reply) == 0 {
		return model.Result{}, fmt.Errorf("empty reply")
	}
	code, ok := reply[0].(int64)
	if !ok {
		return model.Result{}, fmt.Errorf("reply code malformed: %v", reply[0])
	}
	switch {
	case code == 0 && len(reply) == 1:
		return model.Result{RequestID: requestID, CampaignID: campaignID, UserID: userID, Status: model.StatusQueued}, nil
	case code == -1 && len(reply) == 1:
		return model.Result{}, model.ErrNotFound
	case code == -2 && len(reply) == 1:
		return model.Result{}, model.ErrNotLoaded
	case (code == 1 || code == 2) && len(reply) == 2:
		v, ok := reply[1].(string)
		if !ok {
			return model.Result{}, fmt.Errorf("reply value malformed: %v", reply[1])
		}
		r, err := decodeStored(requestID, campaignID, v)
		if err != nil {
			return model.Result{}, err
		}
		if code == 2 && (r.Status != model.StatusRejected || r.Reason != model.ReasonLost) {
			return model.Result{}, fmt.Errorf("written %q, want rejected (%s)", v, model.ReasonLost)
		}
		return r, nil
	}
	return model.Result{}, fmt.Errorf("reply malformed: %v", reply)
}
