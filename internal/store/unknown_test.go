package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// unknownRequest admits one request of user in c and records it as
// published with an unknown outcome to topic, as the gateway does.
func unknownRequest(t *testing.T, s *Store, topic string, c model.Campaign, user string) model.Deduction {
	t.Helper()
	a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: user, Quantity: 1, IdempotencyKey: "k-" + user}
	mustAdmit(t, s, a)
	if err := s.AddUnknown(t.Context(), topic, []model.AdmitRequest{a}); err != nil {
		t.Fatalf("AddUnknown: %v", err)
	}
	return model.Deduction{RequestID: a.RequestID, UserID: user, Quantity: 1, OrderID: "o-" + user}
}

// newTopic returns a topic of the test's own, so that its sweeps see only
// its requests, and drops the topic's index at the end.
func newTopic(t *testing.T, s *Store) string {
	t.Helper()
	topic := testenv.Name(t, "topic")
	t.Cleanup(func() { _ = s.rdb.Del(context.Background(), unknownIndex(topic)).Err() })
	return topic
}

func mustSweep(t *testing.T, s *Store, topic string, maxDelay time.Duration) []model.Result {
	t.Helper()
	rs, err := s.SweepUnknown(t.Context(), topic, maxDelay)
	if err != nil {
		t.Fatalf("SweepUnknown(%v): %v", maxDelay, err)
	}
	return rs
}

// recorded reports how many requests of c are recorded and whether c is
// on topic's index.
func recorded(t *testing.T, s *Store, topic, campaignID string) (int64, bool) {
	t.Helper()
	n, err := s.rdb.ZCard(t.Context(), campaignKeys(campaignID).unknown).Result()
	if err != nil {
		t.Fatal(err)
	}
	indexed, err := s.rdb.SIsMember(t.Context(), unknownIndex(topic), campaignID).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n, indexed
}

func mustSetPaused(t *testing.T, s *Store, c model.Campaign, paused bool) {
	t.Helper()
	c.Paused = paused
	if ok, err := s.SetPaused(t.Context(), c); err != nil || !ok {
		t.Fatalf("SetPaused(%v): got %v, %v; want true, nil", paused, ok, err)
	}
}

