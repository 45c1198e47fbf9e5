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

// encodeStored is the compact form kept in the results hash; the Lua scripts
// read and write the same "status|qty|order_id|reason|user" layout. The user id
// goes last, read as the rest after the fourth '|', because it is the only
// field that may hold '|' (any JWT subject, model.CheckUserID) or grow.
func encodeStored(r model.Result) string {
	return string(r.Status) + "|" + strconv.FormatInt(r.Quantity, 10) + "|" + r.OrderID + "|" + r.Reason + "|" + r.UserID
}

func decodeStored(requestID, campaignID, v string) (model.Result, error) {
	f := strings.SplitN(v, "|", 5)
	if len(f) != 5 {
		return model.Result{}, fmt.Errorf("stored result %q malformed", v)
	}
	qty, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return model.Result{}, fmt.Errorf("stored result %q: quantity: %w", v, err)
	}
	st := model.Status(f[0])
	if !st.Valid() {
		return model.Result{}, fmt.Errorf("stored result %q: unknown status", v)
	}
	r := model.Result{RequestID: requestID, CampaignID: campaignID, Status: st, Quantity: qty,
		OrderID: f[2], Reason: f[3], UserID: f[4]}
	if st == model.StatusQueued {
		// A queued marker's reason field holds its admission sequence number
		// (admit.lua); empty in markers written before there was one.
		r.Reason = ""
		if f[3] != "" {
			if r.Seq, err = strconv.ParseInt(f[3], 10, 64); err != nil || r.Seq < 1 {
				return model.Result{}, fmt.Errorf("stored result %q: sequence number", v)
			}
		}
	}
	return r, nil
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
