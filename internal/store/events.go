package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// PublishEvent broadcasts e to every gateway.
func (s *Store) PublishEvent(ctx context.Context, e model.Event) error {
	if err := s.rdb.Publish(ctx, EventsChannel, string(e.Type)+" "+e.CampaignID).Err(); err != nil {
		return fmt.Errorf("publish event %s %s: %w", e.Type, e.CampaignID, err)
	}
	return nil
}

// resultsPerMessage bounds how many results share one message on
// ResultsChannel (about 200 bytes each).
const resultsPerMessage = 256

// PublishResults broadcasts final results to every notifier, in one round
// trip. Results travel many to a message, one JSON object a line (JSON text
// holds no raw newline): Redis then fans out one message per batch instead
// of one per result, and a worker's batch of 512 costs it 2 PUBLISHes, not
// 512. A subscriber of an older version cannot read such a message and
// drops it; its waiters still get their results from the stored copy (the
// notifier's periodic re-check).
func (s *Store) PublishResults(ctx context.Context, results []model.Result) error {
	if len(results) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	for start := 0; start < len(results); start += resultsPerMessage {
		part := results[start:min(start+resultsPerMessage, len(results))]
		msg := make([]byte, 0, 200*len(part))
		for i, r := range part {
			if i > 0 {
				msg = append(msg, '\n')
			}
			var err error
			if msg, err = model.AppendResult(msg, r); err != nil {
				return fmt.Errorf("publish results: %w", err)
			}
		}
		pipe.Publish(ctx, ResultsChannel, msg)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("publish %d results: %w", len(results), err)
	}
	return nil
}

// SubscribeEvents calls fn for every campaign event until ctx ends. ready is
// called once the subscription is confirmed. Malformed events are ignored.
func (s *Store) SubscribeEvents(ctx context.Context, ready func(), fn func(model.Event)) error {
	return s.subscribe(ctx, EventsChannel, ready, func(payload string) {
		t, id, ok := strings.Cut(payload, " ")
		if ok && model.ValidCampaignID(id) {
			fn(model.Event{Type: model.EventType(t), CampaignID: id})
		}
	})
}

// SubscribeResults calls fn for every published result until ctx ends. ready
// is called once the subscription is confirmed. Results published while the
// connection is being re-established are missed: subscribers re-read stored
// results for what they still wait on.
func (s *Store) SubscribeResults(ctx context.Context, ready func(), fn func(model.Result)) error {
	return s.subscribe(ctx, ResultsChannel, ready, func(payload string) {
		for line := range strings.SplitSeq(payload, "\n") {
			if r, err := model.DecodeResult([]byte(line)); err == nil {
				fn(r)
			}
		}
	})
}

func (s *Store) subscribe(ctx context.Context, channel string, ready func(), fn func(string)) error {
	ps := s.rdb.Subscribe(ctx, channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("subscribe %s: %w", channel, err)
	}
	if ready != nil {
		ready()
	}
	ch := ps.Channel(redis.WithChannelSize(4096))
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			fn(m.Payload)
		}
	}
}
