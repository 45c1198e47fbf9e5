package worker

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// addUnknown records msgs as published to topic with an unknown outcome,
// as the gateway does.
func (f *fixture) addUnknown(t testing.TB, topic string, msgs []queue.Message) {
	t.Helper()
	reqs := make([]model.AdmitRequest, len(msgs))
	for i, m := range msgs {
		req, err := model.DecodePurchaseRequest(m.Body)
		if err != nil {
			t.Fatal(err)
		}
		reqs[i] = model.AdmitRequest{RequestID: req.RequestID, CampaignID: req.CampaignID, UserID: req.UserID, Quantity: req.Quantity}
	}
	if err := f.st.AddUnknown(context.Background(), topic, reqs); err != nil {
		t.Errorf("AddUnknown: %v", err)
	}
}

// TestSweepUnknown: of two requests whose publish outcome was unknown, the
// one a worker decided keeps its result and order; the other, which no
// worker saw, is rejected as not enqueued by the sweep loop, and its result
// is published like any other final result. Its message arriving late
// afterwards changes nothing: no order, no unit.
func TestSweepUnknown(t *testing.T) {
	f := newFixture(t, 5, 1)
	msgs := f.admit(t, 2, 2)
	topic := testenv.Topic(t)
	f.addUnknown(t, topic, msgs)
	m := metrics.New()
	w := New(discard(), f.st, f.db, m, Options{})
	if err := queue.Serial(w.Decide)(t.Context(), msgs[:1]); err != nil {
		t.Fatalf("decide the stored one: %v", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	published := make(chan model.Result, 16)
	ready := make(chan struct{})
	go func() {
		_ = f.st.SubscribeResults(ctx, f.campaign.ID, sync.OnceFunc(func() { close(ready) }), func(r model.Result) {
			published <- r
		})
	}()
	<-ready
	swept := make(chan error, 1)
	go func() { swept <- w.SweepUnknown(ctx, topic, time.Second) }()

	want := model.Result{RequestID: msgs[1].ID, CampaignID: f.campaign.ID, UserID: "user1", Status: model.StatusRejected,
		Reason: model.ReasonNotEnqueued, Quantity: 1}
	select {
	case got := <-published:
		if got != want {
			t.Fatalf("published: got %+v, want %+v", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no result published within 30 s of a 1 s queue delay")
	}
	cancel()
	if err := <-swept; err != nil {
		t.Fatalf("SweepUnknown: %v", err)
	}
	if got := testutil.ToFloat64(m.NotEnqueued); got != 1 {
		t.Fatalf("flashsale_not_enqueued_total: got %v, want 1", got)
	}
	before := f.snapshot(t, msgs)
	if before.results[msgs[0].ID].Status != model.StatusSuccess || before.results[msgs[1].ID] != want {
		t.Fatalf("results: got %+v, want a success and %+v", before.results, want)
	}

	// The swept request's message shows up after all.
	if err := queue.Serial(w.Decide)(t.Context(), msgs[1:]); err != nil {
		t.Fatalf("late delivery: %v", err)
	}
	after := f.snapshot(t, msgs)
	if after.results[msgs[1].ID] != want || after.remaining != 4 || after.sold != 1 || len(after.orders) != 1 {
		t.Fatalf("after the late delivery: result %+v, remaining %d, sold %d, orders %d; want %+v, 4, 1, 1",
			after.results[msgs[1].ID], after.remaining, after.sold, len(after.orders), want)
	}
}

// TestSweepUnknownRace: while requests are recorded as published with an
// unknown outcome in small chunks, workers deliver them (some twice, some
// never: not stored) and sweeps run, all at once. Every request ends with
// one final result; MySQL holds an order for every success and for nothing
// else, so a request swept before its message came got nothing; sold = the
// successes' units <= stock.
func TestSweepUnknownRace(t *testing.T) {
	const (
		stock    = 30
		requests = 200
		chunk    = 5
		workers  = 4
	)
	f := newFixture(t, stock, 1)
	msgs := f.admit(t, requests, requests)
	topic := testenv.Topic(t)
	w := New(discard(), f.st, f.db, metrics.New(), Options{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	copies := make([]int, requests)
	for i := range copies {
		copies[i] = rng.IntN(3)
	}

	// Deliveries are handed over one at a time, and a sweep follows each
	// chunk while its last deliveries are under way: the producer and the
	// sweeps go at the workers' pace, so the sweeps meet requests both
	// before and after their deliveries.
	deliveries := make(chan queue.Message)
	sweep := make(chan struct{}, 1)
	handle := queue.Serial(w.Decide)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(deliveries)
		defer close(sweep)
		for from := 0; from < requests; from += chunk {
			f.addUnknown(t, topic, msgs[from:from+chunk])
			for i := from; i < from+chunk; i++ {
				for range copies[i] {
					deliveries <- msgs[i]
				}
			}
			select {
			case sweep <- struct{}{}:
			default:
			}
		}
	})
	for range workers {
		wg.Go(func() {
			for m := range deliveries {
				if err := handle(t.Context(), []queue.Message{m}); err != nil {
					t.Errorf("deliver %s: %v", m.ID, err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range sweep {
			w.sweepUnknown(t.Context(), topic, 0)
		}
	})
	wg.Wait()
	w.sweepUnknown(t.Context(), topic, 0)

	s := f.snapshot(t, msgs)
	var successes, swept int64
	for _, m := range msgs {
		r := s.results[m.ID]
		_, ordered := s.orders[m.ID]
		switch {
		case !r.Status.Final():
			t.Fatalf("request %s: %s, want a final result", m.ID, r.Status)
		case (r.Status == model.StatusSuccess) != ordered:
			t.Fatalf("request %s: %s/%s with an order %v", m.ID, r.Status, r.Reason, ordered)
		case r.Status == model.StatusSuccess:
			successes++
		case r.Reason == model.ReasonNotEnqueued:
			swept++
		}
	}
	if s.sold != successes || s.remaining != stock-successes || successes > stock {
		t.Fatalf("sold %d, remaining %d, successes %d; want sold = successes <= %d = sold + remaining", s.sold, s.remaining, successes, stock)
	}
	t.Logf("%d successes, %d swept, %d decided otherwise", successes, swept, requests-successes-swept)
}
