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
