package notifier

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

func TestHubDue(t *testing.T) {
	t.Parallel()
	h := newHub()
	c := newConn(nil, "alice", 1)
	added, _, _ := h.add(c, []string{"old", "new", "fresh", "pending"}, 10)
	base := time.Now()
	queued := model.Result{Status: model.StatusQueued}
	h.activate(added[0], queued, base.Add(-3*time.Second))
	h.activate(added[1], queued, base.Add(-2*time.Second))
	h.activate(added[2], queued, base)
	// added[3] stays pending: its own stored read is under way.

	tests := []struct {
		name   string
		cutoff time.Time
		limit  int
		want   []string
	}{
		{name: "oldest first", cutoff: base.Add(-time.Second), limit: 10, want: []string{"old", "new"}},
		{name: "bounded", cutoff: base.Add(-time.Second), limit: 1, want: []string{"old"}},
		{name: "everything due", cutoff: base, limit: 10, want: []string{"old", "new", "fresh"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := h.due(tt.cutoff, tt.limit); !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}

	t.Run("touch postpones", func(t *testing.T) {
		h.touch([]string{"old"}, base)
		want := []string{"new"}
		if got := h.due(base.Add(-time.Second), 10); !slices.Equal(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
}

func TestHubPublishOnce(t *testing.T) {
	t.Parallel()
	final := model.Result{RequestID: "r", UserID: "alice", Status: model.StatusSuccess}
	queued := model.Result{RequestID: "r", UserID: "alice", Status: model.StatusQueued}
	tests := []struct {
		name        string
		publishWhen string // "pending" or "active"
		stored      model.Result
		wantOnRead  bool // activate returns the result
		wantPublish int  // subscriptions publish hands over
	}{
		{name: "final on read, published while pending", publishWhen: "pending", stored: final, wantOnRead: true},
		{name: "queued on read, published while pending", publishWhen: "pending", stored: queued, wantOnRead: true},
		{name: "queued on read, published when active", publishWhen: "active", stored: queued, wantPublish: 1},
		{name: "final on read, published after", publishWhen: "active", stored: final, wantOnRead: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHub()
			c := newConn(nil, "alice", 1)
			added, _, _ := h.add(c, []string{"r"}, 10)
			published := 0
			if tt.publishWhen == "pending" {
				published += len(h.publish(final))
			}
			_, onRead := h.activate(added[0], tt.stored, time.Now())
			if tt.publishWhen == "active" {
				published += len(h.publish(final))
			}
			published += len(h.publish(final)) // a repeated publication
			if onRead != tt.wantOnRead || published != tt.wantPublish {
				t.Errorf("got delivered on read %v and %d by publish, want %v and %d", onRead, published, tt.wantOnRead, tt.wantPublish)
			}
			if h.size() != 0 || len(c.subs) != 0 {
				t.Errorf("got %d ids in the hub and %d on the connection, want 0 and 0", h.size(), len(c.subs))
			}
		})
	}
}

func TestHubPublishUser(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		user string // user id the published result names
		want int
	}{
		{name: "subscriber's own result", user: "alice", want: 1},
		{name: "result without a user", user: "", want: 1},
		{name: "result naming another user", user: "mallory", want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHub()
			added, _, _ := h.add(newConn(nil, "alice", 1), []string{"r"}, 10)
			h.activate(added[0], model.Result{Status: model.StatusQueued}, time.Now())
			got := h.publish(model.Result{RequestID: "r", UserID: tt.user, Status: model.StatusSuccess})
			if len(got) != tt.want {
				t.Errorf("got %d subscriptions handed the result, want %d", len(got), tt.want)
			}
		})
	}
}

// TestHubDueWalksWhatIsDue: due looks at the entries it returns and at most
// one more, however many subscriptions wait.
func TestHubDueWalksWhatIsDue(t *testing.T) {
	t.Parallel()
	const waiting = 10_000
	h := newHub()
	c := newConn(nil, "alice", 1)
	ids := make([]string, waiting)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%d", i)
	}
	added, _, _ := h.add(c, ids, waiting)
	base := time.Now()
	queued := model.Result{Status: model.StatusQueued}
	for i, s := range added {
		h.activate(s, queued, base.Add(time.Duration(i)*time.Millisecond))
	}
	tests := []struct {
		name       string
		cutoff     time.Time
		limit      int
		wantDue    int
		wantVisits int
	}{
		{name: "none due", cutoff: base.Add(-time.Second), limit: 256, wantDue: 0, wantVisits: 1},
		{name: "three due", cutoff: base.Add(2 * time.Millisecond), limit: 256, wantDue: 3, wantVisits: 4},
		{name: "more due than the limit", cutoff: base.Add(time.Hour), limit: 256, wantDue: 256, wantVisits: 256},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.dueVisits
			got := h.due(tt.cutoff, tt.limit)
			if !slices.Equal(got, ids[:tt.wantDue]) {
				t.Errorf("got %d due ids starting %v, want the %d oldest", len(got), got[:min(len(got), 3)], tt.wantDue)
			}
			if visits := h.dueVisits - before; visits != tt.wantVisits {
				t.Errorf("got %d entries visited, want %d", visits, tt.wantVisits)
			}
		})
	}
}

