package redisstream

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
)

// BenchmarkConsume measures the driver alone on the test Redis: one
// partition, batches of 512 handed to a handler that does nothing. An
// iteration is 40 batches published up front (outside the timer) and
// consumed to the last handler call.
func BenchmarkConsume(b *testing.B) {
	const size, batches = 512, 40
	rdb := testenv.Redis(b)
	q := New(rdb, Options{Partitions: 1, BatchSize: size, Block: 50 * time.Millisecond})
	topic := testenv.Topic(b)
	b.Cleanup(func() {
		_ = q.Close()
		(&topicLog{topics: map[string]bool{topic: true}}).deleteKeys(b, rdb, 1)
	})
	body := make([]byte, 160) // about a purchase request's size
	for i := range body {
		body[i] = 'x'
	}

	// The handler waits at gate, replaced per iteration, so nothing is
	// consumed while the timer is stopped.
	var gate atomic.Pointer[chan struct{}]
	var seen, target atomic.Int64
	allDone := make(chan struct{}, 1)
	h := func(_ context.Context, msgs []queue.Message) error {
		<-*gate.Load()
		if seen.Add(int64(len(msgs))) == target.Load() {
			allDone <- struct{}{}
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	closed := make(chan struct{})
	gate.Store(&closed)
	go func() { stopped <- q.Consumer("bench").Consume(ctx, topic, h) }()

	n := 0
	for b.Loop() {
		b.StopTimer()
		g := make(chan struct{})
		gate.Store(&g)
		msgs := make([]queue.Message, size*batches)
		for i := range msgs {
			msgs[i] = queue.Message{ID: fmt.Sprintf("r%09d", n+i), Key: "campaign", Body: body}
		}
		n += len(msgs)
		target.Store(int64(n))
		if err := q.Publish(b.Context(), topic, msgs...); err != nil {
			b.Fatalf("publish: %v", err)
		}
		b.StartTimer()
		close(g)
		select {
		case <-allDone:
		case <-time.After(time.Minute):
			b.Fatalf("consumed %d of %d messages in a minute", seen.Load(), n)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
	cancel()
	if err := <-stopped; err != nil {
		b.Errorf("consume: %v", err)
	}
}

// BenchmarkMove measures one call of the move script on the test Redis, as
// each consumer runs it per partition every Options.MoveInterval: with
// nothing due (the usual case), and with moveLimit messages due, which it
// moves into the stream (added before each iteration, outside the timer).
func BenchmarkMove(b *testing.B) {
	rdb := testenv.Redis(b)
	body := make([]byte, 160)
	for _, due := range []int{0, moveLimit} {
		b.Run(fmt.Sprintf("due=%d", due), func(b *testing.B) {
			q := New(rdb, Options{Partitions: 1})
			topic := testenv.Topic(b)
			b.Cleanup(func() { (&topicLog{topics: map[string]bool{topic: true}}).deleteKeys(b, rdb, 1) })
			msgs := make([]queue.Message, due)
			n := 0
			for b.Loop() {
				if due > 0 {
					b.StopTimer()
					for i := range msgs {
						msgs[i] = queue.Message{ID: fmt.Sprintf("r%09d", n), Key: "campaign", Body: body}
						n++
					}
					if err := q.PublishDelayed(b.Context(), topic, time.Millisecond, msgs...); err != nil {
						b.Fatalf("publish: %v", err)
					}
					time.Sleep(2 * time.Millisecond) // let them fall due
					b.StartTimer()
				}
				moved, err := moveDue(b.Context(), rdb, q.delays, topic, 0, moveLimit)
				if err != nil || moved != due {
					b.Fatalf("move: got %d, %v, want %d, nil", moved, err, due)
				}
			}
		})
	}
}
