package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sony/gobreaker/v2"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/requestid"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/memqueue"
)

// gatePublisher records every Publish call. While held, calls block until
// release, so purchases pile up behind the flush in flight and must share
// the next one. fail makes every call fail.
type gatePublisher struct {
	mu      sync.Mutex
	calls   [][]queue.Message
	held    chan struct{}
	entered chan struct{} // receives once per call that starts
	fail    bool
}

func newGatePublisher(held bool) *gatePublisher {
	p := &gatePublisher{entered: make(chan struct{}, 1024)}
	if held {
		p.held = make(chan struct{})
	}
	return p
}

func (p *gatePublisher) Publish(ctx context.Context, _ string, msgs ...queue.Message) error {
	p.entered <- struct{}{}
	if p.held != nil {
		select {
		case <-p.held:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, msgs)
	if p.fail {
		return errors.New("broker unreachable")
	}
	return nil
}

func (p *gatePublisher) sizes() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int, len(p.calls))
	for i, c := range p.calls {
		out[i] = len(c)
	}
	return out
}

// newAdmitService returns a Service with one flush in flight at a time
// (unless opts asks for more) on the test Redis, and an open campaign
// preloaded with stock 100 and a per-user limit of 2.
func newAdmitService(t *testing.T, pub queue.Publisher, opts Options) (*Service, *store.Store, model.Campaign) {
	t.Helper()
	return newAdmitServiceOn(t, pub, opts, func(st *store.Store) Stock { return st })
}

// newAdmitServiceOn is newAdmitService with the Service's Stock made by
// wrap from the real store (to inject faults).
func newAdmitServiceOn(t *testing.T, pub queue.Publisher, opts Options, wrap func(*store.Store) Stock) (*Service, *store.Store, model.Campaign) {
	t.Helper()
	st := store.New(testenv.Redis(t))
	campaigns := &memCampaigns{c: model.Campaign{ID: testenv.Name(t, "adm"), Name: "t", Stock: 100, PerUserLimit: 2,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}}
	c := mustLoad(t, campaigns, st)
	// Its own topic: a test drains only the messages of its own purchases.
	opts.Topic = testenv.Topic(t)
	if opts.AdmitConcurrency == 0 {
		opts.AdmitConcurrency = 1
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return New(log, wrap(st), campaigns, pub, metrics.New(), opts), st, c
}

type purchaseOutcome struct {
	adm Admitted
	err error
}

// purchaseBehindGate starts one purchase that holds the only flush loop in
// Publish, then the purchases ps, waits until all of them are pending and
// opens the gate. It returns the outcomes of ps, in order; first's is not
// looked at.
func purchaseBehindGate(t *testing.T, svc *Service, pub *gatePublisher, first Purchase, ps []Purchase) []purchaseOutcome {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = svc.Purchase(t.Context(), first, nil) })
	<-pub.entered
	out := make([]purchaseOutcome, len(ps))
	for i, p := range ps {
		wg.Go(func() {
			adm, err := svc.Purchase(t.Context(), p, nil)
			out[i] = purchaseOutcome{adm, err}
		})
	}
	testenv.Eventually(t, 5*time.Second, fmt.Sprintf("%d pending purchases", len(ps)), func() (bool, string) {
		n := pending(svc)
		return n >= len(ps), fmt.Sprintf("%d pending", n)
	})
	close(pub.held)
	wg.Wait()
	return out
}

func pending(svc *Service) int {
	svc.admitter.mu.Lock()
	defer svc.admitter.mu.Unlock()
	return len(svc.admitter.pending)
}

// TestAdmitCoalesces: purchases that arrive while a flush is in flight
// share the next script call and publish, and each still gets its own
// answer exactly as admitting one by one would give it.
func TestAdmitCoalesces(t *testing.T) {
	pub := newGatePublisher(true)
	svc, st, c := newAdmitService(t, pub, Options{RateLimits: model.RateLimits{UserRate: 1, UserBurst: 2}})
	buy := func(user, key string) Purchase {
		return Purchase{UserID: user, CampaignID: c.ID, Quantity: 1, IdempotencyKey: key}
	}
	// u1 resends its key; u3 goes over its burst of 2 on the third request.
	ps := []Purchase{buy("u1", "k1"), buy("u1", "k1"), buy("u2", ""), buy("u3", ""), buy("u3", ""), buy("u3", "")}
	out := purchaseBehindGate(t, svc, pub, buy("u0", ""), ps)

	if got := pub.sizes(); len(got) != 2 || got[1] != 4 {
		t.Fatalf("publish sizes: got %v, want [1 4] (the four new requests in one publish)", got)
	}
	var fresh, existing, limited int
	ids := map[string]bool{}
	for i, o := range out {
		var rl *model.RateLimitError
		switch {
		case o.err == nil && o.adm.Existing:
			existing++
		case o.err == nil:
			fresh++
			ids[o.adm.RequestID] = true
		case errors.As(o.err, &rl) && rl.RetryAfterSeconds >= 1:
			limited++
		default:
			t.Errorf("purchase %d: got %+v, %v; want admitted, existing or rate limited", i, o.adm, o.err)
		}
	}
	if fresh != 4 || existing != 1 || limited != 1 || len(ids) != 4 {
		t.Errorf("got %d new (%d ids), %d existing, %d rate limited; want 4 (4), 1, 1", fresh, len(ids), existing, limited)
	}
	if out[0].adm.RequestID != out[1].adm.RequestID {
		t.Errorf("same key: got ids %s and %s, want the same", out[0].adm.RequestID, out[1].adm.RequestID)
	}
	if s, err := st.Stats(t.Context(), c.ID); err != nil || s.Admitted != 5 {
		t.Errorf("admitted: got %d (%v), want 5 (u0's and the four new)", s.Admitted, err)
	}
}

