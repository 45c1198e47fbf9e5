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

// runAcked runs script, followed by WAIT when replicas must acknowledge its
// writes (deductions; the sold-out flag, the transfers and releases of a
// campaign's buckets). A shortfall is the Cmd's error,
// model.ErrUnavailable: what the script did stands on the master, and the
// caller repeats the call, which each of these scripts answers as before.
func (s *Store) runAcked(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.replicaAck.Replicas <= 0 {
		return script.Run(ctx, s.rdb, keys, args...)
	}
	fail := func(err error) *redis.Cmd {
		c := redis.NewCmd(ctx)
		c.SetErr(err)
		return c
	}
	// WAIT counts the writes of its own connection, so the script and the
	// WAIT go down one connection, pipelined: one round trip. On a cluster
	// it is one of the master that holds the keys' slot.
	var node redis.UniversalClient = s.rdb
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return fail(unavailable(err))
		}
		node = m
	}
	conn, ok := node.(*redis.Client)
	if !ok {
		return fail(fmt.Errorf("min_replicas_ack needs a Redis client or cluster, not %T", node))
	}
	c := conn.Conn()
	defer c.Close()
	run := s.runAndWait(ctx, c, script, keys, args, false)
	if redis.HasErrorPrefix(run.Err(), "NOSCRIPT") {
		run = s.runAndWait(ctx, c, script, keys, args, true)
	}
	return run
}

// runAndWait pipelines EVALSHA (EVAL when load) and WAIT on c.
func (s *Store) runAndWait(ctx context.Context, c *redis.Conn, script *redis.Script, keys []string, args []any, load bool) *redis.Cmd {
	a := s.replicaAck
	var run *redis.Cmd
	var wait *redis.IntCmd
	start := time.Now()
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if load {
			run = script.Eval(ctx, p, keys, args...)
		} else {
			run = script.EvalSha(ctx, p, keys, args...)
		}
		// Pipeliner lacks Wait, which *redis.Pipeline has: unlike a plain
		// Do, it gives the read the time WAIT may block.
		wait = p.(interface {
			Wait(context.Context, int, time.Duration) *redis.IntCmd
		}).Wait(ctx, a.Replicas, a.Timeout)
		return nil
	})
	err := run.Err()
	switch {
	case redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK"):
		// The slot moved since MasterForKey: the call comes back, by
		// then to the slot's new master.
		if cc, ok := s.rdb.(*redis.ClusterClient); ok {
			cc.ReloadState(ctx)
		}
		run.SetErr(fmt.Errorf("%w: %w", model.ErrUnavailable, err))
		return run
	case err != nil:
		// A master that died mid-call holds the batch like one that
		// answers short; a script error (NOSCRIPT too) stays itself.
		run.SetErr(unavailable(err))
		return run
	}
	acked, err := wait.Result()
	if err != nil {
		run.SetErr(unavailable(fmt.Errorf("wait for %d replicas: %w", a.Replicas, err)))
		return run
	}
	if a.Observe != nil {
		a.Observe(time.Since(start), int(acked), a.Replicas)
	}
	if acked < int64(a.Replicas) {
		run.SetErr(fmt.Errorf("%w: %d of %d replicas acknowledged the writes within %v",
			model.ErrUnavailable, acked, a.Replicas, a.Timeout))
	}
	return run
}
