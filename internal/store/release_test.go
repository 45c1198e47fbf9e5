package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// campaignState reads every key release.lua may touch, for "changes
// nothing" comparisons.
func campaignState(t *testing.T, s *Store, campaignID string) map[string]string {
	t.Helper()
	ctx := t.Context()
	k := campaignKeys(campaignID)
	out := map[string]string{}
	for _, key := range []string{k.stock, k.soldout} {
		v, err := s.rdb.Get(ctx, key).Result()
		if err == nil {
			out[key] = v
		}
	}
	for _, key := range []string{k.users, k.counters, k.meta, k.released} {
		h, err := s.rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatalf("HGETALL %s: %v", key, err)
		}
		for f, v := range h {
			out[key+"#"+f] = v
		}
	}
	return out
}

// sell deducts one order of units for user and returns its order id.
func sell(t *testing.T, s *Store, campaignID, user string, units int64) string {
	t.Helper()
	oid := testenv.Name(t, "o")
	r := mustDeduct(t, s, campaignID, []model.Deduction{{RequestID: newRequestID(campaignID), UserID: user, Quantity: units, OrderID: oid}})
	if r.Results[0].Status != model.StatusSuccess {
		t.Fatalf("sell %d to %s: got %s, want success", units, user, r.Results[0].Status)
	}
	return oid
}

func mustRelease(t *testing.T, s *Store, campaignID, orderID, userID string, units int64) bool {
	t.Helper()
	ok, err := s.Release(t.Context(), campaignID, orderID, userID, units)
	if err != nil {
		t.Fatalf("Release(%s, %s, %d): %v", orderID, userID, units, err)
	}
	return ok
}

// TestRelease: one case per reply of release.lua, and a second call of
// each changes nothing.
func TestRelease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		t.Run("released", func(t *testing.T) {
			c := newCampaign(t, 3, 3)
			mustLoad(t, s, c)
			o1 := sell(t, s, c.ID, "alice", 2)
			sell(t, s, c.ID, "alice", 1)
			if !mustSoldOut(t, s, c.ID) {
				t.Fatalf("got not sold out, want sold out before the release")
			}
			if !mustRelease(t, s, c.ID, o1, "alice", 2) {
				t.Fatalf("got released false, want true")
			}
			st := mustStats(t, s, c.ID)
			if st.Remaining != 2 || st.Sold != 1 || st.SoldOut || mustSoldOut(t, s, c.ID) {
				t.Fatalf("got remaining %d sold %d sold out %v, want 2, 1, false", st.Remaining, st.Sold, st.SoldOut)
			}
			if got := mustUserUnits(t, s, c.ID, "alice"); got != 1 {
				t.Fatalf("alice's units: got %d, want 1", got)
			}
			// Alice may buy again, within her limit of 3.
			sell(t, s, c.ID, "alice", 2)

			before := campaignState(t, s, c.ID)
			if mustRelease(t, s, c.ID, o1, "alice", 2) {
				t.Fatalf("second release: got true, want false")
			}
			if after := campaignState(t, s, c.ID); !maps.Equal(before, after) {
				t.Fatalf("second release changed %v into %v", before, after)
			}
		})
		t.Run("last units of a buyer", func(t *testing.T) {
			c := newCampaign(t, 5, 2)
			mustLoad(t, s, c)
			o := sell(t, s, c.ID, "bob", 2)
			mustRelease(t, s, c.ID, o, "bob", 2)
			if n, err := s.rdb.HExists(t.Context(), campaignKeys(c.ID).users, "bob").Result(); err != nil || n {
				t.Fatalf("bob's units field: got %v (%v), want removed", n, err)
			}
		})
		t.Run("never above stock", func(t *testing.T) {
			// An order Redis never deducted (decided under an earlier
			// load): remaining stops at the stock, the buyer's units and
			// the sold counter at zero.
			c := newCampaign(t, 4, 2)
			mustLoad(t, s, c)
			o := sell(t, s, c.ID, "carol", 1)
			if !mustRelease(t, s, c.ID, "o-before-reload", "dave", 3) {
				t.Fatalf("got released false, want true")
			}
			st := mustStats(t, s, c.ID)
			if st.Remaining != 4 || st.Sold != 0 || mustUserUnits(t, s, c.ID, "dave") != 0 {
				t.Fatalf("got remaining %d sold %d dave %d, want 4, 0, 0", st.Remaining, st.Sold, mustUserUnits(t, s, c.ID, "dave"))
			}
			mustRelease(t, s, c.ID, o, "carol", 1)
			if st := mustStats(t, s, c.ID); st.Remaining != 4 {
				t.Fatalf("got remaining %d, want 4", st.Remaining)
			}
		})
		t.Run("not loaded", func(t *testing.T) {
			c := newCampaign(t, 4, 2)
			for range 2 {
				ok, err := s.Release(t.Context(), c.ID, "o1", "erin", 1)
				if ok || !errors.Is(err, model.ErrNotLoaded) {
					t.Fatalf("got %v, %v; want false, %v", ok, err, model.ErrNotLoaded)
				}
			}
			if got := campaignState(t, s, c.ID); len(got) != 0 {
				t.Fatalf("release of an unloaded campaign wrote %v", got)
			}
		})
		t.Run("no units", func(t *testing.T) {
			c := newCampaign(t, 4, 2)
			mustLoad(t, s, c)
			before := campaignState(t, s, c.ID)
			var inv *model.InvalidError
			if ok, err := s.Release(t.Context(), c.ID, "o1", "erin", 0); ok || !errors.As(err, &inv) {
				t.Fatalf("got %v, %v; want an InvalidError", ok, err)
			}
			if after := campaignState(t, s, c.ID); !maps.Equal(before, after) {
				t.Fatalf("refused release changed %v into %v", before, after)
			}
		})
	})
}

