package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

// queuedRequest admits one request of user in c, which adds it to the
// admissions set, and leaves it queued.
func queuedRequest(t *testing.T, s *Store, c model.Campaign, user string) model.Deduction {
	t.Helper()
	a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: user, Quantity: 1, IdempotencyKey: "k-" + user}
	mustAdmit(t, s, a)
	return model.Deduction{RequestID: a.RequestID, UserID: user, Quantity: 1, OrderID: "o-" + user}
}

// passQueue admits a request of user in c and decides it, as a queue that
// moved past every request admitted before it does.
func passQueue(t *testing.T, s *Store, c model.Campaign, user string) {
	t.Helper()
	mustDeduct(t, s, c.ID, []model.Deduction{queuedRequest(t, s, c, user)})
}

func mustSweepNotEnqueued(t *testing.T, s *Store, maxDelay time.Duration, tags ...string) []model.Result {
	t.Helper()
	rs, err := s.SweepNotEnqueued(t.Context(), tags, maxDelay)
	if err != nil {
		t.Fatalf("SweepNotEnqueued(%v): %v", maxDelay, err)
	}
	return rs
}

// admissionsLeft is how many admission calls of tag are still in the
// admissions set (not all of their requests final).
func admissionsLeft(t *testing.T, s *Store, tag string) int64 {
	t.Helper()
	n, err := s.rdb.ZCard(t.Context(), campaignKeys(tag).admissions).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func mustSetPaused(t *testing.T, s *Store, c model.Campaign, paused bool) {
	t.Helper()
	c.Paused = paused
	if ok, err := s.SetPaused(t.Context(), c); err != nil || !ok {
		t.Fatalf("SetPaused(%v): got %v, %v; want true, nil", paused, ok, err)
	}
}

// TestSweepNotEnqueued: an admitted request whose message never came (its
// gateway died before publishing, or the publish was lost) is rejected
// with not_enqueued once it was admitted longer ago than the delay and the
// queue has moved past it (a later request decided, or the sale ended the
// delay ago); anything decided is left alone, and so is a queue that stands
// still, a paused campaign or one resumed within the delay. An admission
// leaves the admissions set once all of its requests are final.
func TestSweepNotEnqueued(t *testing.T) {
	const long = time.Hour // never due within a test
	tests := []struct {
		name string
		// run acts on the admitted request d and returns the results the
		// last sweep stored.
		run        func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result
		wantSwept  bool         // the sweep rejected d
		wantStatus model.Status // d's stored result at the end
		wantLeft   int64        // admissions still in the admissions set
	}{
		{
			name: "due and passed by the queue",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantSwept: true, wantStatus: model.StatusRejected,
		},
		{
			name: "due and the sale ended the delay ago",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				// Redis's copy of the end, as a sale that ended has it.
				if err := s.rdb.HSet(t.Context(), campaignKeys(c.ID).meta, "end_ms", time.Now().Add(-time.Second).UnixMilli()).Err(); err != nil {
					t.Fatal(err)
				}
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantSwept: true, wantStatus: model.StatusRejected,
		},
		{
			name: "due but the queue stands still",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantStatus: model.StatusQueued, wantLeft: 1,
		},
		{
			name: "passed by the queue, not due yet",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, long, c.ID)
			},
			wantStatus: model.StatusQueued, wantLeft: 2, // alice's and bob's
		},
		{
			name: "withdrawn by its gateway",
			run: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result {
				a := model.AdmitRequest{RequestID: d.RequestID, CampaignID: c.ID, UserID: "alice", Quantity: 1, IdempotencyKey: "k-alice"}
				if err := s.Withdraw(t.Context(), []model.AdmitRequest{a}); err != nil {
					t.Fatal(err)
				}
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantStatus: "", // taken back
		},
		{
			name: "decided by a worker",
			run: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result {
				mustDeduct(t, s, c.ID, []model.Deduction{d})
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantStatus: model.StatusSuccess,
		},
		{
			name: "given up by a worker",
			run: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result {
				if _, err := s.Reject(t.Context(), d, c.ID, model.ReasonPoison); err != nil {
					t.Fatal(err)
				}
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantStatus: model.StatusRejected, // undeliverable, not swept
		},
		{
			name: "held while paused, decided after the resume",
			run: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result {
				mustSetPaused(t, s, c, true)
				if _, err := s.Deduct(t.Context(), c.ID, []model.Deduction{d}); !errors.Is(err, model.ErrPaused) {
					t.Fatalf("Deduct while paused: got %v, want %v", err, model.ErrPaused)
				}
				if rs := mustSweepNotEnqueued(t, s, 0, c.ID); len(rs) != 0 {
					t.Fatalf("swept while paused: %+v", rs)
				}
				mustSetPaused(t, s, c, false)
				mustDeduct(t, s, c.ID, []model.Deduction{d})
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantStatus: model.StatusSuccess,
		},
		{
			name: "paused",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				passQueue(t, s, c, "bob")
				mustSetPaused(t, s, c, true)
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantStatus: model.StatusQueued, wantLeft: 2,
		},
		{
			name: "resumed within the delay",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				passQueue(t, s, c, "bob")
				mustSetPaused(t, s, c, true)
				mustSetPaused(t, s, c, false)
				return mustSweepNotEnqueued(t, s, long, c.ID)
			},
			wantStatus: model.StatusQueued, wantLeft: 2,
		},
		{
			name: "resumed longer ago than the delay",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				passQueue(t, s, c, "bob")
				mustSetPaused(t, s, c, true)
				mustSetPaused(t, s, c, false)
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantSwept: true, wantStatus: model.StatusRejected,
		},
		{
			name: "dropped by a rebuild",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				c.Epoch++
				mustRebuild(t, s, c, nil)
				return mustSweepNotEnqueued(t, s, 0, c.ID)
			},
			wantStatus: "", // the rebuild forgot the request
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, s *Store) {
				c := newCampaign(t, 5, 1)
				mustLoad(t, s, c)
				d := queuedRequest(t, s, c, "alice")
				swept := tc.run(t, s, c, d)

				want := model.Result{RequestID: d.RequestID, CampaignID: c.ID, UserID: "alice", Status: model.StatusRejected,
					Reason: model.ReasonNotEnqueued, Quantity: 1}
				switch {
				case tc.wantSwept && (len(swept) != 1 || swept[0] != want):
					t.Fatalf("swept: got %+v, want [%+v]", swept, want)
				case !tc.wantSwept && len(swept) != 0:
					t.Fatalf("swept: got %+v, want none", swept)
				}
				if tc.wantStatus == "" {
					mustNoResult(t, s, d.RequestID)
				} else if got := mustResult(t, s, d.RequestID); got.Status != tc.wantStatus ||
					(tc.wantSwept && got != want) {
					t.Fatalf("stored: got %+v, want status %s", got, tc.wantStatus)
				}
				if left := admissionsLeft(t, s, c.ID); left != tc.wantLeft {
					t.Fatalf("admissions set: got %d members, want %d", left, tc.wantLeft)
				}
				if again := mustSweepNotEnqueued(t, s, 0, c.ID); tc.wantLeft == 0 && len(again) != 0 {
					t.Fatalf("second sweep: got %+v, want none", again)
				}
			})
		})
	}
}