// TestAdmitLingers: purchases arriving while a batch is in flight wait
// AdmitLinger and go out together, instead of in whatever slices the free
// loop happened to find.
func TestAdmitLingers(t *testing.T) {
	pub := newGatePublisher(true)
	svc, _, c := newAdmitService(t, pub, Options{AdmitConcurrency: 2, AdmitLinger: 500 * time.Millisecond})
	buy := func(user string) Purchase { return Purchase{UserID: user, CampaignID: c.ID, Quantity: 1} }
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = svc.Purchase(t.Context(), buy("u0"), nil) }) // in flight, held in Publish
	<-pub.entered
	errs := make([]error, 10)
	for i := range errs {
		wg.Go(func() { _, errs[i] = svc.Purchase(t.Context(), buy(fmt.Sprintf("u%d", i+1)), nil) })
	}
	<-pub.entered // the second loop's publish, after its linger
	close(pub.held)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("purchase %d: %v", i+1, err)
		}
	}
	got := pub.sizes() // both publishes were held, so they end in either order
	slices.Sort(got)
	if !slices.Equal(got, []int{1, 10}) {
		t.Fatalf("publish sizes: got %v, want [1 10] (the ten purchases that arrived during the linger together)", got)
	}
}

// TestAdmitNoLingerWhenIdle: with no batch in flight a purchase goes out
// at once, whatever AdmitLinger says.
func TestAdmitNoLingerWhenIdle(t *testing.T) {
	pub := newGatePublisher(false)
	svc, _, c := newAdmitService(t, pub, Options{AdmitConcurrency: 2, AdmitLinger: time.Hour})
	done := make(chan error, 1)
	go func() {
		_, err := svc.Purchase(t.Context(), Purchase{UserID: "u1", CampaignID: c.ID, Quantity: 1}, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("purchase: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a lone purchase waited for AdmitLinger (an hour) with no batch in flight")
	}
}

// TestAdmitPublishFailure: when the shared publish fails, every request
// it carried is refused 503 and withdrawn, and a retry with the same key is a
// new request, not a dangling one.
func TestAdmitPublishFailure(t *testing.T) {
	pub := newGatePublisher(true)
	pub.fail = true
	svc, st, c := newAdmitService(t, pub, Options{})
	var ps []Purchase
	for i := range 4 {
		ps = append(ps, Purchase{UserID: fmt.Sprintf("u%d", i), CampaignID: c.ID, Quantity: 1, IdempotencyKey: "k"})
	}
	for i, o := range purchaseBehindGate(t, svc, pub, Purchase{UserID: "first", CampaignID: c.ID, Quantity: 1}, ps) {
		if !errors.Is(o.err, model.ErrUnavailable) {
			t.Errorf("purchase %d: got %+v, %v; want %v", i, o.adm, o.err, model.ErrUnavailable)
		}
	}
	s, err := st.Stats(t.Context(), c.ID)
	if err != nil || s.Admitted != 0 || s.Queued() != 0 {
		t.Fatalf("left behind: got admitted %d queued %d (%v), want 0 0", s.Admitted, s.Queued(), err)
	}
	pub.mu.Lock()
	pub.fail = false
	pub.mu.Unlock()
	adm, err := svc.Purchase(t.Context(), ps[0], nil)
	if err != nil || adm.Existing {
		t.Fatalf("retry after 503: got %+v, %v; want a new request", adm, err)
	}
}

// unknownPublisher reports every publish as queue.ErrUnknown, after passing
// it to the queue when store is set (a broker that stored the messages but
// answered FLUSH_DISK_TIMEOUT, say) and dropping it otherwise (a send that
// timed out before the broker read it).
type unknownPublisher struct {
	q     *memqueue.Queue
	store bool
}

func (p *unknownPublisher) Publish(ctx context.Context, topic string, msgs ...queue.Message) error {
	if p.store {
		if err := p.q.Publish(ctx, topic, msgs...); err != nil {
			return err
		}
	}
	return fmt.Errorf("publish %s: %w: flush timed out", topic, queue.ErrUnknown)
}

// TestAdmitPublishUnknown: when the shared publish's outcome is unknown,
// every request it carried is answered as admitted (202, its request id),
// nothing is withdrawn, a retry with the same key names the same request,
// and the requests stay in the admissions set: the not-enqueued sweep
// rejects only the ones no worker decided.
func TestAdmitPublishUnknown(t *testing.T) {
	for _, stored := range []bool{true, false} {
		t.Run(fmt.Sprintf("stored=%v", stored), func(t *testing.T) {
			q := memqueue.New(memqueue.Options{Partitions: 1})
			t.Cleanup(func() { _ = q.Close() })
			svc, st, c := newAdmitService(t, &unknownPublisher{q: q, store: stored}, Options{})
			const n = 3
			var ps []Purchase
			ids := map[string]bool{}
			for i := range n {
				p := Purchase{UserID: fmt.Sprintf("u%d", i), CampaignID: c.ID, Quantity: 1, IdempotencyKey: "k"}
				adm, err := svc.Purchase(t.Context(), p, nil)
				if err != nil || adm.Existing || adm.RequestID == "" {
					t.Fatalf("purchase %d: got %+v, %v; want a new request", i, adm, err)
				}
				ps = append(ps, p)
				ids[adm.RequestID] = true
			}
			// The three unknown outcomes opened the breaker (BreakerFailures
			// 3): a retry still finds the request it kept.
			if got := svc.breaker.State(); got != gobreaker.StateOpen {
				t.Fatalf("breaker: got %v, want open", got)
			}
			for i, p := range ps {
				adm, err := svc.Purchase(t.Context(), p, nil)
				if err != nil || !adm.Existing || !ids[adm.RequestID] {
					t.Fatalf("retry %d: got %+v, %v; want an earlier request", i, adm, err)
				}
			}
			if s, err := st.Stats(t.Context(), c.ID); err != nil || s.Admitted != n || s.Queued() != n {
				t.Fatalf("stats: got admitted %d queued %d (%v), want %d %d", s.Admitted, s.Queued(), err, n, n)
			}
			if got := testutil.ToFloat64(svc.m.PublishUnknown); got != n {
				t.Fatalf("flashsale_publish_unknown_total: got %v, want %d", got, n)
			}

			// What reached the queue is decided, as a worker does.
			var decided []model.Deduction
			if stored {
				for _, m := range drain(t, q, svc.opts.Topic, n) {
					req, err := model.DecodePurchaseRequest(m.Body)
					if err != nil || !ids[req.RequestID] {
						t.Fatalf("message %s: got %+v, %v; want one of the requests", m.ID, req, err)
					}
					decided = append(decided, model.Deduction{RequestID: req.RequestID, UserID: req.UserID, Quantity: req.Quantity, OrderID: "o-" + req.UserID})
				}
				if _, err := st.Deduct(t.Context(), c.ID, decided); err != nil {
					t.Fatal(err)
				}
			}
			passQueue(t, st, c.ID)
			swept, err := st.SweepNotEnqueued(t.Context(), []string{c.ID}, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			wantSwept := n - len(decided)
			if len(swept) != wantSwept {
				t.Fatalf("swept: got %+v, want %d", swept, wantSwept)
			}
			for _, r := range swept {
				if !ids[r.RequestID] || r.Reason != model.ReasonNotEnqueued {
					t.Fatalf("swept %+v, want one of the requests, not_enqueued", r)
				}
			}
			if s, err := st.Stats(t.Context(), c.ID); err != nil || s.Queued() != 0 || s.Sold != int64(len(decided))+1 {
				t.Fatalf("stats after: got queued %d sold %d (%v), want 0 %d", s.Queued(), s.Sold, err, len(decided)+1)
			}
		})
	}
}

// drain consumes n messages of topic from q.
func drain(t *testing.T, q *memqueue.Queue, topic string, n int) []queue.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	var got []queue.Message
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = q.Consumer("drain").Consume(ctx, topic, func(_ context.Context, msgs []queue.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, msgs...)
			if len(got) >= n {
				cancel()
			}
			return nil
		})
	}()
	<-done
	if len(got) != n {
		t.Fatalf("consumed %d messages, want %d", len(got), n)
	}
	return got
}

