package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// TestSweepNotEnqueued: of three admitted requests, the two a worker decided
// keep their results and orders; the one between them, which no worker saw
// (its message never stored), is rejected as not enqueued by the sweeper's
// not-enqueued sweep, which finds the campaign in MySQL, once requests
// admitted the grace after it are decided (the two admitted with it prove
// nothing: their messages may have overtaken its), long before the
// queue delay. Its result is published like any other final result, and
// logged in one line with its count. Its message arriving late afterwards
// changes nothing: no order, no unit.
func TestSweepNotEnqueued(t *testing.T) {
	f := newFixture(t, 5, 1)
	msgs := f.admit(t, 3, 3)
	m := metrics.New()
	w := New(discard(), f.st, f.db, m, Options{})
	var logged bytes.Buffer
	sweeper := Sweeper{Log: slog.New(slog.NewTextHandler(&logged, nil)), Tasks: w.Tasks(200*time.Millisecond, time.Hour)}
	for _, i := range []int{0, 2} {
		if err := queue.Serial(w.Decide)(t.Context(), msgs[i:i+1]); err != nil {
			t.Fatalf("decide a stored one: %v", err)
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	published := make(chan model.Result, 1024)
	ready := make(chan struct{})
	go func() {
		_ = f.st.SubscribeResults(ctx, f.campaign.ID, sync.OnceFunc(func() { close(ready) }), func(r model.Result) {
			published <- r
		})
	}()
	<-ready
	swept := make(chan error, 1)
	go func() { swept <- sweeper.Run(ctx) }()

	want := model.Result{RequestID: msgs[1].ID, CampaignID: f.campaign.ID, UserID: "user1", Status: model.StatusRejected,
		Reason: model.ReasonNotEnqueued, Quantity: 1}
	// Later shoppers' requests (user0 again: refused by the limit, so the
	// stock stays) are decided while the sweeper runs.
	later := 0
	testenv.Eventually(t, 30*time.Second, "the orphan's result published", func() (bool, string) {
		for {
			select {
			case got := <-published:
				if got.RequestID != want.RequestID {
					continue
				}
				if got != want {
					t.Fatalf("published: got %+v, want %+v", got, want)
				}
				return true, ""
			default:
			}
			break
		}
		later++
		if err := queue.Serial(w.Decide)(t.Context(), f.admit(t, 1, 1)); err != nil {
			t.Fatalf("decide a later one: %v", err)
		}
		return false, fmt.Sprintf("%d later requests decided", later)
	})
	cancel()
	if err := <-swept; err != nil {
		t.Fatalf("sweeper: %v", err)
	}
	if got := testutil.ToFloat64(m.NotEnqueued); got != 1 {
		t.Fatalf("flashsale_not_enqueued_total: got %v, want 1", got)
	}
	// Written before Run returned, which ended every task. (Transfer
	// recovery reads every campaign of the shared Redis: other tests' may
	// give it something to say.)
	var lines []string
	for line := range strings.Lines(logged.String()) {
		if strings.Contains(line, `task="not-enqueued sweep"`) {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "count=1 ") || !strings.Contains(lines[0], msgs[1].ID) {
		t.Fatalf("log: got %q, want one line of the not-enqueued sweep naming its count and %s", lines, msgs[1].ID)
	}
	before := f.snapshot(t, msgs)
	if before.results[msgs[0].ID].Status != model.StatusSuccess || before.results[msgs[1].ID] != want || before.results[msgs[2].ID].Status != model.StatusSuccess {
		t.Fatalf("results: got %+v, want a success, %+v and a success", before.results, want)
	}

	// The swept request's message shows up after all.
	if err := queue.Serial(w.Decide)(t.Context(), msgs[1:2]); err != nil {
		t.Fatalf("late delivery: %v", err)
	}
	after := f.snapshot(t, msgs)
	if after.results[msgs[1].ID] != want || after.remaining != 3 || after.sold != 2 || len(after.orders) != 2 {
		t.Fatalf("after the late delivery: result %+v, remaining %d, sold %d, orders %d; want %+v, 3, 2, 2",
			after.results[msgs[1].ID], after.remaining, after.sold, len(after.orders), want)
	}
}

// TestSweepNotEnqueuedRace: while admitted requests are delivered in small
// chunks, workers decide them (some twice, some never: not stored) and
// sweeps run, all at once. Every request ends with
// one final result; MySQL holds an order for every success and for nothing
// else, so a request swept before its message came got nothing; sold = the
// successes' units <= stock.
func TestSweepNotEnqueuedRace(t *testing.T) {
	const (
		stock    = 30
		requests = 200
		chunk    = 5
		workers  = 4
	)
	f := newFixture(t, stock, 1)
	msgs := f.admit(t, requests, requests)
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
			if err := sweepOnce(t, w, 0); err != nil {
				t.Errorf("sweep: %v", err)
			}
		}
	})
	wg.Wait()
	// A request admitted after a sweep marked the line is delivered once
	// after all the others: the queue has moved past every one of them
	// when the last sweep runs.
	if err := sweepOnce(t, w, time.Hour); err != nil {
		t.Fatalf("marking sweep: %v", err)
	}
	closing := f.admit(t, 1, 1)[0]
	if err := handle(t.Context(), []queue.Message{closing}); err != nil {
		t.Fatalf("deliver %s: %v", closing.ID, err)
	}
	if err := sweepOnce(t, w, 0); err != nil {
		t.Fatalf("last sweep: %v", err)
	}

	s := f.snapshot(t, append(msgs, closing))
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
	if s.results[closing.ID].Status == model.StatusSuccess {
		successes++
	}
	if s.sold != successes || s.remaining != stock-successes || successes > stock {
		t.Fatalf("sold %d, remaining %d, successes %d; want sold = successes <= %d = sold + remaining", s.sold, s.remaining, successes, stock)
	}
	t.Logf("%d successes, %d swept, %d decided otherwise", successes, swept, requests-successes-swept)
}

