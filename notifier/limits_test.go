package notifier

import (
	"net/http"
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

// TestBudgetsPerAddress: the users behind one address share the poll and
// subscribe budgets of MaxConnsPerIP / MaxConnsPerUser users (here 2):
// two users spend theirs, a third from the same address is refused before
// any Redis read, however many accounts it brings.
func TestBudgetsPerAddress(t *testing.T) {
	t.Parallel()
	const burst = 4
	e := redisEnv(t)
	clock := newStoppedClock()
	h := newHarness(t, e.src, Options{PollRate: 1, PollBurst: burst, SubscribeRate: 1, SubscribeBurst: burst,
		MaxConnsPerIP: 16, MaxConnsPerUser: 8, now: clock.now})

	t.Run("polls", func(t *testing.T) {
		for _, user := range []string{"alice", "bob", "carol"} {
			id := e.newRequest(t, user)
			answered, limited := 0, 0
			for range burst {
				switch status, body := mustGet(t, h, user, "/api/v1/purchases/"+id); {
				case status == http.StatusOK:
					answered++
				case status == http.StatusTooManyRequests && body["code"] == "rate_limited":
					limited++
				default:
					t.Fatalf("%s: got %d %v, want 200 or 429", user, status, body)
				}
			}
			want := burst
			if user == "carol" { // the address's two users' worth is spent
				want = 0
			}
			if answered != want || limited != burst-want {
				t.Errorf("%s: got %d answered, %d refused; want %d and %d", user, answered, limited, want, burst-want)
			}
		}
	})
	t.Run("subscribes", func(t *testing.T) {
		for _, user := range []string{"dave", "erin", "frank"} {
			ws := mustDial(t, h, user)
			ids := make([]string, burst)
			for i := range ids {
				ids[i] = e.newRequest(t, user)
			}
			before := e.reads()
			subscribed, errs := mustSubscribe(t, ws, ids...)
			want := burst
			if user == "frank" {
				want = 0
			}
			if len(subscribed) != want || len(errs) != burst-want || e.reads()-before != int64(want) {
				t.Errorf("%s: got %d subscribed, errors %+v, %d reads; want %d subscribed, %d rate_limited, %d reads",
					user, len(subscribed), errs, e.reads()-before, want, burst-want, want)
			}
			for _, f := range errs {
				if f.Code != "rate_limited" {
					t.Errorf("%s: got error %+v, want rate_limited", user, f)
				}
			}
		}
	})
}