// TestSweepUnknown: a request whose publish outcome was unknown is
// rejected with not_enqueued once it has been recorded for the delay and no
// worker has seen it; anything a worker saw or decided is left alone, and
// so is a paused campaign or one resumed within the delay.
func TestSweepUnknown(t *testing.T) {
	const long = time.Hour // never due within a test
	tests := []struct {
		name string
		// run acts on the recorded request d and returns the results the
		// last sweep stored.
		run        func(t *testing.T, s *Store, topic string, c model.Campaign, d model.Deduction) []model.Result
		wantSwept  bool         // the sweep rejected d
		wantStatus model.Status // d's stored result at the end
		wantLeft   int64        // requests still recorded
	}{
		{
			name: "due and queued",
			run: func(t *testing.T, s *Store, topic string, _ model.Campaign, _ model.Deduction) []model.Result {
				return mustSweep(t, s, topic, 0)
			},
			wantSwept: true, wantStatus: model.StatusRejected,
		},
		{
			name: "not due yet",
			run: func(t *testing.T, s *Store, topic string, _ model.Campaign, _ model.Deduction) []model.Result {
				return mustSweep(t, s, topic, long)
			},
			wantStatus: model.StatusQueued, wantLeft: 1,
		},
		{
			name: "decided by a worker",
			run: func(t *testing.T, s *Store, topic string, c model.Campaign, d model.Deduction) []model.Result {
				mustDeduct(t, s, c.ID, []model.Deduction{d})
				if n, _ := recorded(t, s, topic, c.ID); n != 0 {
					t.Fatalf("recorded after Deduct: got %d, want 0", n)
				}
				return mustSweep(t, s, topic, 0)
			},
			wantStatus: model.StatusSuccess,
		},
		{
			name: "given up by a worker",
			run: func(t *testing.T, s *Store, topic string, c model.Campaign, d model.Deduction) []model.Result {
				if _, err := s.Reject(t.Context(), d, c.ID, model.ReasonPoison); err != nil {
					t.Fatal(err)
				}
				if n, _ := recorded(t, s, topic, c.ID); n != 0 {
					t.Fatalf("recorded after Reject: got %d, want 0", n)
				}
				return mustSweep(t, s, topic, 0)
			},
			wantStatus: model.StatusRejected, // undeliverable, not swept
		},
		{
			name: "held by a worker while paused",
			run: func(t *testing.T, s *Store, topic string, c model.Campaign, d model.Deduction) []model.Result {
				mustSetPaused(t, s, c, true)
				if _, err := s.Deduct(t.Context(), c.ID, []model.Deduction{d}); !errors.Is(err, model.ErrPaused) {
					t.Fatalf("Deduct while paused: got %v, want %v", err, model.ErrPaused)
				}
				mustSetPaused(t, s, c, false)
				return mustSweep(t, s, topic, 0)
			},
			wantStatus: model.StatusQueued, // the held message is decided after the resume
		},
		{
			name: "paused",
			run: func(t *testing.T, s *Store, topic string, c model.Campaign, _ model.Deduction) []model.Result {
				mustSetPaused(t, s, c, true)
				return mustSweep(t, s, topic, 0)
			},
			wantStatus: model.StatusQueued, wantLeft: 1,
		},
		{
			name: "resumed within the delay",
			run: func(t *testing.T, s *Store, topic string, c model.Campaign, _ model.Deduction) []model.Result {
				mustSetPaused(t, s, c, true)
				mustSetPaused(t, s, c, false)
				return mustSweep(t, s, topic, long)
			},
			wantStatus: model.StatusQueued, wantLeft: 1,
		},
		{
			name: "resumed longer ago than the delay",
			run: func(t *testing.T, s *Store, topic string, c model.Campaign, _ model.Deduction) []model.Result {
				mustSetPaused(t, s, c, true)
				mustSetPaused(t, s, c, false)
				return mustSweep(t, s, topic, 0)
			},
			wantSwept: true, wantStatus: model.StatusRejected,
		},
		{
			name: "dropped by a rebuild",
			run: func(t *testing.T, s *Store, topic string, c model.Campaign, _ model.Deduction) []model.Result {
				c.Epoch++
				mustRebuild(t, s, c, nil)
				return mustSweep(t, s, topic, 0)
			},
			wantStatus: "", // the rebuild forgot the request
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, s *Store) {
				topic := newTopic(t, s)
				c := newCampaign(t, 5, 1)
				mustLoad(t, s, c)
				d := unknownRequest(t, s, topic, c, "alice")
				swept := tc.run(t, s, topic, c, d)

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
				left, indexed := recorded(t, s, topic, c.ID)
				if left != tc.wantLeft || indexed != (tc.wantLeft > 0) {
					t.Fatalf("recorded: got %d (indexed %v), want %d (indexed %v)", left, indexed, tc.wantLeft, tc.wantLeft > 0)
				}
				if again := mustSweep(t, s, topic, 0); tc.wantLeft == 0 && len(again) != 0 {
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
		topic := newTopic(t, s)
		c := newCampaign(t, 1, 1)
		mustLoad(t, s, c)
		d := unknownRequest(t, s, topic, c, "alice")
		if got := mustSweep(t, s, topic, 0); len(got) != 1 {
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
		if after.Remaining != 1 || after.Sold != 0 || mustUserUnits(t, s, c.ID, "alice") != 0 {
			t.Fatalf("after the late delivery: remaining %d, sold %d, alice %d; want 1, 0, 0",
				after.Remaining, after.Sold, mustUserUnits(t, s, c.ID, "alice"))
		}
		if after.Admitted != before.Admitted || after.Admitted != 1 || after.Queued() != 0 {
			t.Fatalf("counters: admitted %d (before %d), queued %d; want 1, 1, 0", after.Admitted, before.Admitted, after.Queued())
		}
		checkFinished(t, after, map[model.Status]int64{model.StatusRejected: 1})
		// The shopper's stock is still for sale.
		other := model.Deduction{RequestID: newRequestID(c.ID), UserID: "bob", Quantity: 1, OrderID: "o-bob"}
		if r := mustDeduct(t, s, c.ID, []model.Deduction{other}); r.Results[0].Status != model.StatusSuccess {
			t.Fatalf("next buyer: got %+v, want success", r.Results[0])
		}
	})
}

// TestSweepUnknownBatches: more due requests than one script call looks at
// are all swept in one SweepUnknown, across campaigns.
func TestSweepUnknownBatches(t *testing.T) { forEachServer(t, testSweepUnknownBatches) }

func testSweepUnknownBatches(t *testing.T, s *Store) {
	topic := newTopic(t, s)
	want := map[string]bool{}
	for range 2 {
		c := newCampaign(t, 5, 1)
		mustLoad(t, s, c)
		var batch []model.AdmitRequest
		for i := range sweepBatch + 7 {
			a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: fmt.Sprintf("u%d", i), Quantity: 1}
			batch = append(batch, a)
			want[a.RequestID] = true
		}
		if _, err := s.Admit(t.Context(), c.ID, batch, model.RateLimits{}); err != nil {
			t.Fatal(err)
		}
		if err := s.AddUnknown(t.Context(), topic, batch); err != nil {
			t.Fatal(err)
		}
	}
	got := mustSweep(t, s, topic, 0)
	if len(got) != len(want) {
		t.Fatalf("swept %d, want %d", len(got), len(want))
	}
	for _, r := range got {
		if !want[r.RequestID] || r.Reason != model.ReasonNotEnqueued {
			t.Fatalf("swept %+v, want one of the recorded requests, not_enqueued", r)
		}
		delete(want, r.RequestID)
	}
	if n, err := s.rdb.Exists(t.Context(), unknownIndex(topic)).Result(); err != nil || n != 0 {
		t.Fatalf("index after the sweep: got %d, %v; want gone", n, err)
	}
}

// TestSweepUnknownRace: while requests are admitted and recorded in small
// chunks (gateways meeting unknown publish outcomes), workers deduct them
// (some delivered twice, some never) and sweepers reject what is due, all
// at once on real Redis. Every request ends with exactly one final result,
// the one every call reported for it; a swept request takes no unit; the
// units sold are the successes', never more than the stock; the counters
// add up.
func TestSweepUnknownRace(t *testing.T) { forEachServer(t, testSweepUnknownRace) }

func testSweepUnknownRace(t *testing.T, s *Store) {
	const (
		stock    = 50
		requests = 600
		chunk    = 10
		workers  = 8
		sweepers = 4
	)
	topic := newTopic(t, s)
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
			if err := s.AddUnknown(t.Context(), topic, admits); err != nil {
				t.Errorf("AddUnknown: %v", err)
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
				rs, err := s.SweepUnknown(t.Context(), topic, 0)
				if err != nil {
					t.Errorf("SweepUnknown: %v", err)
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
	for _, r := range mustSweep(t, s, topic, 0) {
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
	st := mustStats(t, s, c.ID)
	if st.Sold != successes || st.Remaining != stock-successes || successes > stock {
		t.Fatalf("sold %d, remaining %d, successes %d; want sold = successes <= %d = remaining + sold", st.Sold, st.Remaining, successes, stock)
	}
	if st.Admitted != requests || st.Queued() != 0 {
		t.Fatalf("admitted %d, queued %d; want %d, 0", st.Admitted, st.Queued(), requests)
	}
	if left, indexed := recorded(t, s, topic, c.ID); left != 0 || indexed {
		t.Fatalf("recorded at the end: %d (indexed %v), want none", left, indexed)
	}
	t.Logf("%d successes, %d swept, %d decided otherwise", successes, swept, requests-successes-swept)
}

func TestParseSweepReply(t *testing.T) {
	ok := []any{int64(3), int64(2), "c.1", "rejected|1||not_enqueued|u1"}
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
		{name: "looked below the results", reply: with(1, int64(0)), wantErr: "counts"},
		{name: "id is an integer", reply: with(2, int64(1)), wantErr: "malformed"},
		{name: "value malformed", reply: with(3, "rejected|1"), wantErr: "malformed"},
		{name: "not rejected", reply: with(3, "success|1|o1||u1"), wantErr: "want rejected"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			left, looked, rs, err := parseSweepReply("c", tc.reply)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %d %d %+v %v, want error containing %q", left, looked, rs, err, tc.wantErr)
				}
				return
			}
			if err != nil || left != 3 || looked != 2 {
				t.Fatalf("got %d %d %+v %v, want 3 2 and no error", left, looked, rs, err)
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