// TestSweeperTasks: each task runs on its own timer, a failed run is
// logged with the task's name and the next run follows all the same, and
// Run returns once ctx ends.
func TestSweeperTasks(t *testing.T) {
	var logged bytes.Buffer
	fails, fine := make(chan struct{}), make(chan struct{})
	sweeper := Sweeper{Log: slog.New(slog.NewTextHandler(&logged, nil)), Tasks: []Task{
		{Name: "failing", Every: time.Millisecond, Run: func(ctx context.Context, _ *slog.Logger) error {
			select {
			case fails <- struct{}{}:
			case <-ctx.Done():
			}
			return errors.New("boom")
		}},
		// Its first run is due long after the test: only the other runs.
		{Name: "idle", First: time.Hour, Run: func(context.Context, *slog.Logger) error {
			t.Error("the idle task ran")
			return nil
		}},
		{Name: "fine", Every: time.Millisecond, Run: func(ctx context.Context, log *slog.Logger) error {
			log.Info("ran")
			select {
			case fine <- struct{}{}:
			case <-ctx.Done():
			}
			return nil
		}},
	}}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sweeper.Run(ctx) }()
	for range 2 { // a run after a failed one
		<-fails
		<-fine
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	out := logged.String()
	if !strings.Contains(out, `level=WARN msg="periodic task failed; its next run takes up what it left" task=failing err=boom`) ||
		!strings.Contains(out, `level=INFO msg=ran task=fine`) {
		t.Fatalf("log: got %q, want the failing task's failure and the fine task's line, each with its name", out)
	}
}

// sweepOnce runs the not-enqueued sweep once over the campaigns MySQL
// lists, as the task does, with the delay's rules off.
func sweepOnce(t *testing.T, w *Worker, grace time.Duration) error {
	tags, err := w.sweptTags(t.Context())
	if err != nil {
		return err
	}
	return w.sweepNotEnqueued(t.Context(), discard(), tags, grace, 0)
}