// TestSweptRequestArrivesLate: a request swept as not enqueued whose
// message shows up after all (it was stored, but later than the delay)
// gets the rejected result from deduct.lua and takes no unit: one final
// result, no oversell, the counters unchanged.
func TestSweptRequestArrivesLate(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 2, 1)
		mustLoad(t, s, c)
		d := queuedRequest(t, s, c, "alice")
		passQueue(t, s, c, "carol")
		if got := mustSweepNotEnqueued(t, s, 0, c.ID); len(got) != 1 {
			t.Fatalf("swept: got %+v, want one result", got)
		}
		before := mustStats(t, s, c.ID)
		for range 2 { // redelivered too
			r := mustDeduct(t, s, c.ID, []model.Deduction{d})
			if got := r.Results[0]; got.Status != model.StatusRejected || got.Reason != model.ReasonNotEnqueued || got.OrderID != "" {
				t.Fatalf("late Deduct: got %+v, want rejected/%s without an order", got, model.ReasonNotEnqueued)
			}
		}
		after := mustStats(t, s, c.ID)
		if after.Remaining != 1 || after.Sold != 1 || mustUserUnits(t, s, c.ID, "alice") != 0 {
			t.Fatalf("after the late delivery: remaining %d, sold %d, alice %d; want 1, 1, 0",
				after.Remaining, after.Sold, mustUserUnits(t, s, c.ID, "alice"))
		}
		if after.Admitted != before.Admitted || after.Admitted != 2 || after.Queued() != 0 {
			t.Fatalf("counters: admitted %d (before %d), queued %d; want 2, 2, 0", after.Admitted, before.Admitted, after.Queued())
		}
		checkFinished(t, after, map[model.Status]int64{model.StatusRejected: 1, model.StatusSuccess: 1})
		// The shopper's stock is still for sale.
		other := model.Deduction{RequestID: newRequestID(c.ID), UserID: "bob", Quantity: 1, OrderID: "o-bob"}
		if r := mustDeduct(t, s, c.ID, []model.Deduction{other}); r.Results[0].Status != model.StatusSuccess {
			t.Fatalf("next buyer: got %+v, want success", r.Results[0])
		}
	})
}

