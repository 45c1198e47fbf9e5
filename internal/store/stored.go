package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// storedResult is a request's value in its tag's results hash, the one
// codec of "status|qty|order|reason|user" in Go; the prelude's
// stored_result, stored_queued, parse_stored and stored_user (prelude.lua)
// are the same in Lua, and TestStoredFormat pins both to the same strings.
// The user id
// goes last, read as the rest after the fourth '|', because it is the only
// field that may hold '|' (any JWT subject, model.CheckUserID) or grow.
type storedResult struct {
	Status   model.Status
	Quantity int64
	OrderID  string
	// Reason is a final result's reason.
	Reason string
	// Seq is a queued marker's admission sequence number (admit.lua), kept
	// in the reason field, which a marker has no other use for; 0 in a
	// marker written before there was one (an empty field).
	Seq    int64
	UserID string
}

// String is the stored form of v.
func (v storedResult) String() string {
	reason := v.Reason
	if v.Status == model.StatusQueued {
		reason = ""
		if v.Seq > 0 {
			reason = strconv.FormatInt(v.Seq, 10)
		}
	}
	return string(v.Status) + "|" + strconv.FormatInt(v.Quantity, 10) + "|" + v.OrderID + "|" + reason + "|" + v.UserID
}

// parseStored reads a stored result; its status must be one model knows.
func parseStored(s string) (storedResult, error) {
	f := strings.SplitN(s, "|", 5)
	if len(f) != 5 {
		return storedResult{}, fmt.Errorf("stored result %q malformed", s)
	}
	qty, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return storedResult{}, fmt.Errorf("stored result %q: quantity: %w", s, err)
	}
	v := storedResult{Status: model.Status(f[0]), Quantity: qty, OrderID: f[2], Reason: f[3], UserID: f[4]}
	if !v.Status.Valid() {
		return storedResult{}, fmt.Errorf("stored result %q: unknown status", s)
	}
	if v.Status == model.StatusQueued {
		v.Reason = ""
		if f[3] != "" {
			if v.Seq, err = strconv.ParseInt(f[3], 10, 64); err != nil || v.Seq < 1 {
				return storedResult{}, fmt.Errorf("stored result %q: sequence number", s)
			}
		}
	}
	return v, nil
}

// storedOf is what the results hash keeps of r.
func storedOf(r model.Result) storedResult {
	return storedResult{Status: r.Status, Quantity: r.Quantity, OrderID: r.OrderID, Reason: r.Reason, Seq: r.Seq, UserID: r.UserID}
}

// result is v as the result of requestID of campaignID.
func (v storedResult) result(requestID, campaignID string) model.Result {
	return model.Result{RequestID: requestID, CampaignID: campaignID, Status: v.Status, Quantity: v.Quantity,
		OrderID: v.OrderID, Reason: v.Reason, Seq: v.Seq, UserID: v.UserID}
}

// decodeStored reads a stored result as the result of requestID of
// campaignID.
func decodeStored(requestID, campaignID, s string) (model.Result, error) {
	v, err := parseStored(s)
	if err != nil {
		return model.Result{}, err
	}
	return v.result(requestID, campaignID), nil
}

// Result returns the stored result of a request, or model.ErrNotFound.
func (s *Store) Result(ctx context.Context, requestID string) (model.Result, error) {
	tag, ok := model.TagOfRequest(requestID)
	if !ok {
		return model.Result{}, fmt.Errorf("result %q: %w", requestID, model.ErrNotFound)
	}
	c, _, _ := model.SplitTag(tag)
	v, err := s.rdb.HGet(ctx, campaignKeys(tag).results, requestID).Result()
	if errors.Is(err, redis.Nil) {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	if err != nil {
		return model.Result{}, fmt.Errorf("result %s: %w: %v", requestID, model.ErrUnavailable, err)
	}
	return decodeStored(requestID, c, v)
}

// Results returns the stored results of requestIDs, in their order, in one
// round trip: one HMGET per tag (campaign or bucket), pipelined when there are several (a
// cluster client splits the pipeline by slot; each HMGET stays within its
// campaign's slot). An unknown or malformed id has the zero Result (empty
// Status) at its place. An error means no result was read.
func (s *Store) Results(ctx context.Context, requestIDs []string) ([]model.Result, error) {
	out := make([]model.Result, len(requestIDs))
	type read struct {
		tag string
		at  []int // indexes into requestIDs
		cmd *redis.SliceCmd
	}
	var reads []*read
	byCampaign := map[string]*read{}
	for i, id := range requestIDs {
		c, ok := model.TagOfRequest(id)
		if !ok {
			continue
		}
		rd := byCampaign[c]
		if rd == nil {
			rd = &read{tag: c}
			byCampaign[c] = rd
			reads = append(reads, rd)
		}
		rd.at = append(rd.at, i)
	}
	if len(reads) == 0 {
		return out, nil
	}
	fields := func(rd *read) []string {
		f := make([]string, len(rd.at))
		for j, i := range rd.at {
			f[j] = requestIDs[i]
		}
		return f
	}
	var err error
	if len(reads) == 1 {
		// The usual case, one campaign: no pipeline to build.
		rd := reads[0]
		rd.cmd = s.rdb.HMGet(ctx, campaignKeys(rd.tag).results, fields(rd)...)
		err = rd.cmd.Err()
	} else {
		pipe := s.rdb.Pipeline()
		for _, rd := range reads {
			rd.cmd = pipe.HMGet(ctx, campaignKeys(rd.tag).results, fields(rd)...)
		}
		_, err = pipe.Exec(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("results of %d requests: %w", len(requestIDs), unavailable(err))
	}
	for _, rd := range reads {
		for j, v := range rd.cmd.Val() {
			stored, ok := v.(string)
			if !ok {
				continue // nil: not stored
			}
			id := requestIDs[rd.at[j]]
			c, _, _ := model.SplitTag(rd.tag)
			r, err := decodeStored(id, c, stored)
			if err != nil {
				return nil, fmt.Errorf("result %s: %w", id, err)
			}
			out[rd.at[j]] = r
		}
	}
	return out, nil
}
