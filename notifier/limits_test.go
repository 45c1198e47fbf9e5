package notifier

import (
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

func TestBuckets(t *testing.T) {
	t.Parallel()
	start := time.Unix(1_000_000, 0)
	b := newBuckets(2, 4) // 2 tokens a second, up to 4
	steps := []struct {
		name     string
		user     string
		at       time.Duration // after start
		take     int
		wantGot  int
		wantWait time.Duration
	}{
		{name: "a new user starts full", user: "alice", take: 3, wantGot: 3},
		{name: "partial: only whole tokens", user: "alice", take: 3, wantGot: 1, wantWait: 500 * time.Millisecond},
		{name: "empty", user: "alice", take: 1, wantGot: 0, wantWait: 500 * time.Millisecond},
		{name: "another user has its own", user: "bob", take: 4, wantGot: 4, wantWait: 500 * time.Millisecond},
		{name: "refilled at rate", user: "alice", at: 1500 * time.Millisecond, take: 4, wantGot: 3, wantWait: 500 * time.Millisecond},
		{name: "refill stops at burst", user: "alice", at: time.Hour, take: 10, wantGot: 4, wantWait: 500 * time.Millisecond},
		{name: "half a token waits for the rest", user: "alice", at: time.Hour + 250*time.Millisecond, take: 1, wantGot: 0, wantWait: 250 * time.Millisecond},
	}
	for _, st := range steps {
		got, wait := b.take(st.user, st.take, start.Add(st.at))
		if got != st.wantGot || wait != st.wantWait {
			t.Errorf("%s: got %d tokens, wait %v; want %d, %v", st.name, got, wait, st.wantGot, st.wantWait)
		}
	}
	// Buckets that filled up again are forgotten: bob's, untouched for
	// hours; alice's, emptied a second ago, is not full yet (2 s).
	b.take("alice", 4, start.Add(2*time.Hour-time.Second))
	b.take("carol", 1, start.Add(2*time.Hour))
	b.mu.Lock()
	_, alice := b.byUser["alice"]
	_, bob := b.byUser["bob"]
	users := len(b.byUser)
	b.mu.Unlock()
	if !alice || bob || users != 2 {
		t.Errorf("got %d buckets (alice's kept: %v, bob's kept: %v), want alice's and carol's", users, alice, bob)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		wait time.Duration
		want int
	}{
		{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1001 * time.Millisecond, 2}, {30 * time.Second, 30},
	}
	for _, tt := range tests {
		if got := retryAfterSeconds(tt.wait); got != tt.want {
			t.Errorf("retryAfterSeconds(%v): got %d, want %d", tt.wait, got, tt.want)
		}
	}
}

func TestFinalCache(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	c := newFinalCache(3, time.Second)
	result := func(id string) model.Result {
		return model.Result{RequestID: id, UserID: "alice", Status: model.StatusSuccess}
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		c.put(result(id), now)
	}
	if got := c.count(); got != 3 {
		t.Errorf("got %d cached, want the size, 3", got)
	}
	if _, ok := c.get("a", now); ok {
		t.Error("got the oldest entry after a fourth put, want it evicted")
	}
	if r, ok := c.get("d", now.Add(999*time.Millisecond)); !ok || r != result("d") {
		t.Errorf("got %+v, %v within the ttl, want d's result", r, ok)
	}
	if _, ok := c.get("d", now.Add(time.Second)); ok {
		t.Error("got an entry at its ttl, want it expired")
	}
	c.put(result("d"), now.Add(time.Second)) // refreshed in place
	if _, ok := c.get("d", now.Add(1500*time.Millisecond)); !ok || c.count() != 3 {
		t.Errorf("got ok %v and %d cached after a refresh, want d and 3", ok, c.count())
	}
}