// TestAdmitNotLoaded: a campaign without stock in Redis is refused per
// request and nothing is published: never loaded, it is not_loaded (409);
// loaded before, Redis lost it and it is unavailable (503) until a preload
// rebuilds it.
func TestAdmitNotLoaded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		epoch model.Epoch // the campaign's in MySQL
		want  error
	}{
		{name: "never loaded", epoch: 0, want: model.ErrNotLoaded},
		{name: "lost", epoch: 1, want: model.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := newGatePublisher(false)
			svc, _, c := newAdmitService(t, pub, Options{})
			svc.campaigns.(*memCampaigns).c.Epoch = tc.epoch
			if err := testenv.Redis(t).Del(t.Context(), "fs:{"+c.ID+"}:stock", "fs:{"+c.ID+"}:meta").Err(); err != nil {
				t.Fatalf("unload: %v", err)
			}
			_, err := svc.Purchase(t.Context(), Purchase{UserID: "u1", CampaignID: c.ID, Quantity: 1}, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if got := pub.sizes(); len(got) != 0 {
				t.Errorf("publishes: got %v, want none", got)
			}
		})
	}
}

// TestAdmitCampaignLimitSharedByBuckets: a campaign of 4 buckets admits no
// more than the campaign rate limit in all, although each bucket keeps its
// own limiter state (before, each admitted the whole limit: 4 times it).
func TestAdmitCampaignLimitSharedByBuckets(t *testing.T) {
	const buckets, rate, burst = 4, 1, 8
	st := store.New(testenv.Redis(t))
	campaigns := &memCampaigns{c: model.Campaign{ID: testenv.Name(t, "admb"), Name: "t", Stock: 1000, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour), Buckets: buckets}}
	c := mustLoad(t, campaigns, st)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc := New(log, st, campaigns, newGatePublisher(false), metrics.New(), Options{Topic: testenv.Topic(t), AdmitConcurrency: 1,
		RateLimits: model.RateLimits{CampaignRate: rate, CampaignBurst: burst}})

	var users []string
	perBucket := make([]int, buckets)
	for i := 0; len(users) < 40; i++ {
		u := fmt.Sprintf("u%d", i)
		perBucket[model.BucketOf(u, buckets)]++
		users = append(users, u)
	}
	for b, n := range perBucket {
		if n <= burst/buckets {
			t.Fatalf("bucket %d has %d of the shoppers: the test cannot tell the limits apart", b, n)
		}
	}
	start := time.Now()
	var admitted, limited atomic.Int64
	var wg sync.WaitGroup
	for _, u := range users {
		wg.Go(func() {
			_, err := svc.Purchase(t.Context(), Purchase{UserID: u, CampaignID: c.ID, Quantity: 1}, nil)
			var rl *model.RateLimitError
			switch {
			case err == nil:
				admitted.Add(1)
			case errors.As(err, &rl):
				limited.Add(1)
			default:
				t.Errorf("purchase of %s: %v", u, err)
			}
		})
	}
	wg.Wait()
	// Each bucket refills at 1/s while the purchases run.
	allowed := int64(burst) + buckets*int64(time.Since(start)/time.Second+1)
	if n := admitted.Load(); n > allowed || n == 0 {
		t.Errorf("admitted %d of %d (%d rate limited); want 1 to %d: the campaign's burst of %d shared by its buckets",
			n, len(users), limited.Load(), allowed, burst)
	}
}