// TestHubCheckOrder runs random subscription events and checks after each
// that due returns exactly the ids with an active subscription checked at or
// before a cutoff, least recently checked first, as a naive model says.
func TestHubCheckOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	h := newHub()
	conns := []*conn{newConn(nil, "alice", 1), newConn(nil, "alice", 1), newConn(nil, "bob", 1)}
	ids := []string{"r0", "r1", "r2", "r3", "r4", "r5"}
	var subs []*subscription // every subscription made, done ones too
	base := time.Now()
	clock := 0 // seconds after base; events may carry an older time
	queued := model.Result{Status: model.StatusQueued}

	// checked is the model: the last check time of each id with an active
	// subscription, never earlier than another id's.
	checked := map[string]int{}
	check := func(id string, at int) {
		delete(checked, id)
		for _, other := range checked {
			at = max(at, other)
		}
		checked[id] = at
	}
	activeIDs := func() map[string]bool {
		out := map[string]bool{}
		for _, s := range subs {
			if s.state == subActive {
				out[s.requestID] = true
			}
		}
		return out
	}
	for step := range 5000 {
		clock++
		at := clock - rng.IntN(3) // a clock read a little late
		var event string
		switch op := rng.IntN(6); op {
		case 0:
			c := conns[rng.IntN(len(conns))]
			added, _, _ := h.add(c, []string{ids[rng.IntN(len(ids))]}, 3)
			subs = append(subs, added...)
			event = "add"
		case 1:
			if s := pick(rng, subs, subPending); s != nil {
				// A result published while s was pending is handed over
				// instead.
				if _, handed := h.activate(s, queued, base.Add(time.Duration(at)*time.Second)); !handed {
					check(s.requestID, at)
				}
				event = "activate"
			}
		case 2:
			if s := pick(rng, subs, subPending); s != nil {
				h.cancel(s)
				event = "cancel"
			}
		case 3:
			id := ids[rng.IntN(len(ids))]
			h.publish(model.Result{RequestID: id, Status: model.StatusSuccess})
			event = "publish " + id
		case 4:
			id := ids[rng.IntN(len(ids))]
			if activeIDs()[id] {
				check(id, at)
			}
			h.touch([]string{id}, base.Add(time.Duration(at)*time.Second))
			event = "touch " + id
		case 5:
			if rng.IntN(4) == 0 {
				c := conns[rng.IntN(len(conns))]
				h.removeConn(c)
				event = "close"
			}
		}
		active := activeIDs()
		for id := range checked {
			if !active[id] {
				delete(checked, id)
			}
		}
		cutoff := clock - rng.IntN(4)
		var want []string
		for id, at := range checked {
			if at <= cutoff {
				want = append(want, id)
			}
		}
		got := h.due(base.Add(time.Duration(cutoff)*time.Second), len(ids))
		// Equal check times keep the order they were reached in, which
		// the model does not track: compare the times, then the sets.
		slices.SortStableFunc(want, func(a, b string) int { return checked[a] - checked[b] })
		var gotTimes, wantTimes []int
		for _, id := range got {
			gotTimes = append(gotTimes, checked[id])
		}
		for _, id := range want {
			wantTimes = append(wantTimes, checked[id])
		}
		if !slices.Equal(gotTimes, wantTimes) || !sameSet(got, want) {
			t.Fatalf("step %d (%s): got due %v, want %v (check times %v)", step, event, got, want, checked)
		}
	}
}

// pick returns a random subscription in state, or nil.
func pick(rng *rand.Rand, subs []*subscription, state subState) *subscription {
	var in []*subscription
	for _, s := range subs {
		if s.state == state {
			in = append(in, s)
		}
	}
	if len(in) == 0 {
		return nil
	}
	return in[rng.IntN(len(in))]
}

func sameSet(a, b []string) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(s string) bool { return !slices.Contains(b, s) })
}
