// Package gate is the open/closed lifecycle the queue drivers share: Close
// refuses new work, stops the Consume calls that are running as if their
// contexts were cancelled, and waits until they have finished their batches.
package gate

import (
	"context"
	"sync"
)

// Gate tracks whether a driver is closed and which Consume calls still run.
// The zero value is not usable; call New.
type Gate struct {
	closing context.Context // cancelled by Close
	close   context.CancelFunc

	mu     sync.Mutex
	closed bool
	active sync.WaitGroup
}

// New returns an open Gate.
func New() *Gate {
	ctx, cancel := context.WithCancel(context.Background())
	return &Gate{closing: ctx, close: cancel}
}

// Closed reports whether Close has been called.
func (g *Gate) Closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Enter registers a running Consume call. It returns a context derived from
// ctx that is also cancelled by Close, and done, which the call must run when
// it returns. ok is false after Close; then nothing is registered.
func (g *Gate) Enter(ctx context.Context) (run context.Context, done func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, nil, false
	}
	// Counting under the lock that Close takes keeps Add from racing Wait.
	g.active.Add(1)
	run, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(g.closing, cancel)
	return run, func() {
		stop()
		cancel()
		g.active.Done()
	}, true
}

// Close closes the gate and waits until every entered call is done. It
// reports whether this was the first call. It must not be called from within
// an entered call.
func (g *Gate) Close() (first bool) {
	g.mu.Lock()
	first = !g.closed
	g.closed = true
	g.mu.Unlock()
	g.close()
	g.active.Wait()
	return first
}