// TestRequestIDsIssued: the ids a purchase is answered with, admitted in
// Redis or decided in MySQL, fresh or replayed, are issued to the buyer
// under Options.Issuer's key, and to nobody else.
func TestRequestIDsIssued(t *testing.T) {
	issuer := requestid.NewIssuer([]byte("the deployment's secret, thirty-two bytes or more"))
	type buyer func(user, key string) (Admitted, error)
	tests := []struct {
		name   string
		newBuy func(t *testing.T) buyer
	}{
		{"redis", func(t *testing.T) buyer {
			svc, _, c := newAdmitService(t, newGatePublisher(false), Options{Issuer: issuer})
			return func(user, key string) (Admitted, error) {
				return svc.Purchase(t.Context(), Purchase{UserID: user, CampaignID: c.ID, Quantity: 1, IdempotencyKey: key}, nil)
			}
		}},
		{"degraded", func(t *testing.T) buyer {
			b := newDegraded(t, model.Campaign{}, Options{Degrade: true, Issuer: issuer})
			return func(user, key string) (Admitted, error) { return b.buy(t, user, key, 1) }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			buy := tt.newBuy(t)
			adm, err := buy("alice", "k")
			if err != nil {
				t.Fatalf("purchase: %v", err)
			}
			if !issuer.Issued(adm.RequestID, "alice") {
				t.Errorf("Issued(%s, alice): got false, want true", adm.RequestID)
			}
			if issuer.Issued(adm.RequestID, "bob") {
				t.Errorf("Issued(%s, bob): got true, want false", adm.RequestID)
			}
			again, err := buy("alice", "k")
			if err != nil || !again.Existing || again.RequestID != adm.RequestID {
				t.Fatalf("replay: got %+v, %v; want %s again", again, err, adm.RequestID)
			}
		})
	}
}
