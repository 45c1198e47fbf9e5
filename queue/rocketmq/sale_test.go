package rocketmq_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/worker"
)

// sale is one campaign on the test Redis and MariaDB, decided by real
// workers consuming through the driver: the setting in which "no double
// deduction, no lost request" means something.
type sale struct {
	st       *store.Store
	db       *sqlstore.DB
	campaign model.Campaign
	msgs     []queue.Message
	users    map[string]string // request id -> user
}

// newSale preloads a campaign with stock units (one per user) and admits
// one request from each of n users.
func newSale(t *testing.T, stock int64, n int) *sale {
	t.Helper()
	ctx := t.Context()
	s := &sale{st: store.New(testenv.Redis(t)), users: make(map[string]string)}
	db, err := sqlstore.Open(ctx, sqlstore.DriverMySQL, testenv.MySQLDSN(t))
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s.db = db
	s.campaign = model.Campaign{ID: testenv.UniqueName("rmq-"), Name: "rmq", Stock: stock, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
	if _, err := db.CreateCampaign(ctx, s.campaign); err != nil {
		t.Fatalf("create campaign: %v", err)
	}
	if s.campaign, err = reconcile.Load(ctx, db, s.st, s.campaign.ID); err != nil {
		t.Fatalf("load: %v", err)
	}
	for i := range n {
		id := uuid.Must(uuid.NewV7())
		rid := model.FormatRequestID(s.campaign.ID, fmt.Sprintf("%x", id[:]))
		user := fmt.Sprintf("user%04d", i)
		if got, err := s.st.Admit(ctx, s.campaign.ID, []model.AdmitRequest{{RequestID: rid, CampaignID: s.campaign.ID, UserID: user, Quantity: 1}}, model.RateLimits{}); err != nil || got[0].Code != model.Admitted {
			t.Fatalf("admit: got %+v, %v; want admitted", got, err)
		}
		body, err := model.EncodePurchaseRequest(model.PurchaseRequest{RequestID: rid, CampaignID: s.campaign.ID, UserID: user, Quantity: 1})
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		s.msgs = append(s.msgs, queue.Message{ID: rid, Key: s.campaign.ID, Body: body})
		s.users[rid] = user
	}
	return s
}

// runWorker runs a worker on c until the test ends (or the returned stop).
func (s *sale) runWorker(t *testing.T, c queue.Consumer, topic string, opts worker.Options) (stop func()) {
	t.Helper()
	w := worker.New(slog.New(slog.NewTextHandler(io.Discard, nil)), s.st, s.db, metrics.New(), opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, c, topic) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker: got %v, want nil", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("worker did not stop within 20s")
		}
	})
	t.Cleanup(stop)
	return stop
}

// results reads every request's stored result.
func (s *sale) results(t *testing.T) map[string]model.Result {
	t.Helper()
	out := make(map[string]model.Result, len(s.msgs))
	for _, m := range s.msgs {
		r, err := s.st.Result(t.Context(), m.ID)
		if err != nil {
			t.Fatalf("result of %s: %v", m.ID, err)
		}
		out[m.ID] = r
	}
	return out
}

func (s *sale) orders(t *testing.T) map[string]string {
	t.Helper()
	orders, err := s.db.CampaignOrders(t.Context(), s.campaign.ID)
	if err != nil {
		t.Fatalf("orders: %v", err)
	}
	out := make(map[string]string, len(orders))
	for _, o := range orders {
		if _, dup := out[o.RequestID]; dup {
			t.Errorf("request %s has two orders", o.RequestID)
		}
		out[o.RequestID] = o.ID
	}
	return out
}

// decided counts the requests with a final result.
func (s *sale) decided(t *testing.T) int {
	t.Helper()
	n := 0
	for _, r := range s.results(t) {
		if r.Status != model.StatusQueued {
			n++
		}
	}
	return n
}

// waitSettled waits until every request has a final result and every
// success its order in MySQL.
func (s *sale) waitSettled(t *testing.T, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "every request decided and persisted", func() (bool, string) {
		queued, successes := 0, 0
		for _, r := range s.results(t) {
			switch r.Status {
			case model.StatusQueued:
				queued++
			case model.StatusSuccess:
				successes++
			}
		}
		orders := len(s.orders(t))
		return queued == 0 && orders == successes, fmt.Sprintf("%d still queued, %d orders for %d successes", queued, orders, successes)
	})
}

// check verifies the sale's invariants: one final result per request,
// exactly the stock sold (no oversell, no undersell, nothing deducted
// twice), at most one unit per user, and MySQL holding exactly the
// successes, with the order ids the shoppers were told.
func (s *sale) check(t *testing.T) {
	t.Helper()
	results := s.results(t)
	successes := map[string]string{}
	perUser := map[string]int{}
	for rid, r := range results {
		switch r.Status {
		case model.StatusSuccess:
			successes[rid] = r.OrderID
			perUser[s.users[rid]]++
		case model.StatusSoldOut:
		default:
			t.Errorf("request %s: got status %q, want success or sold_out", rid, r.Status)
		}
	}
	if got := int64(len(successes)); got != s.campaign.Stock {
		t.Errorf("got %d successes, want exactly the stock %d", got, s.campaign.Stock)
	}
	for u, n := range perUser {
		if n > 1 {
			t.Errorf("user %s: got %d units, want at most 1", u, n)
		}
	}
	st, err := s.st.Stats(t.Context(), s.campaign.ID)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.Sold != s.campaign.Stock || st.Remaining != 0 {
		t.Errorf("redis: got sold %d remaining %d, want %d and 0", st.Sold, st.Remaining, s.campaign.Stock)
	}
	var finished int64
	for _, n := range st.FinishedByStatus {
		finished += n
	}
	if finished != int64(len(s.msgs)) {
		t.Errorf("redis: got %d finished results, want one per request (%d)", finished, len(s.msgs))
	}
	orders := s.orders(t)
	if len(orders) != len(successes) {
		t.Errorf("mysql: got %d orders, want %d", len(orders), len(successes))
	}
	for rid, oid := range orders {
		if successes[rid] != oid {
			t.Errorf("mysql: order %s for %s, but the shopper was told %q", oid, rid, successes[rid])
		}
	}
}

