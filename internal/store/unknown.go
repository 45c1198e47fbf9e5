package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/model"
)

// A publish whose outcome is unknown (queue.ErrUnknown) leaves its requests
// admitted: the queue may hold their messages. AddUnknown records them per
// campaign (unknown.lua); a worker that sees one removes it (deduct.lua,
// reject.lua); SweepUnknown rejects those no worker has seen within the
// longest possible queue delay (sweep.lua), so every admitted request still
// ends in one final result whether its message was stored or not.

// unknownIndex is the set of campaigns that may have recorded requests
// published to topic, so that the sweep of the topic's consumers finds them
// without scanning the keyspace. It is the one key without a campaign's
// hash tag: no script touches it (on a cluster it lives in a slot of its
// own).
func unknownIndex(topic string) string { return "fs:unknown:" + topic }

// sweepBatch bounds the recorded requests one sweep.lua call looks at.
const sweepBatch = 500

// AddUnknown records admitted requests whose publish to topic had an
// unknown outcome, on Redis's clock (with min_replicas_ack, once replicas
// hold the record: it may be all that is left of a request). A campaign
// is added to the topic's index after its requests, so a sweep that
// empties the campaign's set and takes it off the index finds them when
// it checks again (SweepUnknown).
func (s *Store) AddUnknown(ctx context.Context, topic string, batch []model.AdmitRequest) error {
	var order []string
	ids := map[string][]any{}
	for _, a := range batch {
		if _, ok := ids[a.KeyTag()]; !ok {
			order = append(order, a.KeyTag())
		}
		ids[a.KeyTag()] = append(ids[a.KeyTag()], a.RequestID)
	}
	for _, c := range order {
		if err := s.runAcked(ctx, s.unknown, []string{campaignKeys(c).unknown, campaignKeys(c).meta}, ids[c]...).Err(); err != nil {
			return fmt.Errorf("record unknown publishes of %s: %w", c, err)
		}
		if err := s.rdb.SAdd(ctx, unknownIndex(topic), c).Err(); err != nil {
			return fmt.Errorf("record unknown publishes of %s: index: %w", c, err)
		}
	}
	return nil
}

// SweepUnknown gives a final rejected result with reason
// model.ReasonNotEnqueued to every request recorded for topic that is still
// queued maxDelay after it was recorded (on Redis's clock) and returns those
// results, for the caller to publish. Requests a worker has seen are no
// longer recorded; ones decided meanwhile keep their result. Paused
// campaigns are left alone, and so is a campaign resumed less than maxDelay
// ago. The results stored before an error are returned with it.
func (s *Store) SweepUnknown(ctx context.Context, topic string, maxDelay time.Duration) ([]model.Result, error) {
	campaigns, err := s.rdb.SMembers(ctx, unknownIndex(topic)).Result()
	if err != nil {
		return nil, fmt.Errorf("sweep unknown publishes: %w", err)
	}
	var out []model.Result
	var errs []error
	for _, c := range campaigns {
		results, err := s.sweepCampaign(ctx, topic, c, maxDelay)
		out = append(out, results...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// sweepCampaign sweeps one campaign in batches and takes it off the index
// once nothing of it is recorded.
func (s *Store) sweepCampaign(ctx context.Context, topic, campaignID string, maxDelay time.Duration) ([]model.Result, error) {
	k := campaignKeys(campaignID)
	keys := []string{k.unknown, k.results, k.counters, k.meta, k.stock}
	var out []model.Result
	for {
		reply, err := s.sweep.Run(ctx, s.rdb, keys, maxDelay.Milliseconds(), sweepBatch, model.ReasonNotEnqueued).Slice()
		if err != nil {
			return out, fmt.Errorf("sweep unknown publishes of %s: %w", campaignID, err)
		}
		owner, _, _ := model.SplitTag(campaignID) // the index holds tags
		left, looked, results, err := parseSweepReply(owner, reply)
		if err != nil {
			return out, fmt.Errorf("sweep unknown publishes of %s: %w", campaignID, err)
		}
		out = append(out, results...)
		if looked < sweepBatch { // else more may be due: each call removes what it looked at
			if left > 0 {
				return out, nil
			}
			break
		}
	}
	// A request recorded between the script and SREM is in the set before
	// its campaign is added back to the index (AddUnknown's order), so
	// looking again after SREM cannot miss it.
	index := unknownIndex(topic)
	if err := s.rdb.SRem(ctx, index, campaignID).Err(); err != nil {
		return out, fmt.Errorf("sweep unknown publishes of %s: index: %w", campaignID, err)
	}
	n, err := s.rdb.ZCard(ctx, k.unknown).Result()
	if err == nil && n > 0 {
		err = s.rdb.SAdd(ctx, index, campaignID).Err()
	}
	if err != nil {
		return out, fmt.Errorf("sweep unknown publishes of %s: index: %w", campaignID, err)
	}
	return out, nil
}

// parseSweepReply is the one place that reads sweep.lua's reply.
func parseSweepReply(campaignID string, reply []any) (left, looked int64, results []model.Result, err error) {
	if len(reply) < 2 || len(reply)%2 != 0 {
		return 0, 0, nil, fmt.Errorf("reply has %d elements, want 2 + pairs", len(reply))
	}
	left, ok1 := reply[0].(int64)
	looked, ok2 := reply[1].(int64)
	if !ok1 || !ok2 || left < 0 || looked < 0 || int(looked) < (len(reply)-2)/2 {
		return 0, 0, nil, fmt.Errorf("reply counts malformed: %v, %v", reply[0], reply[1])
	}
	for i := 2; i < len(reply); i += 2 {
		rid, ok1 := reply[i].(string)
		v, ok2 := reply[i+1].(string)
		if !ok1 || !ok2 {
			return 0, 0, nil, fmt.Errorf("reply[%d:%d] malformed: %v, %v", i, i+2, reply[i], reply[i+1])
		}
		r, err := decodeStored(rid, campaignID, v)
		if err != nil {
			return 0, 0, nil, err
		}
		if r.Status != model.StatusRejected {
			return 0, 0, nil, fmt.Errorf("request %s: status %q, want rejected", rid, r.Status)
		}
		results = append(results, r)
	}
	return left, looked, results, nil
}