// TestSweepOnlyWhatTheQueuePassed: of the queued requests, the sweep
// rejects those admitted before the last one decided, and leaves the ones
// admitted after it, which may still be on their way.
func TestSweepOnlyWhatTheQueuePassed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 5, 1)
		mustLoad(t, s, c)
		before := []model.Deduction{queuedRequest(t, s, c, "a1"), queuedRequest(t, s, c, "a2")}
		passQueue(t, s, c, "b")
		after := queuedRequest(t, s, c, "a3")
		got := mustSweepNotEnqueued(t, s, 0, c.ID)
		if len(got) != 2 || !slices.ContainsFunc(got, func(r model.Result) bool { return r.RequestID == before[0].RequestID }) ||
			!slices.ContainsFunc(got, func(r model.Result) bool { return r.RequestID == before[1].RequestID }) {
			t.Fatalf("swept %+v, want %s and %s", got, before[0].RequestID, before[1].RequestID)
		}
		if r := mustResult(t, s, after.RequestID); r.Status != model.StatusQueued {
			t.Fatalf("admitted after the last decided: got %+v, want queued", r)
		}
		if n := admissionsLeft(t, s, c.ID); n != 1 {
			t.Fatalf("admissions set: got %d members, want 1 (a3's)", n)
		}
	})
}

// TestSweepNotEnqueuedBatches: more due requests and admissions than one
// script call looks at are all swept in one SweepNotEnqueued, across
// campaigns.
func TestSweepNotEnqueuedBatches(t *testing.T) { forEachServer(t, testSweepNotEnqueuedBatches) }

