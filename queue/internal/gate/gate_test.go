package gate

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestCloseStopsAndWaits(t *testing.T) {
	g := New()
	var finished atomic.Int32
	started := make(chan struct{})
	for range 3 {
		run, done, ok := g.Enter(context.Background())
		if !ok {
			t.Fatal("Enter on an open gate: got ok=false, want true")
		}
		go func() {
			defer done()
			started <- struct{}{}
			<-run.Done()
			time.Sleep(20 * time.Millisecond) // the batch in flight finishes
			finished.Add(1)
		}()
	}
	for range 3 {
		<-started
	}
	if g.Closed() {
		t.Fatal("Closed before Close: got true, want false")
	}
	if first := g.Close(); !first {
		t.Fatal("first Close: got false, want true")
	}
	if got := finished.Load(); got != 3 {
		t.Fatalf("Close returned with %d of 3 calls finished, want all", got)
	}
	if _, _, ok := g.Enter(context.Background()); ok {
		t.Fatal("Enter after Close: got ok=true, want false")
	}
	if first := g.Close(); first || !g.Closed() {
		t.Fatalf("second Close: got first=%v closed=%v, want false true", first, g.Closed())
	}
}

func TestEnteredContextFollowsParent(t *testing.T) {
	g := New()
	parent, cancel := context.WithCancel(context.Background())
	run, done, _ := g.Enter(parent)
	cancel()
	select {
	case <-run.Done():
	case <-time.After(time.Second):
		t.Fatal("parent cancelled: entered context still open")
	}
	done()
	g.Close() // returns at once: nothing is running
}
