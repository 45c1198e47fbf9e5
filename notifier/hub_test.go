package notifier

import (
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
		h.touch("old", base)
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