func testSweepNotEnqueuedBatches(t *testing.T, s *Store) {
	want := map[string]bool{}
	var tags []string
	for range 2 {
		c := newCampaign(t, 5, 1)
		mustLoad(t, s, c)
		for call := range 100 { // more than the 64 members a call reads
			var batch []model.AdmitRequest
			for i := range notEnqueuedBudget/100 + 1 { // in all more than the budget
				a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: fmt.Sprintf("u%d-%d", call, i), Quantity: 1}
				batch = append(batch, a)
				want[a.RequestID] = true
			}
			if _, err := s.Admit(t.Context(), c.ID, batch, model.RateLimits{}); err != nil {
				t.Fatal(err)
			}
		}
		passQueue(t, s, c, "last")
		tags = append(tags, c.ID)
	}
	got := mustSweepNotEnqueued(t, s, 0, tags...)
	if len(got) != len(want) {
		t.Fatalf("swept %d, want %d", len(got), len(want))
	}
	for _, r := range got {
		if !want[r.RequestID] || r.Reason != model.ReasonNotEnqueued {
			t.Fatalf("swept %+v, want one of the admitted requests, not_enqueued", r)
		}
		delete(want, r.RequestID)
	}
	for _, tag := range tags {
		if n := admissionsLeft(t, s, tag); n != 0 {
			t.Fatalf("admissions set after the sweep in %s: got %d members, want 0", tag, n)
		}
	}
}

// TestSweepNotEnqueuedRace: while requests are admitted in small chunks,
// workers deduct them (some delivered twice, some never: lost between a
// gateway's admission and its publish) and sweepers reject what is due, all
// at once on real Redis. Every request ends with exactly one final result,
// the one every call reported for it; a swept request takes no unit; the
// units sold are the successes', never more than the stock; the counters
// add up.
func TestSweepNotEnqueuedRace(t *testing.T) { forEachServer(t, testSweepNotEnqueuedRace) }

func testSweepNotEnqueuedRace(t *testing.T, s *Store) {
	const (
		stock    = 50
		requests = 600
		chunk    = 10
		workers  = 8
		sweepers = 4
	)
	c := newCampaign(t, stock, 1)
	mustLoad(t, s, c)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	ds := make([]model.Deduction, requests)
	for i := range ds {
		ds[i] = model.Deduction{RequestID: newRequestID(c.ID), UserID: fmt.Sprintf("u%03d", i), Quantity: 1, OrderID: fmt.Sprintf("o%03d", i)}
	}
	// A third of the requests never arrive (not stored), the rest once or
	// twice (redelivered).
	copies := make([]int, requests)
	for i := range copies {
		copies[i] = rng.IntN(3)
	}

	var mu sync.Mutex
	seen := map[string]model.Result{} // every result any call reported
	report := func(r model.Result) {
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := seen[r.RequestID]; ok && (prev.Status != r.Status || prev.Reason != r.Reason || prev.OrderID != r.OrderID) {
			t.Errorf("request %s: reported %+v, then %+v", r.RequestID, prev, r)
		}
		seen[r.RequestID] = r
	}
	deliveries := make(chan model.Deduction, requests)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(deliveries)
		for from := 0; from < requests; from += chunk {
			var admits []model.AdmitRequest
			for _, d := range ds[from : from+chunk] {
				admits = append(admits, model.AdmitRequest{RequestID: d.RequestID, CampaignID: c.ID, UserID: d.UserID, Quantity: 1})
			}
			if _, err := s.Admit(t.Context(), c.ID, admits, model.RateLimits{}); err != nil {
				t.Errorf("Admit: %v", err)
				return
			}
			for i := from; i < from+chunk; i++ {
				for range copies[i] {
					deliveries <- ds[i]
				}
			}
		}
	})
	for range workers {
		wg.Go(func() {
			for d := range deliveries {
				r, err := s.Deduct(t.Context(), c.ID, []model.Deduction{d})
				if err == nil && r.Made > 0 {
					err = s.MarkDurable(t.Context(), c.ID, r.Made, r.Epoch)
				}
				if err != nil {
					t.Errorf("Deduct: %v", err)
					return
				}
				report(r.Results[0])
			}
		})
	}
	done := make(chan struct{})
	var sweeps sync.WaitGroup
	for range sweepers {
		sweeps.Go(func() {
			for {
				rs, err := s.SweepNotEnqueued(t.Context(), []string{c.ID}, 0)
				if err != nil {
					t.Errorf("SweepNotEnqueued: %v", err)
					return
				}
				for _, r := range rs {
					report(r)
				}
				select {
				case <-done:
					return
				default:
				}
			}
		})
	}
	wg.Wait()
	close(done)
	sweeps.Wait()
	// The queue moves past the last chunk too: one more request, decided.
	passQueue(t, s, c, "closing")
	for _, r := range mustSweepNotEnqueued(t, s, 0, c.ID) {
		report(r)
	}

	var successes, swept int64
	for _, d := range ds {
		got := mustResult(t, s, d.RequestID)
		if !got.Status.Final() {
			t.Fatalf("request %s: stored %s, want a final result", d.RequestID, got.Status)
		}
		if r, ok := seen[d.RequestID]; !ok || r.Status != got.Status || r.Reason != got.Reason {
			t.Fatalf("request %s: stored %+v, reported %+v (%v)", d.RequestID, got, r, ok)
		}
		units := mustUserUnits(t, s, c.ID, d.UserID)
		switch {
		case got.Status == model.StatusSuccess:
			successes++
			if units != 1 {
				t.Errorf("request %s succeeded, its user holds %d units, want 1", d.RequestID, units)
			}
		case units != 0:
			t.Errorf("request %s ended %s/%s, its user holds %d units, want 0", d.RequestID, got.Status, got.Reason, units)
		}
		if got.Reason == model.ReasonNotEnqueued {
			swept++
		}
	}
	successes += mustUserUnits(t, s, c.ID, "closing")
	st := mustStats(t, s, c.ID)
	if st.Sold != successes || st.Remaining != stock-successes || successes > stock {
		t.Fatalf("sold %d, remaining %d, successes %d; want sold = successes <= %d = remaining + sold", st.Sold, st.Remaining, successes, stock)
	}
	if st.Admitted != requests+1 || st.Queued() != 0 {
		t.Fatalf("admitted %d, queued %d; want %d, 0", st.Admitted, st.Queued(), requests+1)
	}
	if left := admissionsLeft(t, s, c.ID); left != 0 {
		t.Fatalf("admissions set at the end: %d members, want none", left)
	}
	t.Logf("%d successes, %d swept, %d decided otherwise", successes, swept, requests-successes-swept)
}

