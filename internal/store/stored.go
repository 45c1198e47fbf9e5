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
	Seq int64
	// Made is a success's decision number (deduct.lua, the tag's counter
	// made), kept in the reason field, which a success has no other use
	// for. The success is durable once its tag's durable mark reaches it
	// (durable.lua); 0 (an empty field: stored before decision numbers, or
	// restored by rebuild.lua from an order) is durable by definition.
	Made   int64
	UserID string
}

// String is the stored form of v.
func (v storedResult) String() string {
	reason := v.Reason
	switch v.Status {
	case model.StatusQueued:
		reason = numberField(v.Seq)
	case model.StatusSuccess:
		reason = numberField(v.Made)
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
	switch v.Status {
	case model.StatusQueued:
		v.Reason = ""
		if v.Seq, err = parseNumberField(f[3]); err != nil {
			return storedResult{}, fmt.Errorf("stored result %q: sequence number", s)
		}
	case model.StatusSuccess:
		v.Reason = ""
		if v.Made, err = parseNumberField(f[3]); err != nil {
			return storedResult{}, fmt.Errorf("stored result %q: decision number", s)
		}
	}
	return v, nil
}

// numberField is n in the reason field: "" for 0, none.
func numberField(n int64) string {
	if n > 0 {
		return strconv.FormatInt(n, 10)
	}
	return ""
}

// parseNumberField reads numberField's form.
func parseNumberField(f string) (int64, error) {
	if f == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(f, 10, 64)
	if err != nil || n < 1 {
		return 0, errors.New("not a positive number")
	}
	return n, nil
}

// shown is v as a shopper may see it under its tag's durable mark: a
// success above the mark is still queued, without an order id, since its
// order may not be in MySQL yet and Redis alone may lose it. The prelude's
// stored_shown is the same in Lua.
func (v storedResult) shown(durable int64) storedResult {
	if v.Status != model.StatusSuccess || v.Made == 0 || v.Made <= durable {
		return v
	}
	return storedResult{Status: model.StatusQueued, Quantity: v.Quantity, UserID: v.UserID}
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

// Result returns the stored result of a request as a shopper may see it
// (storedResult.shown), or model.ErrNotFound. The tag's durable mark is
// read in the same round trip.
func (s *Store) Result(ctx context.Context, requestID string) (model.Result, error) {
	tag, ok := model.TagOfRequest(requestID)
	if !ok {
		return model.Result{}, fmt.Errorf("result %q: %w", requestID, model.ErrNotFound)
	}
	c, _, _ := model.SplitTag(tag)
	k := campaignKeys(tag)
	pipe := s.rdb.Pipeline()
	stored := pipe.HGet(ctx, k.results, requestID)
	durable := pipe.HGet(ctx, k.counters, "durable")
	_, err := pipe.Exec(ctx)
	if errors.Is(stored.Err(), redis.Nil) {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return model.Result{}, fmt.Errorf("result %s: %w: %v", requestID, model.ErrUnavailable, err)
	}
	return shownResult(requestID, c, stored.Val(), durable)
}

// shownResult decodes a stored result read with its tag's durable mark
// (counters durable; none before the tag's first raise).
func shownResult(requestID, campaignID, stored string, durable *redis.StringCmd) (model.Result, error) {
	v, err := parseStored(stored)
	if err != nil {
		return model.Result{}, err
	}
	mark, err := durable.Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return model.Result{}, fmt.Errorf("result %s: durable mark: %w", requestID, err)
	}
	return v.shown(mark).result(requestID, campaignID), nil
}

// Results returns the stored results of requestIDs as a shopper may see
// them (storedResult.shown), in their order, in one round trip: one HMGET
// and one read of the durable mark per tag (campaign or bucket), pipelined
// (a cluster client splits the pipeline by slot; each tag's two commands
// stay within its slot). An unknown or malformed id has the zero Result
// (empty Status) at its place. An error means no result was read.
func (s *Store) Results(ctx context.Context, requestIDs []string) ([]model.Result, error) {
	out := make([]model.Result, len(requestIDs))
	type read struct {
		tag     string
		at      []int // indexes into requestIDs
		cmd     *redis.SliceCmd
		durable *redis.StringCmd
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
	pipe := s.rdb.Pipeline()
	for _, rd := range reads {
		f := make([]string, len(rd.at))
		for j, i := range rd.at {
			f[j] = requestIDs[i]
		}
		k := campaignKeys(rd.tag)
		rd.cmd = pipe.HMGet(ctx, k.results, f...)
		rd.durable = pipe.HGet(ctx, k.counters, "durable")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("results of %d requests: %w", len(requestIDs), unavailable(err))
	}
	for _, rd := range reads {
		c, _, _ := model.SplitTag(rd.tag)
		for j, v := range rd.cmd.Val() {
			stored, ok := v.(string)
			if !ok {
				continue // nil: not stored
			}
			id := requestIDs[rd.at[j]]
			r, err := shownResult(id, c, stored, rd.durable)
			if err != nil {
				return nil, fmt.Errorf("result %s: %w", id, err)
			}
			out[rd.at[j]] = r
		}
	}
	return out, nil
}
