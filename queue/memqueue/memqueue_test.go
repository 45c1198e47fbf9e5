package memqueue

import (
	"testing"
	"time"

	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/queuetest"
)

// backend adapts a Queue to the contract suite. It lives in the internal test
// package so it can crash consumers through the unexported hook.
type backend struct{ q *Queue }

var _ queuetest.Crasher = backend{}

func (b backend) Publisher() queue.Publisher { return b.q }

func (b backend) NewConsumer(_ *testing.T, name string) queue.Consumer { return b.q.Consumer(name) }

func (b backend) Close() error { return b.q.Close() }

func (b backend) NewCrashableConsumer(_ *testing.T, name string) (queue.Consumer, func()) {
	c := b.q.Consumer(name)
	return c, c.crash
}

func TestContract(t *testing.T) {
	const batchSize = 16
	queuetest.Run(t, queuetest.Factory{
		Features:  Features(),
		BatchSize: batchSize,
		New: func(t *testing.T) queuetest.Backend {
			q := New(Options{Partitions: 4, BatchSize: batchSize, RedeliveryDelay: 10 * time.Millisecond})
			t.Cleanup(func() { _ = q.Close() })
			return backend{q: q}
		},
	})
}
