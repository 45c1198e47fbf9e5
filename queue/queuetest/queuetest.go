// Package queuetest is the contract suite that every queue driver passes.
// A driver's tests call Run with a Factory that builds fresh, isolated
// backends; the suite publishes and consumes through the queue interfaces
// only, so what it checks is exactly what the gateway and the workers may rely
// on: at-least-once delivery, acknowledgement, redelivery with a growing
// Attempt after a failure and the same Attempt after a hold (the policy of
// queue.Classify, for both steps of a PipelineHandler), per-key order (when Features.PerKeyOrder), takeover of a dead
// consumer's messages, batch limits, clean shutdown, delayed delivery (when
// Features.Delay: never early, each message once, across a consumer's
// restart) and the two-step PipelineHandler (overlapping when
// Features.Pipeline, in one call otherwise).
package queuetest

import (
	"testing"

	"github.com/flashsale/flashsale/queue"
)

// Backend is one fresh, isolated instance of a driver under test. Every
// publisher and consumer it returns talks to the same storage.
type Backend interface {
	// Publisher returns the backend's publisher. If it also implements
	// queue.Pinger, Ping must succeed. With Features.Delay it must implement
	// queue.DelayPublisher.
	Publisher() queue.Publisher
	// NewConsumer returns a new consumer of the backend, as a separate worker
	// process would have. name labels it in logs.
	NewConsumer(t *testing.T, name string) queue.Consumer
	// Close closes the publisher: Publish and Consume must then fail with an
	// error wrapping queue.ErrClosed.
	Close() error
}

// Crasher is implemented by backends that can make a consumer die the way a
// killed process does. Without it the dead-consumer test is skipped.
type Crasher interface {
	// NewCrashableConsumer returns a consumer like NewConsumer and a function
	// that crashes it: from then on the consumer acknowledges nothing and
	// stops holding its partitions, while a handler call it has in flight may
	// still be running. Its Consume must still return once its context is
	// cancelled and its handlers have returned (with any error).
	NewCrashableConsumer(t *testing.T, name string) (c queue.Consumer, crash func())
}

// Factory tells Run how to build backends of one driver and what to expect.
type Factory struct {
	// Features are the driver's real differences; tests of a feature the
	// driver lacks are skipped.
	Features queue.Features
	// BatchSize is the largest batch the consumers from New hand to a
	// handler. It must be at least 1; small values (say 8–32) exercise
	// batching best.
	BatchSize int
	// New returns a fresh backend for one test. It is called once per
	// subtest, possibly in parallel, and should register its own cleanup.
	New func(t *testing.T) Backend
}

// Run runs the contract suite against the driver f builds. Subtests run in
// parallel, each on its own backend and topic.
func Run(t *testing.T, f Factory) {
	t.Helper()
	if f.New == nil || f.BatchSize < 1 {
		t.Fatalf("queuetest.Run: Factory needs New and a BatchSize >= 1, got New set %v, BatchSize %d", f.New != nil, f.BatchSize)
	}
	tests := []struct {
		name string
		run  func(t *testing.T, f Factory)
	}{
		{"DeliversEverything", testDeliversEverything},
		{"AckedNotRedelivered", testAckedNotRedelivered},
		{"RedeliversOnError", testRedeliversOnError},
		{"HeldIsNotAFailure", testHeldIsNotAFailure},
		{"AttemptsCountFailuresNotHolds", testAttemptsCountFailuresNotHolds},
		{"HoldOutlivesConsumer", testHoldOutlivesConsumer},
		{"PerKeyOrder", testPerKeyOrder},
		{"DeadConsumerRedelivered", testDeadConsumerRedelivered},
		{"BatchSizeRespected", testBatchSizeRespected},
		{"ShutdownFinishesInFlightBatch", testShutdownFinishesInFlightBatch},
		{"PublishFails", testPublishFails},
		{"PublishNothing", testPublishNothing},
		{"ConsumeAfterClose", testConsumeAfterClose},
		{"Ping", testPing},
		{"Delay", testDelay},
		{"DelayMany", testDelayMany},
		{"DelayRestart", testDelayRestart},
		{"PipelineOrder", testPipelineOrder},
		{"PipelineOverlaps", testPipelineOverlaps},
		{"PipelineShutdown", testPipelineShutdown},
		{"PipelineDeadConsumer", testPipelineDeadConsumer},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, f)
		})
	}
}