func TestParseNotEnqueuedReply(t *testing.T) {
	ok := []any{int64(3), int64(1), "c.1", "rejected|1||not_enqueued|u1"}
	with := func(i int, v any) []any {
		r := append([]any(nil), ok...)
		r[i] = v
		return r
	}
	tests := []struct {
		name    string
		reply   []any
		wantErr string
	}{
		{name: "valid", reply: ok},
		{name: "nothing swept", reply: ok[:2]},
		{name: "empty", reply: nil, wantErr: "0 elements"},
		{name: "odd", reply: ok[:3], wantErr: "3 elements"},
		{name: "left is a string", reply: with(0, "3"), wantErr: "counts"},
		{name: "more is not a flag", reply: with(1, int64(2)), wantErr: "counts"},
		{name: "id is an integer", reply: with(2, int64(1)), wantErr: "malformed"},
		{name: "value malformed", reply: with(3, "rejected|1"), wantErr: "malformed"},
		{name: "not rejected", reply: with(3, "success|1|o1||u1"), wantErr: "want rejected"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			more, rs, err := parseNotEnqueuedReply("c", tc.reply)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v %+v %v, want error containing %q", more, rs, err, tc.wantErr)
				}
				return
			}
			if err != nil || !more {
				t.Fatalf("got %v %+v %v, want more and no error", more, rs, err)
			}
			want := []model.Result{{RequestID: "c.1", CampaignID: "c", UserID: "u1", Status: model.StatusRejected,
				Reason: model.ReasonNotEnqueued, Quantity: 1}}
			if len(tc.reply) == 2 {
				want = nil
			}
			if fmt.Sprint(rs) != fmt.Sprint(want) {
				t.Fatalf("results: got %+v, want %+v", rs, want)
			}
		})
	}
}
