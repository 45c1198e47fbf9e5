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

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
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
// moved past every request admitted before it does. A sweep runs first, as
// the sweeper's runs do between admissions: it marks the line that the
// decision then passes.
func passQueue(t *testing.T, s *Store, c model.Campaign, user string) {
	t.Helper()
	markLine(t, s, c.ID)
	mustDeduct(t, s, c.ID, []model.Deduction{queuedRequest(t, s, c, user)})
}

// markLine runs a sweep of tags that can reject nothing (the grace is
// never over, the ended rule off): it only marks how far admissions have
// come.
func markLine(t *testing.T, s *Store, tags ...string) {
	t.Helper()
	if rs := mustSweepNotEnqueued(t, s, time.Hour, 0, tags...); len(rs) != 0 {
		t.Fatalf("marking sweep: got %+v, want none", rs)
	}
}

func mustSweepNotEnqueued(t *testing.T, s *Store, grace, maxDelay time.Duration, tags ...string) []model.Result {
	t.Helper()
	rs, err := s.SweepNotEnqueued(t.Context(), tags, grace, maxDelay)
	if err != nil {
		t.Fatalf("SweepNotEnqueued(%v, %v): %v", grace, maxDelay, err)
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

// admitted reports whether rid's admission is in tag's admissions set.
func admitted(t *testing.T, s *Store, tag, rid string) bool {
	t.Helper()
	members, err := s.rdb.ZRange(t.Context(), campaignKeys(tag).admissions, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(members, func(m string) bool { return slices.Contains(strings.Fields(m), rid) })
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
// with not_enqueued once the queue has moved past it: a request admitted
// the grace after it was decided (a sweep's mark between the two shows
// it), or the sale ended the delay ago and was not resumed since. Anything
// decided is left alone, and so is a queue that stands still, a request a
// later one overtook, a paused campaign. An admission leaves the
// admissions set once all of its requests are final.
func TestSweepNotEnqueued(t *testing.T) {
	const long = time.Hour // never due within a test
	// setMeta writes Redis's copy of the campaign's times, as a sale that
	// ended (end_ms) or was resumed (resumed_ms) long ago has them.
	setMeta := func(t *testing.T, s *Store, c model.Campaign, field string, ago time.Duration) {
		t.Helper()
		if err := s.rdb.HSet(t.Context(), campaignKeys(c.ID).meta, field, time.Now().Add(-ago).UnixMilli()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// backdate moves every admission of c into the past, as the end of a
	// sale is after its admissions.
	backdate := func(t *testing.T, s *Store, c model.Campaign, by time.Duration) {
		t.Helper()
		k := campaignKeys(c.ID).admissions
		zs, err := s.rdb.ZRangeWithScores(t.Context(), k, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range zs {
			if err := s.rdb.ZAddXX(t.Context(), k, redis.Z{Score: z.Score - float64(by.Milliseconds()), Member: z.Member}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name string
		// run acts on the admitted request d and returns the results the
		// last sweep stored.
		run        func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result
		wantSwept  bool         // the sweep rejected d
		wantStatus model.Status // d's stored result at the end
		wantKept   bool         // d's admission still in the admissions set
	}{
		{
			name: "passed by a request admitted the grace later",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, 0, 0, c.ID)
			},
			wantSwept: true, wantStatus: model.StatusRejected,
		},
		{
			name: "passed within the grace",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, long, long, c.ID)
			},
			wantStatus: model.StatusQueued, wantKept: true, // alice's and bob's
		},
		{
			// Bob's message may have overtaken alice's, which then waits
			// behind it: no mark between their admissions, no proof.
			name: "overtaken by a later request, then delivered",
			run: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result {
				mustDeduct(t, s, c.ID, []model.Deduction{queuedRequest(t, s, c, "bob")})
				markLine(t, s, c.ID)
				swept := mustSweepNotEnqueued(t, s, 0, 0, c.ID)
				mustDeduct(t, s, c.ID, []model.Deduction{d})
				return swept
			},
			wantStatus: model.StatusSuccess, wantKept: true, // final, not passed yet
		},
		{
			name: "the queue stands still",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				markLine(t, s, c.ID)
				return mustSweepNotEnqueued(t, s, 0, 0, c.ID)
			},
			wantStatus: model.StatusQueued, wantKept: true,
		},
		{
			name: "the sale ended the delay ago",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				setMeta(t, s, c, "end_ms", time.Second)
				backdate(t, s, c, 2*time.Second)
				return mustSweepNotEnqueued(t, s, long, time.Millisecond, c.ID)
			},
			wantSwept: true, wantStatus: model.StatusRejected,
		},
		{
			name: "the sale ended less than the delay ago",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				setMeta(t, s, c, "end_ms", time.Second)
				return mustSweepNotEnqueued(t, s, long, long, c.ID)
			},
			wantStatus: model.StatusQueued, wantKept: true,
		},
		{
			name: "the sale ended, the ended rule off",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				setMeta(t, s, c, "end_ms", time.Second)
				return mustSweepNotEnqueued(t, s, long, 0, c.ID)
			},
			wantStatus: model.StatusQueued, wantKept: true,
		},
		{
			name: "withdrawn by its gateway",
			run: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result {
				a := model.AdmitRequest{RequestID: d.RequestID, CampaignID: c.ID, UserID: "alice", Quantity: 1, IdempotencyKey: "k-alice"}
				if err := s.Withdraw(t.Context(), []model.AdmitRequest{a}); err != nil {
					t.Fatal(err)
				}
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, 0, 0, c.ID)
			},
			wantStatus: "", // taken back
		},
		{
			name: "decided by a worker",
			run: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result {
				mustDeduct(t, s, c.ID, []model.Deduction{d})
				return mustSweepNotEnqueued(t, s, 0, 0, c.ID)
			},
			wantStatus: model.StatusSuccess, wantKept: true,
		},
		{
			name: "given up by a worker",
			run: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) []model.Result {
				if _, err := s.Reject(t.Context(), d, c.ID, model.ReasonPoison); err != nil {
					t.Fatal(err)
				}
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, 0, 0, c.ID)
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
				if rs := mustSweepNotEnqueued(t, s, 0, 0, c.ID); len(rs) != 0 {
					t.Fatalf("swept while paused: %+v", rs)
				}
				mustSetPaused(t, s, c, false)
				mustDeduct(t, s, c.ID, []model.Deduction{d})
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, 0, 0, c.ID)
			},
			wantStatus: model.StatusSuccess,
		},
		{
			name: "paused",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				passQueue(t, s, c, "bob")
				mustSetPaused(t, s, c, true)
				return mustSweepNotEnqueued(t, s, 0, 0, c.ID)
			},
			wantStatus: model.StatusQueued, wantKept: true,
		},
		{
			name: "resumed, then passed by the queue",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				mustSetPaused(t, s, c, true)
				mustSetPaused(t, s, c, false)
				passQueue(t, s, c, "bob")
				return mustSweepNotEnqueued(t, s, 0, long, c.ID)
			},
			wantSwept: true, wantStatus: model.StatusRejected,
		},
		{
			name: "the sale ended, resumed within the delay",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				setMeta(t, s, c, "end_ms", 2*long)
				mustSetPaused(t, s, c, true)
				mustSetPaused(t, s, c, false)
				return mustSweepNotEnqueued(t, s, long, long, c.ID)
			},
			wantStatus: model.StatusQueued, wantKept: true,
		},
		{
			name: "the sale ended, resumed longer ago than the delay",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				setMeta(t, s, c, "end_ms", 2*long)
				mustSetPaused(t, s, c, true)
				mustSetPaused(t, s, c, false)
				setMeta(t, s, c, "resumed_ms", 2*time.Second)
				backdate(t, s, c, 3*long)
				return mustSweepNotEnqueued(t, s, long, time.Second, c.ID)
			},
			wantSwept: true, wantStatus: model.StatusRejected,
		},
		{
			name: "dropped by a rebuild",
			run: func(t *testing.T, s *Store, c model.Campaign, _ model.Deduction) []model.Result {
				c.Epoch++
				mustRebuild(t, s, c, nil)
				return mustSweepNotEnqueued(t, s, 0, 0, c.ID)
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
				if kept := admitted(t, s, c.ID, d.RequestID); kept != tc.wantKept {
					t.Fatalf("alice's admission in the admissions set: got %v, want %v", kept, tc.wantKept)
				}
				if again := mustSweepNotEnqueued(t, s, 0, 0, c.ID); !tc.wantKept && len(again) != 0 {
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
		if got := mustSweepNotEnqueued(t, s, 0, 0, c.ID); len(got) != 1 {
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
		got := mustSweepNotEnqueued(t, s, 0, 0, c.ID)
		if len(got) != 2 || !slices.ContainsFunc(got, func(r model.Result) bool { return r.RequestID == before[0].RequestID }) ||
			!slices.ContainsFunc(got, func(r model.Result) bool { return r.RequestID == before[1].RequestID }) {
			t.Fatalf("swept %+v, want %s and %s", got, before[0].RequestID, before[1].RequestID)
		}
		if r := mustResult(t, s, after.RequestID); r.Status != model.StatusQueued {
			t.Fatalf("admitted after the last decided: got %+v, want queued", r)
		}
		for _, d := range before {
			if admitted(t, s, c.ID, d.RequestID) {
				t.Fatalf("admissions set: %s still in, want it dropped", d.RequestID)
			}
		}
		if !admitted(t, s, c.ID, after.RequestID) {
			t.Fatalf("admissions set: a3's admission dropped, want it kept")
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
	got := mustSweepNotEnqueued(t, s, 0, 0, tags...)
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
		// The last request's admission may stay: nothing passed it.
		if n := admissionsLeft(t, s, tag); n > 1 {
			t.Fatalf("admissions set after the sweep in %s: got %d members, want at most the last one", tag, n)
		}
	}
}

// marks reads tag's marks (counters mark:<seq> -> ms).
func marks(t *testing.T, s *Store, tag string) map[string]string {
	t.Helper()
	all, err := s.rdb.HGetAll(t.Context(), campaignKeys(tag).counters).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for f, v := range all {
		if strings.HasPrefix(f, "mark:") {
			out[f] = v
		}
	}
	return out
}

// TestSweepNotEnqueuedMarks: the marks a sweep leaves stay few however
// long the queue stands while admissions go on, a sweep with nothing
// admitted since refreshes the newest instead of adding one, the marks
// the queue passed go, and the counters stay readable (Stats).
func TestSweepNotEnqueuedMarks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 5, 1)
		mustLoad(t, s, c)
		var first model.Deduction
		for i := range 40 {
			d := queuedRequest(t, s, c, fmt.Sprintf("u%d", i))
			if i == 0 {
				first = d
			}
			markLine(t, s, c.ID)
			if n := len(marks(t, s, c.ID)); n < 1 || n > 8 {
				t.Fatalf("after %d admissions: got %d marks, want 1 to 8", i+1, n)
			}
		}
		before := marks(t, s, c.ID)
		markLine(t, s, c.ID)
		if after := marks(t, s, c.ID); len(after) != len(before) {
			t.Fatalf("a sweep with nothing admitted since: got %d marks, want %d", len(after), len(before))
		}
		// Decided: the queue passed every mark but the last one's number.
		mustDeduct(t, s, c.ID, []model.Deduction{first})
		passQueue(t, s, c, "last")
		markLine(t, s, c.ID)
		if got := marks(t, s, c.ID); len(got) != 1 {
			t.Fatalf("after the queue passed them: got marks %v, want only the newest", got)
		}
		mustStats(t, s, c.ID)
	})
}