// TestConsumerKilledMidBatch kills a worker in the middle of a batch — after
// its Lua call deducted stock, before the orders reached MySQL and before the
// acknowledgement — by cutting its connections at the broker (what a killed
// process looks like to a broker). Another worker takes the queue over once
// the dead one's lock expires and finishes the sale: nothing is deducted
// twice, no request is lost, and the dead worker's batch reaches MySQL
// through the survivor. Then the "dead" worker wakes up and finishes its
// batch too, which must change nothing.
func TestConsumerKilledMidBatch(t *testing.T) {
	t.Parallel()
	const stock, requests = 40, 90
	s := newSale(t, stock, requests)
	srv := startDouble(t)
	topic := testenv.Topic(t)
	srv.CreateTopic(topic, testQueues)
	opts := testOptions(srv.Addr())
	pub := mustNew(t, opts)

	// The doomed worker reaches the broker only through its own port.
	port, err := srv.Listen()
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	doomedOpts := opts
	doomedOpts.NameServers = []string{port.Addr()}
	doomed := mustNew(t, doomedOpts)
	midBatch := make(chan []model.Result, 1)
	wake := make(chan struct{})
	var once sync.Once
	stopDoomed := s.runWorker(t, doomed.Consumer("doomed"), topic, worker.Options{
		AfterDeduct: func(_ string, results []model.Result) error {
			first := false
			once.Do(func() { first = true })
			if first {
				midBatch <- results
				<-wake // hung, like a process about to be killed
			}
			return nil
		},
	})
	wakeUp := sync.OnceFunc(func() { close(wake) })
	t.Cleanup(wakeUp)

	for i := 0; i < len(s.msgs); i += 10 {
		publish(t, pub, topic, s.msgs[i:min(i+10, len(s.msgs))]...)
	}
	var held []model.Result
	select {
	case held = <-midBatch:
	case <-time.After(20 * time.Second):
		t.Fatalf("the doomed worker got no batch within 20s")
	}
	if err := port.Close(); err != nil {
		t.Fatalf("cut the doomed worker off: %v", err)
	}
	killed := time.Now()

	survivor := mustNew(t, opts)
	s.runWorker(t, survivor.Consumer("survivor"), topic, worker.Options{})
	s.waitSettled(t, 30*time.Second)
	t.Logf("survivor settled the sale %v after the kill; the dead worker held %d requests", time.Since(killed), len(held))
	s.check(t)
	orders := s.orders(t)
	for _, r := range held {
		if r.Status == model.StatusSuccess && orders[r.RequestID] != r.OrderID {
			t.Errorf("request %s, mid-batch in the dead worker: got order %q in MySQL, want %q (the survivor must persist it)",
				r.RequestID, orders[r.RequestID], r.OrderID)
		}
	}

	// The zombie finishes its batch: orders already there, results the same.
	wakeUp()
	stopDoomed()
	s.check(t)
}

// TestBrokerRestartMidSale restarts the broker (state kept, as on its
// disk) while shoppers' requests are being published and consumed. A
// publish that fails is retried with the same request id, as a gateway's
// client would; the sale must still end with exactly the stock sold, one
// result per request and nothing lost. The library only gives up a pull
// that was held open across the restart after its 30 s timeout, so the
// sale may stall that long.
func TestBrokerRestartMidSale(t *testing.T) {
	t.Parallel()
	const stock, requests = 50, 150
	s := newSale(t, stock, requests)
	srv := startDouble(t)
	topic := testenv.Topic(t)
	srv.CreateTopic(topic, testQueues)
	opts := testOptions(srv.Addr())
	q := mustNew(t, opts)
	s.runWorker(t, q.Consumer("worker"), topic, worker.Options{})

	var failed int
	var restartAt time.Time
	restarted := make(chan error, 1)
	for i, m := range s.msgs {
		if i == requests/3 {
			// Restart once the worker is demonstrably in the middle of the
			// sale: some requests decided, more on the way.
			eventually(t, 20*time.Second, "the worker to decide the first requests", func() (bool, string) {
				n := s.decided(t)
				return n >= requests/6, fmt.Sprintf("%d decided", n)
			})
			restartAt = time.Now()
			go func() { restarted <- srv.Restart(true, 500*time.Millisecond) }()
		}
		for attempt := 1; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			err := q.Publish(ctx, topic, m)
			cancel()
			if err == nil {
				break
			}
			failed++
			if attempt == 100 {
				t.Fatalf("publish %s: still failing after %d attempts: %v", m.ID, attempt, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := <-restarted; err != nil {
		t.Fatalf("restart: %v", err)
	}
	if failed == 0 {
		t.Errorf("got no failed publish, want the restart to have hit the sale")
	}
	s.waitSettled(t, 60*time.Second)
	s.check(t)
	t.Logf("%d publishes failed and were retried; the sale settled %v after the restart", failed, time.Since(restartAt))
}
