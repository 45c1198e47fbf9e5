package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/flashsale/flashsale/model"
)

// Deduct decides a batch of requests of one tag (a campaign, or one bucket
// of a campaign of several: model.TagOfRequest) in one atomic script call,
// under the epoch the reply names. It decides nothing when the
// campaign is not loaded (model.ErrNotLoaded) or paused (model.ErrPaused):
// the caller holds the batch until it is back.
// In a bucket of several, a request the bucket lacks the units for is
// decided only after stock moved from the others or every one was found
// empty (buckets.go).
func (s *Store) Deduct(ctx context.Context, tag string, batch []model.Deduction) (model.DeductReply, error) {
	if len(batch) == 0 {
		return model.DeductReply{}, nil
	}
	out, st, err := s.deductOnce(ctx, tag, batch, "")
	switch {
	case err != nil || st.buckets == 0:
		return out, err
	case st.shorts == 0:
		// This batch emptied its bucket: the campaign may be sold out.
		campaignID, _, _ := model.SplitTag(tag)
		out.SoldOutNow, err = s.markSoldOut(ctx, campaignID, st.buckets)
		return out, err
	}
	return s.deductShort(ctx, tag, batch, out, st)
}

// deductOnce runs deduct.lua once; final is ARGV[2+4n] (see there).
func (s *Store) deductOnce(ctx context.Context, tag string, batch []model.Deduction, final string) (model.DeductReply, shortState, error) {
	campaignID, _, ok := model.SplitTag(tag)
	if !ok {
		return model.DeductReply{}, shortState{}, fmt.Errorf("deduct %q: %w", tag, model.Invalid("campaign_id", "not a campaign or bucket"))
	}
	k := campaignKeys(tag)
	args := make([]any, 0, 2+4*len(batch))
	args = append(args, len(batch))
	for _, d := range batch {
		args = append(args, d.RequestID, d.UserID, d.Quantity, d.OrderID)
	}
	if final != "" {
		args = append(args, final)
	}
	reply, err := s.runAcked(ctx, s.deduct, []string{k.stock, k.users, k.results, k.soldout, k.counters, k.meta}, args...).Slice()
	if err != nil {
		return model.DeductReply{}, shortState{}, fmt.Errorf("deduct %s (%d requests): %w", tag, len(batch), err)
	}
	out, st, err := parseDeductReply(campaignID, batch, reply)
	if err != nil {
		return model.DeductReply{}, shortState{}, fmt.Errorf("deduct %s: %w", tag, err)
	}
	return out, st, nil
}

// shortState is what deduct.lua says of a bucket some requests were short
// in: how many, the campaign's bucket count, the bucket's moves counter.
type shortState struct {
	shorts  int
	buckets int
	moves   int64
}

// parseDeductReply is the one place that reads deduct.lua's reply. A short
// request's Result has the empty status.
func parseDeductReply(campaignID string, batch []model.Deduction, reply []any) (model.DeductReply, shortState, error) {
	var st shortState
	if len(reply) == 0 {
		return model.DeductReply{}, st, errors.New("empty reply")
	}
	flag, ok := reply[0].(int64)
	if !ok {
		return model.DeductReply{}, st, fmt.Errorf("reply[0] is %T, want integer", reply[0])
	}
	head := 2
	switch {
	case flag == -1 && len(reply) == 1:
		return model.DeductReply{}, st, model.ErrNotLoaded
	case flag == -2 && len(reply) == 1:
		return model.DeductReply{}, st, model.ErrPaused
	case flag == 2:
		head = 4
	case flag != 0 && flag != 1:
		return model.DeductReply{}, st, fmt.Errorf("reply[0] is %d, want 0, 1, 2, -1 or -2", flag)
	}
	if len(reply) != head+3*len(batch) {
		return model.DeductReply{}, st, fmt.Errorf("reply has %d elements, want %d", len(reply), head+3*len(batch))
	}
	epoch, ok := reply[1].(int64)
	if !ok || epoch < 0 {
		return model.DeductReply{}, st, fmt.Errorf("reply[1] is %v, want an epoch", reply[1])
	}
	if head == 4 {
		n, ok1 := reply[2].(int64)
		moves, ok2 := reply[3].(int64)
		if !ok1 || !ok2 || n < 2 || n > model.MaxBuckets || moves < 0 {
			return model.DeductReply{}, st, fmt.Errorf("reply[2:4] is %v, want buckets and moves", reply[2:4])
		}
		st.buckets, st.moves = int(n), moves
	}
	out := model.DeductReply{SoldOutNow: flag == 1, Epoch: model.Epoch(epoch), Results: make([]model.Result, len(batch))}
	for i, d := range batch {
		var f [3]string
		for j := range f {
			v, ok := reply[head+3*i+j].(string)
			if !ok {
				return model.DeductReply{}, st, fmt.Errorf("reply[%d] is %T, want string", head+3*i+j, reply[head+3*i+j])
			}
			f[j] = v
		}
		if f[0] == "short" && head == 4 {
			st.shorts++
			out.Results[i] = model.Result{RequestID: d.RequestID, CampaignID: campaignID, UserID: d.UserID, Quantity: d.Quantity}
			continue
		}
		st := model.Status(f[0])
		if !st.Final() {
			return model.DeductReply{}, shortState{}, fmt.Errorf("request %s: status %q is not final", d.RequestID, f[0])
		}
		if st == model.StatusSuccess {
			// A success's reason is its decision number.
			made, err := parseNumberField(f[2])
			if err != nil {
				return model.DeductReply{}, shortState{}, fmt.Errorf("request %s: decision number %q: %w", d.RequestID, f[2], err)
			}
			out.Made, f[2] = max(out.Made, made), ""
		}
		out.Results[i] = model.Result{
			RequestID: d.RequestID, CampaignID: campaignID, UserID: d.UserID,
			Status: st, OrderID: f[1], Reason: f[2], Quantity: d.Quantity,
		}
	}
	return out, st, nil
}
