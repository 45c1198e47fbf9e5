package notifier

import (
	"context"
	"runtime/debug"
	"time"
)

// The Go runtime returns freed heap to the system slowly and only while the
// heap grows again, so a notifier that held a herd of sockets keeps its peak
// RSS while the crowd waits idle and after it leaves (docs/BENCHMARKS.md,
// "an idle WebSocket"). Once the number of open sockets has moved by a
// tenth since the last release and then held still for a check interval,
// the heap is collected and its free pages are given back: one collection
// per crowd that arrives or leaves, nothing while it waits.
const (
	memoryCheckInterval = 5 * time.Second
	// releaseMinChange keeps a small notifier's churn from collecting.
	releaseMinChange = 1000
)

// releaseDue reports whether to give memory back: open sockets moved by a
// tenth (at least releaseMinChange) since the release at released, and by
// less than a hundredth since the last check.
func releaseDue(released, last, open int) bool {
	moved := abs(open - released)
	return moved >= max(releaseMinChange, released/10) && abs(open-last) <= max(last/100, 10)
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// memoryLoop gives memory back after crowds, until ctx ends.
func (n *Notifier) memoryLoop(ctx context.Context) {
	released, last := 0, 0
	every(ctx, memoryCheckInterval, func() {
		n.mu.Lock()
		open := n.open
		n.mu.Unlock()
		if releaseDue(released, last, open) {
			debug.FreeOSMemory()
			released = open
		}
		last = open
	})
}
