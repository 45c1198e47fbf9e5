package redisstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/queue"
)

// ReplicaAck makes a publish count only once its messages reached
// replicas. Redis replicates asynchronously: a master that fails over right
// after an XADD may lose the entry, and a publisher that answered "queued"
// would have lost the message it promised to deliver.
type ReplicaAck struct {
	// Replicas is how many replicas must hold the messages; 0 turns it off.
	Replicas int
	// Timeout bounds the wait (WAIT's timeout). Fewer replicas by then is
	// queue.ErrUnknown: the master holds the messages, a failover may
	// lose them.
	Timeout time.Duration
	// Observe, when set, is told the latency of each node's XADDs with
	// their wait (one round trip) and how many replicas acknowledged.
	Observe func(latency time.Duration, acked, wanted int)
}

// publishAcked is Publish with ReplicaAck: WAIT counts the writes of its
// own connection, so each node's XADDs and their WAIT go down one
// connection of that node, pipelined (one round trip per node, the nodes in
// parallel).
func (q *Queue) publishAcked(ctx context.Context, topic string, msgs []queue.Message) error {
	return q.ackedByNode(ctx, topic, msgs, q.publishToNode)
}

// ackedByNode writes msgs with send, one call per node that holds some of
// their partitions, the nodes in parallel, and sums up what the nodes did:
// nil once every node stored its share and its replicas acknowledged it,
// Redis's refusal if nothing was stored, queue.ErrUnknown otherwise.
func (q *Queue) ackedByNode(ctx context.Context, topic string, msgs []queue.Message, send func(context.Context, string, nodeBatch) nodeOutcome) error {
	batches, err := q.byNode(ctx, topic, msgs)
	if err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	outcomes := make([]nodeOutcome, len(batches))
	if len(batches) == 1 {
		outcomes[0] = send(ctx, topic, batches[0])
	} else {
		var wg sync.WaitGroup
		for i, b := range batches {
			wg.Go(func() { outcomes[i] = send(ctx, topic, b) })
		}
		wg.Wait()
	}
	refused, acked := 0, true
	var errs []error
	for _, o := range outcomes {
		refused += o.refused
		acked = acked && o.acked
		if o.err != nil {
			errs = append(errs, o.err)
		}
	}
	switch {
	case len(errs) == 0 && acked:
		return nil
	case refused == len(msgs):
		return fmt.Errorf("publish %s: %w", topic, errors.Join(errs...))
	}
	return fmt.Errorf("publish %s: %w: %w", topic, queue.ErrUnknown, errors.Join(errs...))
}

// nodeBatch is the messages of one publish that go to one node.
type nodeBatch struct {
	node *redis.Client
	msgs []queue.Message
}

// nodeOutcome is what one node did with its batch: how many messages it
// refused (a Redis error reply: not stored), whether its replicas
// acknowledged the rest, and the error if anything went wrong.
type nodeOutcome struct {
	refused int
	acked   bool
	err     error
}

// byNode splits msgs by the node that holds their partition's slot: on a
// cluster its master, else the one client.
func (q *Queue) byNode(ctx context.Context, topic string, msgs []queue.Message) ([]nodeBatch, error) {
	cc, ok := q.rdb.(*redis.ClusterClient)
	if !ok {
		node, ok := q.rdb.(*redis.Client)
		if !ok {
			return nil, fmt.Errorf("replica acks need a Redis client or cluster, not %T", q.rdb)
		}
		return []nodeBatch{{node: node, msgs: msgs}}, nil
	}
	var out []nodeBatch
	index := map[*redis.Client]int{}
	masters := map[int]*redis.Client{} // by partition
	for _, m := range msgs {
		p := queue.PartitionOf(m.Key, q.opts.Partitions)
		node, ok := masters[p]
		if !ok {
			var err error
			if node, err = cc.MasterForKey(ctx, streamKey(topic, p)); err != nil {
				return nil, err
			}
			masters[p] = node
		}
		i, ok := index[node]
		if !ok {
			i = len(out)
			index[node] = i
			out = append(out, nodeBatch{node: node})
		}
		out[i].msgs = append(out[i].msgs, m)
	}
	return out, nil
}

// publishToNode pipelines b's XADDs and a WAIT on one connection of b's
// node.
func (q *Queue) publishToNode(ctx context.Context, topic string, b nodeBatch) nodeOutcome {
	a := q.opts.ReplicaAck
	c := b.node.Conn()
	defer c.Close()
	adds := make([]*redis.StringCmd, len(b.msgs))
	var wait *redis.IntCmd
	start := time.Now()
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, m := range b.msgs {
			adds[i] = p.XAdd(ctx, &redis.XAddArgs{
				Stream: streamKey(topic, queue.PartitionOf(m.Key, q.opts.Partitions)),
				Values: []any{fieldID, m.ID, fieldKey, m.Key, fieldBody, m.Body},
			})
		}
		wait = pipelineWait(ctx, p, a)
		return nil
	})
	var out nodeOutcome
	moved := false
	for _, add := range adds {
		var rerr redis.Error
		if errors.As(add.Err(), &rerr) {
			out.refused++
			moved = moved || redis.HasErrorPrefix(add.Err(), "MOVED") || redis.HasErrorPrefix(add.Err(), "ASK")
		}
	}
	if moved {
		// The slot moved since MasterForKey: the next publish asks the
		// cluster again.
		if cc, ok := q.rdb.(*redis.ClusterClient); ok {
			cc.ReloadState(ctx)
		}
	}
	if err != nil {
		out.err = err
		return out
	}
	return q.replicated(out, wait, start, len(b.msgs))
}

// pipelineWait queues WAIT for a's replicas on p. Pipeliner lacks Wait,
// which *redis.Pipeline has: unlike a plain Do, it gives the read the time
// WAIT may block.
func pipelineWait(ctx context.Context, p redis.Pipeliner, a ReplicaAck) *redis.IntCmd {
	return p.(interface {
		Wait(context.Context, int, time.Duration) *redis.IntCmd
	}).Wait(ctx, a.Replicas, a.Timeout)
}

// replicated completes out with wait's answer for n messages written since
// start.
func (q *Queue) replicated(out nodeOutcome, wait *redis.IntCmd, start time.Time, n int) nodeOutcome {
	a := q.opts.ReplicaAck
	acked, err := wait.Result()
	if err != nil {
		out.err = fmt.Errorf("wait for %d replicas: %w", a.Replicas, err)
		return out
	}
	if a.Observe != nil {
		a.Observe(time.Since(start), int(acked), a.Replicas)
	}
	if acked < int64(a.Replicas) {
		out.err = fmt.Errorf("%d of %d replicas acknowledged %d messages within %v", acked, a.Replicas, n, a.Timeout)
		return out
	}
	out.acked = true
	return out
}
