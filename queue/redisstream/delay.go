package redisstream

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/queue"
)

// Delayed delivery. PublishDelayed puts each message in its partition's
// delayed set, a sorted set scored by due time on Redis's clock
// (delay_add.lua); every running Consume call moves the topic's due messages
// into their streams every Options.MoveInterval (delay_move.lua), and from
// there they are delivered as published ones are. The set shares its
// stream's hash tag, so each script stays in one slot, and a message's
// partition is its key's, as for Publish, so once moved it keeps its place in
// the key's order: behind what reached the stream before it, ahead of what
// comes after. The move is atomic, so the consumers need no agreement on who
// moves: each due message is moved exactly once, however many run, and no
// process has a role of its own to deploy.

var (
	//go:embed delay_add.lua
	delayAddSrc string
	//go:embed delay_move.lua
	delayMoveSrc string
)

// moveLimit bounds the messages one move script takes, and so how long it
// holds Redis; a mover runs it again while it moves this many.
const moveLimit = 128

// delayScripts are the delayed set's Lua scripts, parsed once per Queue.
type delayScripts struct {
	add  *redis.Script
	move *redis.Script
}

func newDelayScripts() delayScripts {
	return delayScripts{add: redis.NewScript(delayAddSrc), move: redis.NewScript(delayMoveSrc)}
}

// PublishDelayed stores msgs at once and has them delivered no earlier than
// delay from now, measured on Redis's clock, and typically within
// Options.MoveInterval after that while a consumer runs. delay <= 0 is
// Publish. It fails as Publish does: queue.ErrClosed after Close, ctx's error
// if ctx is already done, Redis's refusal if nothing was stored, and
// queue.ErrUnknown wrapped around any other failure, a ReplicaAck shortfall
// included (it waits for replicas as Publish does).
func (q *Queue) PublishDelayed(ctx context.Context, topic string, delay time.Duration, msgs ...queue.Message) error {
	if delay <= 0 {
		return q.Publish(ctx, topic, msgs...)
	}
	if err := q.checkPublish(ctx, topic); err != nil {
		return err
	}
	ms := int64((delay + time.Millisecond - 1) / time.Millisecond)
	if q.opts.ReplicaAck.Replicas > 0 {
		return q.ackedByNode(ctx, topic, msgs, func(ctx context.Context, topic string, b nodeBatch) nodeOutcome {
			return q.delayToNode(ctx, topic, ms, b)
		})
	}
	order, args := delayArgs(q.opts.Partitions, ms, msgs)
	for i, p := range order {
		err := q.delays.add.Run(ctx, q.rdb, []string{delayedKey(topic, p), delaySeqKey(topic, p)}, args[p]...).Err()
		if err == nil {
			continue
		}
		var rerr redis.Error
		if i == 0 && errors.As(err, &rerr) {
			return fmt.Errorf("publish %s: %w", topic, err)
		}
		return fmt.Errorf("publish %s: %w: %w", topic, queue.ErrUnknown, err)
	}
	return nil
}

// moveDue moves up to limit of partition p's due delayed messages into its
// stream and returns how many it moved.
func moveDue(ctx context.Context, rdb redis.UniversalClient, s delayScripts, topic string, p, limit int) (int, error) {
	n, err := s.move.Run(ctx, rdb, []string{delayedKey(topic, p), streamKey(topic, p)}, limit).Int()
	if err != nil {
		return 0, fmt.Errorf("move due messages of %s: %w", delayedKey(topic, p), err)
	}
	return n, nil
}

// moveLoop moves the topic's due delayed messages into their streams at
// once and then every Options.MoveInterval, jittered so that consumers
// spread out, until ctx is done. It moves from every partition, not only
// those this run holds: a partition whose holder is being replaced still
// has its messages ready in order when the next holder reads.
func (r *run) moveLoop(ctx context.Context) error {
	failures := 0
	for {
		err := r.moveAll(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case isFatal(err):
			return err
		case err != nil:
			failures++
			r.log.Warn("move due messages", "err", err)
		default:
			failures = 0
		}
		wait := r.opts.MoveInterval - r.opts.MoveInterval/5 + rand.N(2*r.opts.MoveInterval/5+1)
		if failures > 0 {
			wait = max(wait, queue.Backoff(errorBackoff, failures))
		}
		if !sleep(ctx, wait) {
			return nil
		}
	}
}

// moveAll moves every partition's due delayed messages, partition by
// partition; it returns the first error after trying them all.
func (r *run) moveAll(ctx context.Context) error {
	var first error
	for p := range r.opts.Partitions {
		for ctx.Err() == nil {
			n, err := moveDue(ctx, r.q.rdb, r.q.delays, r.topic, p, moveLimit)
			if isFatal(err) {
				return err
			}
			if err != nil {
				first = cmp.Or(first, err)
				break
			}
			if n < moveLimit {
				break
			}
		}
	}
	return first
}

// delayedKey is partition p's delayed set; it shares the stream's hash tag.
// delayArgs groups msgs by partition for delay_add.lua, one call per
// partition, partitions in order of first use.
func delayArgs(partitions int, ms int64, msgs []queue.Message) (order []int, args map[int][]any) {
	args = make(map[int][]any)
	for _, m := range msgs {
		p := queue.PartitionOf(m.Key, partitions)
		if _, ok := args[p]; !ok {
			order = append(order, p)
			args[p] = []any{ms}
		}
		args[p] = append(args[p], m.ID, m.Key, m.Body)
	}
	return order, args
}

// delayToNode is PublishDelayed's share of b's node with ReplicaAck: its
// partitions' delay_add.lua calls and a WAIT pipelined on one connection.
func (q *Queue) delayToNode(ctx context.Context, topic string, ms int64, b nodeBatch) nodeOutcome {
	order, args := delayArgs(q.opts.Partitions, ms, b.msgs)
	c := b.node.Conn()
	defer c.Close()
	adds := make([]*redis.Cmd, len(order))
	var wait *redis.IntCmd
	start := time.Now()
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, part := range order {
			// EVAL, not EVALSHA: a pipeline cannot load a missing script.
			adds[i] = q.delays.add.Eval(ctx, p, []string{delayedKey(topic, part), delaySeqKey(topic, part)}, args[part]...)
		}
		wait = pipelineWait(ctx, p, q.opts.ReplicaAck)
		return nil
	})
	var out nodeOutcome
	for i, add := range adds {
		var rerr redis.Error
		if errors.As(add.Err(), &rerr) {
			out.refused += (len(args[order[i]]) - 1) / 3
		}
	}
	if err != nil {
		out.err = err
		return out
	}
	return q.replicated(out, wait, start, len(b.msgs))
}

func delayedKey(topic string, p int) string {
	return streamKey(topic, p) + ":delayed"
}

// delaySeqKey is the counter that orders partition p's delayed messages. It
// never expires: members must stay unique.
func delaySeqKey(topic string, p int) string {
	return streamKey(topic, p) + ":delayseq"
}
