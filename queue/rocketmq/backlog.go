package rocketmq

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
)

// Backlog reads, queue by queue, what topic holds that the consumer group
// has not acknowledged: the broker's max offset minus the group's committed
// offset, and the age of the oldest of those messages (its store time, read
// with a one-message pull). A broker cannot tell the messages handed to a
// consumer from those waiting, so Lag counts both and Pending is 0. The
// partitions are the topic's queues in the order of their broker's name,
// then their id.
func (q *Queue) Backlog(ctx context.Context, topic string) ([]queue.Backlog, error) {
	return q.probe.backlog(ctx, q.opts.ConsumerGroup, topic)
}

func (p *prober) backlog(ctx context.Context, group, topic string) ([]queue.Backlog, error) {
	r, err := p.route(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []queue.Backlog
	for _, name := range slices.Sorted(maps.Keys(r.readQueues)) {
		addr := r.brokers[name]
		if addr == "" {
			return nil, fmt.Errorf("backlog of %s: broker %s has no master in the route", topic, name)
		}
		for id := range r.readQueues[name] {
			b, err := p.queueBacklog(ctx, addr, group, topic, id)
			if err != nil {
				return nil, fmt.Errorf("backlog of %s, queue %d of %s: %w", topic, id, name, err)
			}
			b.Partition = len(out)
			out = append(out, b)
		}
	}
	return out, nil
}

// queueBacklog reads one queue's backlog from its broker at addr.
func (p *prober) queueBacklog(ctx context.Context, addr, group, topic string, id int) (queue.Backlog, error) {
	qid := strconv.Itoa(id)
	offset := func(code int16, ext map[string]string) (int64, bool, error) {
		resp, err := p.call(ctx, addr, remoting.NewRequest(code, ext, nil))
		if err != nil {
			return 0, false, err
		}
		switch resp.Code {
		case remoting.Success:
			off, err := strconv.ParseInt(resp.Ext("offset"), 10, 64)
			return off, true, err
		case remoting.QueryNotFound:
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("request %d: code %d: %s", code, resp.Code, resp.Remark)
	}
	queueExt := map[string]string{"topic": topic, "queueId": qid}
	last, _, err := offset(remoting.GetMaxOffset, queueExt)
	if err != nil {
		return queue.Backlog{}, err
	}
	next, ok, err := offset(remoting.QueryConsumerOffset, map[string]string{"consumerGroup": group, "topic": topic, "queueId": qid})
	if err != nil {
		return queue.Backlog{}, err
	}
	if !ok {
		// Nothing committed yet: the group starts at the oldest message
		// kept (ConsumeFromFirstOffset).
		if next, _, err = offset(remoting.GetMinOffset, queueExt); err != nil {
			return queue.Backlog{}, err
		}
	}
	b := queue.Backlog{Lag: max(last-next, 0)}
	if b.Lag == 0 {
		return b, nil
	}
	// The oldest unacknowledged message, pulled with its subscription in
	// the request and no commit flag: the broker needs no consumer of the
	// group registered and commits nothing (4.9.4's PullMessageProcessor).
	resp, err := p.call(ctx, addr, remoting.NewRequest(remoting.PullMessage, map[string]string{
		"consumerGroup": group, "topic": topic, "queueId": qid, "queueOffset": strconv.FormatInt(next, 10),
		"maxMsgNums": "1", "sysFlag": strconv.Itoa(pullSysFlagSubscription), "commitOffset": "0",
		"suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0", "expressionType": "TAG",
	}, nil))
	if err != nil {
		return queue.Backlog{}, err
	}
	if resp.Code != remoting.Success {
		return b, nil // trimmed or not found meanwhile: the age is unknown
	}
	if msgs := primitive.DecodeMessage(resp.Body); len(msgs) > 0 {
		b.OldestAge = max(time.Since(time.UnixMilli(msgs[0].StoreTimestamp)), 0)
	}
	return b, nil
}

// pullSysFlagSubscription is PullSysFlag's FLAG_SUBSCRIPTION: the pull
// carries its subscription.
const pullSysFlagSubscription = 1 << 2