func TestParseReleaseReply(t *testing.T) {
	tests := []struct {
		code    int
		want    bool
		wantErr error
	}{
		{code: 1, want: true},
		{code: 0, want: false},
		{code: -1, wantErr: model.ErrNotLoaded},
		{code: 2, wantErr: errors.New("unexpected")},
	}
	for _, tc := range tests {
		got, err := parseReleaseReply("c", "o", tc.code)
		if got != tc.want || (err == nil) != (tc.wantErr == nil) || (errors.Is(tc.wantErr, model.ErrNotLoaded) && !errors.Is(err, model.ErrNotLoaded)) {
			t.Errorf("reply %d: got %v, %v; want %v, %v", tc.code, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestReleaseRace: many goroutines release a sold-out campaign's orders on
// real Redis, each order several times at once, some not at all. Each
// released order's units come back exactly once, remaining never passes
// the stock, and at the end remaining, sold and every buyer's units are
// those of the orders still held.
func TestReleaseRace(t *testing.T) { forEachServer(t, testReleaseRace) }

func testReleaseRace(t *testing.T, s *Store) {
	const (
		stock      = 200
		goroutines = 32
		copies     = 4 // concurrent releases of each released order
	)
	ctx := t.Context()
	c := newCampaign(t, stock, 10)
	mustLoad(t, s, c)

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	type order struct {
		id, user string
		units    int64
		release  bool
	}
	var orders []order
	for left := int64(stock); left > 0; {
		units := min(int64(1+rng.IntN(3)), left)
		user := fmt.Sprintf("u%02d", rng.IntN(40))
		r := mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: newRequestID(c.ID), UserID: user, Quantity: units, OrderID: testenv.Name(t, "o")}})
		if r.Results[0].Status != model.StatusSuccess {
			continue // this user reached the limit
		}
		orders = append(orders, order{id: r.Results[0].OrderID, user: user, units: units, release: rng.IntN(3) > 0})
		left -= units
	}
	if !mustSoldOut(t, s, c.ID) {
		t.Fatalf("got not sold out, want sold out before the releases")
	}

	jobs := make(chan order)
	wins := make([]atomic.Int32, len(orders))
	index := map[string]int{}
	for i, o := range orders {
		index[o.id] = i
	}
	stop, watched := make(chan struct{}), make(chan int)
	go func() {
		polls := 0
		defer func() { watched <- polls }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := s.Stats(ctx, c.ID)
			if err != nil {
				t.Errorf("Stats during the run: %v", err)
				return
			}
			if st.Remaining < 0 || st.Remaining > stock {
				t.Errorf("remaining %d outside [0, %d]", st.Remaining, stock)
			}
			polls++
		}
	}()
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for o := range jobs {
				ok, err := s.Release(ctx, c.ID, o.id, o.user, o.units)
				if err != nil {
					t.Errorf("Release(%s): %v", o.id, err)
					continue
				}
				if ok {
					wins[index[o.id]].Add(1)
				}
			}
		})
	}
	var work []order
	for _, o := range orders {
		if o.release {
			for range copies {
				work = append(work, o)
			}
		}
	}
	rng.Shuffle(len(work), func(i, j int) { work[i], work[j] = work[j], work[i] })
	for _, j := range work {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	close(stop)
	t.Logf("%d orders, %d releases, %d polls of the counters", len(orders), len(work), <-watched)

	held := int64(0)
	userUnits := map[string]int64{}
	for i, o := range orders {
		want := int32(0)
		if o.release {
			want = 1
		} else {
			held += o.units
			userUnits[o.user] += o.units
		}
		if got := wins[i].Load(); got != want {
			t.Errorf("order %s: released %d times, want %d", o.id, got, want)
		}
	}
	st := mustStats(t, s, c.ID)
	if st.Remaining != stock-held || st.Sold != held || st.SoldOut != (held == stock) {
		t.Errorf("got remaining %d sold %d sold out %v, want %d, %d, %v", st.Remaining, st.Sold, st.SoldOut, stock-held, held, held == stock)
	}
	for u := range 40 {
		user := fmt.Sprintf("u%02d", u)
		if got := mustUserUnits(t, s, c.ID, user); got != userUnits[user] {
			t.Errorf("%s: got %d units, want %d", user, got, userUnits[user])
		}
	}
}

// TestStockReturnedEvent: StockReturned reaches subscribers as
// model.EventReturned.
func TestStockReturnedEvent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		ready, got := make(chan struct{}), make(chan model.Event, 1)
		go func() {
			_ = s.SubscribeEvents(ctx, func() { close(ready) }, func(e model.Event) { got <- e })
		}()
		<-ready
		if err := s.StockReturned(ctx, "spring"); err != nil {
			t.Fatalf("StockReturned: %v", err)
		}
		if e := <-got; e != (model.Event{Type: model.EventReturned, CampaignID: "spring"}) {
			t.Fatalf("got %+v, want a returned event for spring", e)
		}
	})
}
