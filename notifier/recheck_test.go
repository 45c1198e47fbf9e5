package notifier

import (
	"slices"
	"testing"
	"time"
)

// TestRecheckOneRead: a re-check reads the stored results of every due
// request id in one round trip, hands over the final ones, and puts the ids
// it read behind the others. The loop's own ticks are an hour apart: the
// test calls recheck itself.
func TestRecheckOneRead(t *testing.T) {
	t.Parallel()
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			t.Parallel()
			e := impl.make(t)
			h := newHarness(t, e.src, Options{RecheckInterval: time.Hour})
			const n = 20
			ids := make([]string, n)
			for i := range ids {
				ids[i] = e.newRequest(t, "alice")
			}
			ws := mustDial(t, h, "alice")
			if subscribed, _ := mustSubscribe(t, ws, ids...); !slices.Equal(subscribed, ids) {
				t.Fatalf("got subscribed %v, want %v", subscribed, ids)
			}
			// Half the requests end, their publications lost.
			want := map[string]bool{}
			for _, id := range ids[:n/2] {
				e.decide(t, id, "alice")
				want[id] = true
			}

			start := time.Now()
			before := e.trips()
			h.n.recheck(mustContext(t), start)
			if got := e.trips() - before; got != 1 {
				t.Errorf("got %d stored-result round trips for %d due ids, want 1", got, n)
			}
			for range n / 2 {
				r := mustReadResult(t, ws)
				if !want[r.RequestID] {
					t.Errorf("got result of %s, want one of the ended requests, each once", r.RequestID)
				}
				delete(want, r.RequestID)
			}

			// The ids still waiting were read after start: none is due at
			// start any more.
			before = e.trips()
			h.n.recheck(mustContext(t), start)
			if got := e.trips() - before; got != 0 {
				t.Errorf("got %d stored-result round trips with nothing due, want 0", got)
			}
			if got := h.n.hub.due(time.Now(), n); !slices.Equal(got, ids[n/2:]) {
				t.Errorf("got due %v, want the waiting ids %v", got, ids[n/2:])
			}
		})
	}
}

// TestRecheckVanished: a request whose stored result vanished (its campaign
// was reloaded) will never end; the re-check tells its subscribers with
// not_found and drops them.
func TestRecheckVanished(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{RecheckInterval: time.Hour})
	gone, kept := e.newRequest(t, "alice"), e.newRequest(t, "alice")
	ws := mustDial(t, h, "alice")
	if subscribed, _ := mustSubscribe(t, ws, gone, kept); !slices.Equal(subscribed, []string{gone, kept}) {
		t.Fatalf("got subscribed %v, want [%s %s]", subscribed, gone, kept)
	}
	f.forget(gone)
	h.n.recheck(mustContext(t), time.Now())
	if got := frameSummary(t, mustRead(t, ws)); got != "error not_found "+gone {
		t.Errorf("got frame %q, want not_found for %s", got, gone)
	}
	if got := h.n.hub.due(time.Now(), 10); !slices.Equal(got, []string{kept}) {
		t.Errorf("got due %v, want [%s]", got, kept)
	}
}
