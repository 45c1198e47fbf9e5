package store

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

// TestDeductRace hammers deduct.lua on real Redis from many goroutines with
// batches of varying size, users who come back from several goroutines and
// request ids delivered more than once (at-least-once queues). Exactly stock
// units must be sold, to distinct users, and every delivery of a request must
// see the same decision.
func TestDeductRace(t *testing.T) { forEachServer(t, testDeductRace) }

func testDeductRace(t *testing.T, s *Store) {
	const (
		stock    = 100
		workers  = 64
		users    = 2000
		requests = 8000 // distinct request ids
		dupRate  = 0.3  // share of extra deliveries of someone else's request
		maxBatch = 32
	)
	ctx := t.Context()
	c := newCampaign(t, stock, 1)
	mustLoad(t, s, c)

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	type request struct {
		rid, user string
		qty       int64
	}
	reqs := make([]request, requests)
	for i := range reqs {
		qty := int64(1)
		if rng.IntN(20) == 0 {
			qty = 2 // never fits a limit of 1
		}
		reqs[i] = request{rid: newRequestID(c.ID), user: fmt.Sprintf("u%04d", rng.IntN(users)), qty: qty}
	}

	// Watch the remaining stock while the workers run: it must stay within
	// [0, stock] and only ever go down.
	stop, watched := make(chan struct{}), make(chan int)
	go func() {
		polls, last := 0, int64(stock)
		defer func() { watched <- polls }()
		for {
			st, err := s.Stats(ctx, c.ID)
			if err != nil {
				t.Errorf("Stats during the run: %v", err)
				return
			}
			polls++
			if st.Remaining < 0 || st.Remaining > last {
				t.Errorf("remaining during the run: got %d after %d, want within [0, %d] and never rising", st.Remaining, last, last)
			}
			if st.Sold < 0 || st.Sold > stock {
				t.Errorf("sold during the run: got %d, want within [0, %d]", st.Sold, stock)
			}
			last = st.Remaining
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()

	type sent struct {
		d   model.Deduction
		got model.Result
	}
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		sentBy   = make([][]sent, workers)
		soldOuts = make([]int, workers)
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)+1))
			var mine []request
			for i := w; i < requests; i += workers {
				mine = append(mine, reqs[i])
				if rng.Float64() < dupRate {
					mine = append(mine, reqs[rng.IntN(requests)])
				}
			}
			rng.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
			<-start
			for len(mine) > 0 {
				n := min(1+rng.IntN(maxBatch), len(mine))
				batch := make([]model.Deduction, n)
				for i, r := range mine[:n] {
					batch[i] = model.Deduction{RequestID: r.rid, UserID: r.user, Quantity: r.qty, OrderID: fmt.Sprintf("o-%d-%d", w, len(sentBy[w])+i)}
				}
				mine = mine[n:]
				reply, err := s.Deduct(ctx, c.ID, batch)
				if err != nil {
					t.Errorf("worker %d: Deduct: %v", w, err)
					return
				}
				if reply.SoldOutNow {
					soldOuts[w]++
				}
				if reply.Made > 0 {
					if err := s.MarkDurable(ctx, c.ID, reply.Made, reply.Epoch); err != nil {
						t.Errorf("worker %d: MarkDurable: %v", w, err)
						return
					}
				}
				for i, d := range batch {
					sentBy[w] = append(sentBy[w], sent{d: d, got: reply.Results[i]})
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(stop)
	polls := <-watched
	t.Logf("%d model.Stats polls during the run", polls)
	if polls < 2 {
		t.Errorf("Stats polls during the run: got %d, want at least 2", polls)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every delivery of a request saw the same decision, and a success kept
	// the order id of one of its deliveries.
	first := map[string]model.Result{}
	candidates := map[string]map[string]bool{}
	deliveries, soldOutNow := 0, 0
	for w := range workers {
		soldOutNow += soldOuts[w]
		for _, x := range sentBy[w] {
			deliveries++
			if candidates[x.d.RequestID] == nil {
				candidates[x.d.RequestID] = map[string]bool{}
			}
			candidates[x.d.RequestID][x.d.OrderID] = true
			if f, ok := first[x.d.RequestID]; !ok {
				first[x.d.RequestID] = x.got
			} else if f != x.got {
				t.Errorf("request %s: got %+v, want the same as another delivery %+v", x.d.RequestID, x.got, f)
			}
		}
	}
	t.Logf("%d deliveries of %d requests", deliveries, len(first))
	if len(first) != requests {
		t.Fatalf("requests decided: got %d, want %d", len(first), requests)
	}
	if soldOutNow != 1 {
		t.Errorf("replies with SoldOutNow: got %d, want 1", soldOutNow)
	}

	wins := map[string]int64{} // units per user
	successes, count := 0, map[model.Status]int64{}
	for rid, r := range first {
		count[r.Status]++
		if r.Status == model.StatusSuccess {
			successes++
			wins[r.UserID] += r.Quantity
			if !candidates[rid][r.OrderID] {
				t.Errorf("request %s: order id %q is none of its deliveries' %v", rid, r.OrderID, candidates[rid])
			}
		} else if r.OrderID != "" {
			t.Errorf("request %s: %s with order id %q, want none", rid, r.Status, r.OrderID)
		}
		if got := mustResult(t, s, rid); got != r {
			t.Errorf("Result(%s): got %+v, want %+v", rid, got, r)
		}
	}
	if successes != stock {
		t.Errorf("distinct successful requests: got %d, want %d", successes, stock)
	}
	// The mark reached the last decision number, and there were no more
	// numbers than successes (a number per call that decided some).
	k := campaignKeys(c.ID)
	got, err := s.rdb.HMGet(ctx, k.counters, "made", "durable").Result()
	if made, _ := got[0].(string); err != nil || made == "" || got[1] != made {
		t.Errorf("counters made, durable: got %v (%v), want equal", got, err)
	} else if n, _ := strconv.Atoi(made); n < 1 || n > stock {
		t.Errorf("counter made: got %d, want within [1, %d]", n, stock)
	}
	seen := map[string]bool{}
	for _, r := range reqs {
		if seen[r.user] {
			continue
		}
		seen[r.user] = true
		got := mustUserUnits(t, s, c.ID, r.user)
		if got != wins[r.user] || got > 1 {
			t.Errorf("UserUnits(%s): got %d, want %d (at most 1)", r.user, got, wins[r.user])
		}
	}

	st := mustStats(t, s, c.ID)
	if st.Remaining != 0 || st.Sold != stock || !st.SoldOut {
		t.Errorf("Stats: got remaining %d sold %d sold out %v, want 0 %d true", st.Remaining, st.Sold, st.SoldOut, stock)
	}
	checkFinished(t, st, count)
}
