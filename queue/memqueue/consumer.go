package memqueue

import (
	"context"
	"fmt"
	"sync"

	"github.com/flashsale/flashsale/queue"
)

// Consumer hands a topic's batches to a handler. Create it with
// Queue.Consumer; one Consumer may run several Consume calls.
type Consumer struct {
	q    *Queue
	name string

	crashOnce sync.Once
	crashed   chan struct{}
}

// Consume hands batches of topic to h until ctx is cancelled or the Queue is
// closed, then waits for the handler calls in flight and returns nil. It runs
// one goroutine per partition, so h is called concurrently for different
// partitions (never for one partition, hence never for one key). Handler
// contexts are not cancelled with ctx: a batch that has started finishes and
// is acknowledged or redelivered according to its result.
func (c *Consumer) Consume(ctx context.Context, topicName string, h queue.Handler) error {
	return c.ConsumePipelined(ctx, topicName, queue.OneStep(h))
}

// ConsumePipelined is Consume for a PipelineHandler: a batch's Finish runs
// on a goroutine of its own while the taker goes on with the partition's next
// batch.
func (c *Consumer) ConsumePipelined(ctx context.Context, topicName string, h queue.PipelineHandler) error {
	tp, err := c.q.topic(topicName, true)
	if err != nil {
		return fmt.Errorf("consume %s: %w", topicName, err)
	}
	defer c.q.active.Done()

	hctx := context.WithoutCancel(ctx)
	log := c.q.opts.Logger.With("topic", topicName, "consumer", c.name)
	var wg sync.WaitGroup
	// finishes runs b's Finish and then those of the batches queued behind
	// it, until one has to wait or fails.
	finishes := func(b *batch) {
		for b != nil {
			b = tp.finished(b, b.finish(hctx), log)
		}
	}
	for range c.q.opts.Partitions {
		wg.Go(func() {
			for {
				b := tp.take(ctx, c)
				if b == nil {
					return
				}
				finish, err := h(hctx, b.msgs)
				if next := tp.decided(b, finish, err, log); next != nil {
					wg.Go(func() { finishes(next) })
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// crash makes c behave like a consumer whose process was killed: it stops
// taking batches and its batches in flight go back to their partitions at
// once, while its handler calls may still be running (their results are
// ignored). Tests use it to check that other consumers take over.
func (c *Consumer) crash() {
	c.crashOnce.Do(func() { close(c.crashed) })
	c.q.mu.Lock()
	topics := make([]*topic, 0, len(c.q.topics))
	for _, tp := range c.q.topics {
		topics = append(topics, tp)
	}
	c.q.mu.Unlock()
	for _, tp := range topics {
		tp.abandon(c)
	}
}

func (c *Consumer) isCrashed() bool {
	select {
	case <-c.crashed:
		return true
	default:
		return false
	}
}