// TestSweepNotEnqueuedGrace: with a real grace and the sweeps a sweeper
// runs, an orphan passed by a request admitted right after it stays
// queued; once requests admitted the grace later are decided, it is
// rejected.
func TestSweepNotEnqueuedGrace(t *testing.T) {
	const grace = 200 * time.Millisecond
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 100, 1)
		mustLoad(t, s, c)
		orphan := queuedRequest(t, s, c, "orphan")
		mustDeduct(t, s, c.ID, []model.Deduction{queuedRequest(t, s, c, "soon")})
		if rs := mustSweepNotEnqueued(t, s, grace, 0, c.ID); len(rs) != 0 {
			t.Fatalf("passed by a request admitted within the grace: swept %+v, want none", rs)
		}
		i := 0
		testenv.Eventually(t, 30*time.Second, "the orphan rejected", func() (bool, string) {
			i++
			mustDeduct(t, s, c.ID, []model.Deduction{queuedRequest(t, s, c, fmt.Sprintf("later%d", i))})
			rs := mustSweepNotEnqueued(t, s, grace, 0, c.ID)
			if len(rs) > 1 || len(rs) == 1 && rs[0].RequestID != orphan.RequestID {
				t.Fatalf("swept %+v, want only the orphan", rs)
			}
			return len(rs) == 1, fmt.Sprintf("%d later requests decided", i)
		})
	})
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
				rs, err := s.SweepNotEnqueued(t.Context(), []string{c.ID}, 0, 0)
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
	for _, r := range mustSweepNotEnqueued(t, s, 0, 0, c.ID) {
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
	// Only the closing request's admission may be left: nothing passed it.
	if left := admissionsLeft(t, s, c.ID); left > 1 {
		t.Fatalf("admissions set at the end: %d members, want at most the closing one", left)
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
