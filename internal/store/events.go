package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

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

// resultsPerMessage bounds how many results share one message on a results
// channel (about 200 bytes each).
const resultsPerMessage = 256

// resultsChannel is the channel of the results of a tag: a campaign, or one
// bucket of a campaign of several (model.TagOfRequest). Its hash tag puts it
// in the slot of the tag's keys: SPUBLISH runs on the shard that decided the
// results, and only the notifiers that subscribed to it (they have a
// shopper waiting on it) receive them. So a bucketed campaign's results
// spread over the shards of its buckets, as its deductions do.
func resultsChannel(tag string) string { return "fs:{" + tag + "}:published" }

// PublishResults sends final results to the notifiers that wait on their
// campaigns, in one round trip (one per shard on a cluster). Results travel
// many to a message, one JSON object a line (JSON text holds no raw newline):
// Redis then fans out one message per campaign and batch instead of one per
// result, and a worker's batch of 512 costs it 2 SPUBLISHes, not 512. A
// subscriber of an older version cannot read such a message and drops it;
// its waiters still get their results from the stored copy (the notifier's
// periodic re-check).
func (s *Store) PublishResults(ctx context.Context, results []model.Result) error {
	if len(results) == 0 {
		return nil
	}
	// Group by tag, keeping each tag's order: a worker's batch is one
	// tag's, so this is usually one group.
	var order []string
	groups := map[string][]model.Result{}
	for _, r := range results {
		tag, ok := model.TagOfRequest(r.RequestID)
		if !ok {
			tag = r.CampaignID
		}
		if _, ok := groups[tag]; !ok {
			order = append(order, tag)
		}
		groups[tag] = append(groups[tag], r)
	}
	pipe := s.rdb.Pipeline()
	for _, tag := range order {
		group := groups[tag]
		for start := 0; start < len(group); start += resultsPerMessage {
			part := group[start:min(start+resultsPerMessage, len(group))]
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
			if s.plainResults {
				pipe.Publish(ctx, resultsChannel(tag), msg)
			} else {
				pipe.SPublish(ctx, resultsChannel(tag), msg)
			}
		}
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

// SubscribeResults calls fn for every result published for tag (a campaign
// id, or a bucket's tag: model.TagOfRequest) until ctx ends. It calls ready when Redis confirms the subscription; results
// published before that are missed, so subscribers re-read the stored
// results they wait on once it is confirmed again after an error. It
// returns an error when the subscription fails, its connection breaks, the
// server ends it (the tag's slot moved to another shard) or refuses it
// (MOVED: the client's slot map was stale): the caller subscribes again,
// which looks the slot's master up anew.
func (s *Store) SubscribeResults(ctx context.Context, tag string, ready func(), fn func(model.Result)) error {
	channel := resultsChannel(tag)
	var ps *redis.PubSub
	var err error
	if s.plainResults {
		ps = s.rdb.Subscribe(ctx)
		err = ps.Subscribe(ctx, channel)
	} else {
		// On a cluster the PubSub connects to the master of the
		// channel's slot.
		ps = s.rdb.SSubscribe(ctx)
		err = ps.SSubscribe(ctx, channel)
	}
	defer ps.Close()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("subscribe %s: %w", channel, err)
	}
	// go-redis's ChannelWithSubscriptions would hide an error reply (a
	// MOVED to SSUBSCRIBE leaves it waiting on the wrong node for good),
	// so the messages are received here; closing ps ends a Receive when
	// ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	for {
		m, err := ps.ReceiveTimeout(ctx, resultsHealthCheck)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Quiet: a ping proves the connection, or breaks the
				// next Receive.
				_ = ps.Ping(ctx)
				continue
			}
			return fmt.Errorf("subscription %s: %w", channel, err)
		}
		switch m := m.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				if ready != nil {
					ready()
				}
			case "unsubscribe", "sunsubscribe":
				return fmt.Errorf("subscription %s: ended by the server", channel)
			}
		case *redis.Message:
			for line := range strings.SplitSeq(m.Payload, "\n") {
				if r, err := model.DecodeResult([]byte(line)); err == nil {
					fn(r)
				}
			}
		}
	}
}

// resultsHealthCheck is how long a results subscription may stay silent
// before a ping checks its connection.
const resultsHealthCheck = 10 * time.Second

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
