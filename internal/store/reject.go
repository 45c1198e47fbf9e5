package store

import (
	"context"
	"fmt"

	"github.com/flashsale/flashsale/model"
)

// Reject gives a request a final rejected result with reason, unless it
// already has a final result, and returns the result that stands. The
// request is no longer one the not-enqueued sweep may reject.
func (s *Store) Reject(ctx context.Context, d model.Deduction, campaignID, reason string) (model.Result, error) {
	// The request's result lives under its tag (its bucket's, if any).
	k := campaignKeys(campaignID)
	if tag, ok := model.TagOfRequest(d.RequestID); ok {
		k = campaignKeys(tag)
	}
	v := storedResult{Status: model.StatusRejected, Quantity: d.Quantity, Reason: reason, UserID: d.UserID}.String()
	stored, err := s.reject.Run(ctx, s.rdb, []string{k.results, k.counters, k.meta}, d.RequestID, v).Text()
	if err != nil {
		return model.Result{}, fmt.Errorf("reject %s: %w", d.RequestID, err)
	}
	if c, _, ok := model.SplitTag(campaignID); ok {
		campaignID = c // the worker may name the bucket's tag
	}
	return decodeStored(d.RequestID, campaignID, stored)
}
