package store

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/model"
)

// LostSkew is what the lost rule allows for a request's admission read
// from its id: the UUIDv7's millisecond is the gateway's clock, taken
// before the batch's admit.lua call, while passed_ms is Redis's. A gateway
// whose clock runs this much behind Redis's (or whose batch waited this
// long) would have a request judged lost up to this much early.
const LostSkew = time.Second

// Lost finishes a request whose state died with Redis (lost.lua): when
// requestID has no result, the caller found no order for it in MySQL, and
// the queue has passed it (a request admitted the grace after it was
// decided; or it was admitted, or its sale ended, maxDelay ago), it
// stores a final rejected result with reason model.ReasonLost owned by
// userID, counted in the tag's lost counter. It returns the result that
// stands, as a shopper may see it: the stored one (whoever owns it), the
// one written now, or a queued result of userID with nothing written while
// the queue has not passed the request. A malformed id or an id whose time
// is outside the sale is model.ErrNotFound; a campaign not loaded in Redis
// (never, or Redis lost it) is model.ErrNotLoaded.
func (s *Store) Lost(ctx context.Context, requestID, userID string, grace, maxDelay time.Duration) (model.Result, error) {
	tag, ok := model.TagOfRequest(requestID)
	if !ok {
		return model.Result{}, fmt.Errorf("lost %q: %w", requestID, model.ErrNotFound)
	}
	campaignID, _, _ := model.SplitTag(tag)
	k := campaignKeys(tag)
	reply, err := s.lost.Run(ctx, s.rdb, []string{k.results, k.counters, k.meta, k.stock},
		requestID, userID, admittedMs(requestID), grace.Milliseconds(), maxDelay.Milliseconds(), LostSkew.Milliseconds(),
		model.ReasonLost).Slice()
	if err != nil {
		return model.Result{}, fmt.Errorf("lost %s: %w", requestID, unavailable(err))
	}
	r, err := parseLostReply(requestID, campaignID, userID, reply)
	if err != nil {
		return model.Result{}, fmt.Errorf("lost %s: %w", requestID, err)
	}
	return r, nil
}

// admittedMs is the millisecond of the UUIDv7 in a request id's tail (its
// first 48 bits), the gateway's clock when it admitted the request. The
// caller checked the id's form.
func admittedMs(requestID string) int64 {
	var b [8]byte
	_, _ = hex.Decode(b[2:], []byte(requestID[len(requestID)-32:][:12]))
	var ms int64
	for _, x := range b {
		ms = ms<<8 | int64(x)
	}
	return ms
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
