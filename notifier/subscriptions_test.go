package notifier

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/model"
)

// TestHubCountsSubscriptions: the gauge follows every way a subscription
// comes and goes: added, refused, answered by its stored result, by a
// publication, dropped with its connection.
func TestHubCountsSubscriptions(t *testing.T) {
	t.Parallel()
	h := newHub()
	h.subscriptions = prometheus.NewGauge(prometheus.GaugeOpts{Name: "subs"})
	alice, bob := newConn(nil, "alice", 1), newConn(nil, "bob", 1)
	queued := model.Result{Status: model.StatusQueued}
	final := model.Result{UserID: "alice", Status: model.StatusSuccess}

	a, _, over := h.add(alice, []string{"r1", "r2", "r3", "r4", "r5"}, 4)
	b, _, _ := h.add(bob, []string{"r6", "r7"}, 4)
	steps := []struct {
		name string
		do   func()
		want float64
	}{
		{"added, one over the cap", func() {}, 6},
		{"refused", func() { h.cancel(a[0]) }, 5},
		{"final when read", func() { h.activate(a[1], final, time.Now()) }, 4},
		{"active, then published", func() {
			h.activate(a[2], queued, time.Now())
			final := final
			final.RequestID = "r3"
			h.publish(final)
		}, 3},
		{"the same subscription refused again", func() { h.cancel(a[0]) }, 3},
		{"connection closed", func() { h.removeConn(bob) }, 1},
		{"last one dropped", func() { h.activate(a[3], queued, time.Now()); h.dropActive("r4") }, 0},
	}
	if len(over) != 1 || len(b) != 2 {
		t.Fatalf("got %d over the cap and %d of bob's, want 1 and 2", len(over), len(b))
	}
	for _, s := range steps {
		s.do()
		if got := gaugeValue(h.subscriptions); got != s.want {
			t.Errorf("%s: got %v subscriptions, want %v", s.name, got, s.want)
		}
	}
}
