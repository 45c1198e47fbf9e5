package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// ReplicaAck makes a deduction count only once its writes reached replicas:
// Redis replicates asynchronously, so a master that fails over right after a
// deduction may lose it, and its units would be sold again.
type ReplicaAck struct {
	// Replicas is how many replicas must have the writes; 0 turns it off.
	Replicas int
	// Timeout bounds the wait (WAIT's timeout). Fewer replicas by then is
	// model.ErrUnavailable: the batch is decided again later, which
	// deduct.lua answers from its stored results, plus another wait.
	Timeout time.Duration
	// Observe, when set, is told the latency of each deduction with its
	// wait (one round trip) and how many of the wanted replicas
	// acknowledged.
	Observe func(latency time.Duration, acked, wanted int)
}

// WithReplicaAck makes Deduct wait for a's replicas (when a.Replicas > 0).
func WithReplicaAck(a ReplicaAck) Option {
	return func(s *Store) { s.replicaAck = a }
}

// runDeduct runs deduct.lua, followed by WAIT when replicas must acknowledge.
func (s *Store) runDeduct(ctx context.Context, keys []string, args []any) ([]any, error) {
	if s.replicaAck.Replicas <= 0 {
		return s.deduct.Run(ctx, s.rdb, keys, args...).Slice()
	}
	// WAIT counts the writes of its own connection, so the script and the
	// WAIT go down one connection, pipelined: one round trip. On a cluster
	// it is one of the master that holds the campaign's slot.
	var node redis.UniversalClient = s.rdb
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, unavailable(err)
		}
		node = m
	}
	conn, ok := node.(*redis.Client)
	if !ok {
		return nil, fmt.Errorf("min_replicas_ack needs a Redis client or cluster, not %T", node)
	}
	c := conn.Conn()
	defer c.Close()
	reply, err := s.deductAndWait(ctx, c, keys, args, false)
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		reply, err = s.deductAndWait(ctx, c, keys, args, true)
	}
	return reply, err
}

// deductAndWait pipelines EVALSHA (EVAL when load) and WAIT on c.
func (s *Store) deductAndWait(ctx context.Context, c *redis.Conn, keys []string, args []any, load bool) ([]any, error) {
	a := s.replicaAck
	var run *redis.Cmd
	var wait *redis.IntCmd
	start := time.Now()
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if load {
			run = s.deduct.Eval(ctx, p, keys, args...)
		} else {
			run = s.deduct.EvalSha(ctx, p, keys, args...)
		}
		// Pipeliner lacks Wait, which *redis.Pipeline has: unlike a plain
		// Do, it gives the read the time WAIT may block.
		wait = p.(interface {
			Wait(context.Context, int, time.Duration) *redis.IntCmd
		}).Wait(ctx, a.Replicas, a.Timeout)
		return nil
	})
	reply, err := run.Slice()
	switch {
	case redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK"):
		// The slot moved since MasterForKey: the batch comes back, by
		// then to the slot's new master.
		if cc, ok := s.rdb.(*redis.ClusterClient); ok {
			cc.ReloadState(ctx)
		}
		return nil, fmt.Errorf("%w: %w", model.ErrUnavailable, err)
	case err != nil:
		// A master that died mid-call holds the batch like one that
		// answers short; a script error stays an error.
		return nil, unavailable(err)
	}
	acked, err := wait.Result()
	if err != nil {
		return nil, unavailable(fmt.Errorf("wait for %d replicas: %w", a.Replicas, err))
	}
	if a.Observe != nil {
		a.Observe(time.Since(start), int(acked), a.Replicas)
	}
	if acked < int64(a.Replicas) {
		return nil, fmt.Errorf("%w: %d of %d replicas acknowledged the deduction within %v",
			model.ErrUnavailable, acked, a.Replicas, a.Timeout)
	}
	return reply, nil
}
