package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
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
	"github.com/flashsale/flashsale/queue/memqueue"
)

type fixture struct {
	st       *store.Store
	db       *sqlstore.DB
	campaign model.Campaign
}

func newFixture(t *testing.T, stock, limit int64) *fixture {
	t.Helper()
	st := store.New(testenv.Redis(t))
	db, err := sqlstore.Open(t.Context(), sqlstore.DriverMySQL, testenv.MySQLDSN(t))
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	c := model.Campaign{ID: testenv.Name(t, "w-"), Name: "w", Stock: stock, PerUserLimit: limit,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
	if _, err := db.CreateCampaign(t.Context(), c); err != nil {
		t.Fatalf("create campaign: %v", err)
	}
	c, err = reconcile.Load(t.Context(), db, st, c.ID)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return &fixture{st: st, db: db, campaign: c}
}

// admit admits n requests from n users (user i%users) with the rate limits
// off and returns their messages.
func (f *fixture) admit(t *testing.T, n, users int) []queue.Message {
	t.Helper()
	msgs := make([]queue.Message, n)
	for i := range n {
		id := uuid.Must(uuid.NewV7())
		rid := model.FormatRequestID(f.campaign.ID, fmt.Sprintf("%x", id[:]))
		user := fmt.Sprintf("user%d", i%users)
		got, err := f.st.Admit(t.Context(), f.campaign.ID, []model.AdmitRequest{{RequestID: rid, CampaignID: f.campaign.ID, UserID: user, Quantity: 1}}, model.RateLimits{})
		if err != nil || got[0].Code != model.Admitted {
			t.Fatalf("admit: got %+v, %v; want admitted", got, err)
		}
		body, _ := model.EncodePurchaseRequest(model.PurchaseRequest{RequestID: rid, CampaignID: f.campaign.ID, UserID: user, Quantity: 1})
		msgs[i] = queue.Message{ID: rid, Key: f.campaign.ID, Body: body, Attempt: 1}
	}
	return msgs
}

// snapshot is everything a redelivery must leave unchanged.
type snapshot struct {
	results   map[string]model.Result
	orders    map[string]string // request id -> order id
	remaining int64
	sold      int64
}

func (f *fixture) snapshot(t *testing.T, msgs []queue.Message) snapshot {
	t.Helper()
	s := snapshot{results: map[string]model.Result{}, orders: map[string]string{}}
	for _, m := range msgs {
		r, err := f.st.Result(t.Context(), m.ID)
		if err != nil {
			t.Fatalf("result %s: %v", m.ID, err)
		}
		s.results[m.ID] = r
	}
	orders, err := f.db.CampaignOrders(t.Context(), f.campaign.ID)
	if err != nil {
		t.Fatalf("orders: %v", err)
	}
	for _, o := range orders {
		s.orders[o.RequestID] = o.ID
	}
	st, err := f.st.Stats(t.Context(), f.campaign.ID)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	s.remaining, s.sold = st.Remaining, st.Sold
	return s
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// crashOrders inserts, then reports failure: a worker that died after the
// insert but before the acknowledgement.
type crashOrders struct {
	Orders
	crashes atomic.Int32
}

func (c *crashOrders) InsertOrders(ctx context.Context, orders []model.Order, epochs model.Epochs) error {
	if err := c.Orders.InsertOrders(ctx, orders, epochs); err != nil {
		return err
	}
	if c.crashes.Add(-1) >= 0 {
		return errors.New("crash after insert")
	}
	return nil
}

// TestRedeliveryAfterCrash drives the worker through a real queue and makes
// it fail at the two delicate points; every redelivery must reproduce the
// same results and rows, never a second deduction.
func TestRedeliveryAfterCrash(t *testing.T) {
	tests := []struct {
		name         string
		failAfterLua int32 // deliveries that fail between the Lua call and MySQL
		failAfterSQL int32 // deliveries that fail between MySQL and the ack
	}{
		{name: "crash after Lua, before MySQL", failAfterLua: 3},
		{name: "crash after MySQL, before ack", failAfterSQL: 3},
		{name: "both", failAfterLua: 2, failAfterSQL: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 20, 1)
			msgs := f.admit(t, 60, 40) // 40 users, 20 of them twice; stock 20

			// Reference outcome: a crash-free run on an identical campaign is not
			// comparable (order ids differ), so compare a crashing run with its
			// own redeliveries instead, and check the invariants.
			var luaFails atomic.Int32
			luaFails.Store(tc.failAfterLua)
			checkReplay := replayChecker(t)
			orders := &crashOrders{Orders: f.db}
			orders.crashes.Store(tc.failAfterSQL)
			w := New(discard(), f.st, orders, metrics.New(), Options{
				PersistAttempts: 1,
				AfterDeduct: func(_ string, rs []model.Result) error {
					checkReplay(rs)
					if luaFails.Add(-1) >= 0 {
						return errors.New("crash after Lua")
					}
					return nil
				},
			})
			stop := runOnMemqueue(t, w, msgs, memqueue.Options{BatchSize: 16, RedeliveryDelay: 5 * time.Millisecond})
			waitSettled(t, f, len(msgs))
			stop()

			s := f.snapshot(t, msgs)
			checkSoldOut(t, s, 20)
			if luaFails.Load() >= 0 || orders.crashes.Load() >= 0 {
				t.Errorf("not every injected crash happened: lua %d, sql %d left", luaFails.Load(), orders.crashes.Load())
			}

			// One more full redelivery of everything: nothing may change.
			if err := queue.Serial(w.Decide)(t.Context(), msgs); err != nil {
				t.Fatalf("late redelivery: %v", err)
			}
			again := f.snapshot(t, msgs)
			if again.remaining != s.remaining || again.sold != s.sold || len(again.orders) != len(s.orders) {
				t.Errorf("late redelivery changed counts: before %d/%d/%d, after %d/%d/%d",
					s.remaining, s.sold, len(s.orders), again.remaining, again.sold, len(again.orders))
			}
			for rid, r := range s.results {
				if again.results[rid] != r {
					t.Errorf("late redelivery changed %s: %+v -> %+v", rid, r, again.results[rid])
				}
			}
		})
	}
}

// replayChecker returns a check that every result seen again for a request
// equals the first one seen: a redelivery never changes a decision.
func replayChecker(t *testing.T) func([]model.Result) {
	var first sync.Map
	return func(rs []model.Result) {
		for _, r := range rs {
			if prev, loaded := first.LoadOrStore(r.RequestID, r); loaded && prev.(model.Result) != r {
				t.Errorf("redelivery changed %s: first %+v, now %+v", r.RequestID, prev, r)
			}
		}
	}
}

// runOnMemqueue publishes msgs to a new in-memory queue and runs w on it
// until stop, which fails the test if Run does.
func runOnMemqueue(t *testing.T, w *Worker, msgs []queue.Message, opts memqueue.Options) (stop func()) {
	t.Helper()
	q := memqueue.New(opts)
	t.Cleanup(func() { _ = q.Close() })
	topic := testenv.Topic(t)
	if err := q.Publish(t.Context(), topic, msgs...); err != nil {
		t.Fatalf("publish: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, q.Consumer("w1"), topic) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("run: %v", err)
		}
	}
}

// checkSoldOut checks a settled campaign of stock units, limit 1 per user,
// that demand sold out: every result final, exactly stock successes, each
// with its order in MySQL, nothing left in Redis, nobody above the limit.
func checkSoldOut(t *testing.T, s snapshot, stock int) {
	t.Helper()
	successes := 0
	perUser := map[string]int{}
	for rid, r := range s.results {
		if !r.Status.Final() {
			t.Errorf("%s: status %s, want final", rid, r.Status)
		}
		if r.Status == model.StatusSuccess {
			successes++
			perUser[r.UserID]++
			if s.orders[rid] != r.OrderID {
				t.Errorf("%s: order in MySQL %q, result says %q", rid, s.orders[rid], r.OrderID)
			}
			if want := model.OrderIDOf(rid); r.OrderID != want {
				t.Errorf("%s: order id %q, want %q, derived from the request id", rid, r.OrderID, want)
			}
		}
	}
	if successes != stock || len(s.orders) != stock || s.remaining != 0 || s.sold != int64(stock) {
		t.Errorf("got successes %d, rows %d, remaining %d, sold %d; want %d, %d, 0, %d",
			successes, len(s.orders), s.remaining, s.sold, stock, stock, stock)
	}
	for u, n := range perUser {
		if n > 1 {
			t.Errorf("user %s bought %d, limit 1", u, n)
		}
	}
}

func waitSettled(t *testing.T, f *fixture, admitted int) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "the campaign settled", func() (bool, string) {
		st, err := f.st.Stats(t.Context(), f.campaign.ID)
		if err != nil {
			t.Fatalf("stats: %v", err)
		}
		if st.Queued() != 0 || st.Admitted != int64(admitted) {
			return false, fmt.Sprintf("%+v", st)
		}
		os, err := f.db.CampaignOrderStats(t.Context(), f.campaign.ID)
		return err == nil && os.Units == st.Sold, fmt.Sprintf("%+v, MySQL %+v (%v)", st, os, err)
	})
}

// failingStock fails every Deduct of a batch larger than one, and every
// Deduct of one poisoned request.
type failingStock struct {
	Stock
	poisoned string
}

func (f failingStock) Deduct(ctx context.Context, campaignID string, batch []model.Deduction) (model.DeductReply, error) {
	for _, d := range batch {
		if d.RequestID == f.poisoned {
			return model.DeductReply{}, errors.New("script error")
		}
	}
	return f.Stock.Deduct(ctx, campaignID, batch)
}

// TestPoisonMessageGetsFinalResult: a request that keeps failing is given a
// final rejected result after MaxAttempts, and the rest of its batch is decided
// normally, so one bad request cannot block a campaign.
func TestPoisonMessageGetsFinalResult(t *testing.T) {
	f := newFixture(t, 10, 1)
	msgs := f.admit(t, 4, 4)
	m := metrics.New()
	w := New(discard(), failingStock{Stock: f.st, poisoned: msgs[1].ID}, f.db, m, Options{MaxAttempts: 3})
	for attempt := 1; attempt <= 3; attempt++ {
		for i := range msgs {
			msgs[i].Attempt = attempt
		}
		if err := queue.Serial(w.Decide)(t.Context(), msgs); err == nil {
			t.Fatalf("attempt %d: got nil, want an error (redelivery) before MaxAttempts", attempt)
		}
	}
	for i := range msgs {
		msgs[i].Attempt = 4
	}
	if err := queue.Serial(w.Decide)(t.Context(), msgs); err != nil {
		t.Fatalf("after MaxAttempts: got %v, want nil (acknowledge)", err)
	}
	s := f.snapshot(t, msgs)
	for i, msg := range msgs {
		r := s.results[msg.ID]
		want := model.StatusSuccess
		if i == 1 {
			want = model.StatusRejected
		}
		if r.Status != want {
			t.Errorf("request %d: got %s, want %s", i, r.Status, want)
		}
	}
	if s.results[msgs[1].ID].Reason != model.ReasonPoison || len(s.orders) != 3 || s.remaining != 7 {
		t.Errorf("got reason %q, %d orders, remaining %d; want %q, 3, 7", s.results[msgs[1].ID].Reason, len(s.orders), s.remaining, model.ReasonPoison)
	}
}

// TestUndecodableMessageIsDropped: garbage on the queue is acknowledged (it
// can never succeed) and does not block the valid messages around it.
func TestUndecodableMessageIsDropped(t *testing.T) {
	f := newFixture(t, 10, 1)
	msgs := f.admit(t, 2, 2)
	batch := []queue.Message{msgs[0], {ID: "junk", Key: f.campaign.ID, Body: []byte("{not json"), Attempt: 1}, msgs[1]}
	w := New(discard(), f.st, f.db, metrics.New(), Options{})
	if err := queue.Serial(w.Decide)(t.Context(), batch); err != nil {
		t.Fatalf("handle: %v", err)
	}
	s := f.snapshot(t, msgs)
	if len(s.orders) != 2 {
		t.Fatalf("got %d orders, want 2", len(s.orders))
	}
}

// TestGroupKeepsArrivalOrder: a batch is split by campaign, each campaign's
// requests in arrival order and the campaigns in order of first arrival;
// undecodable messages are dropped.
func TestGroupKeepsArrivalOrder(t *testing.T) {
	w := New(discard(), nil, nil, metrics.New(), Options{})
	var msgs []queue.Message
	want := map[string][]string{}
	for i, c := range []string{"a", "a", "b", "a", "c", "b", "bad", "c", "a"} {
		rid := model.FormatRequestID(c, fmt.Sprintf("%032x", i))
		body, _ := model.EncodePurchaseRequest(model.PurchaseRequest{RequestID: rid, CampaignID: c, UserID: "u", Quantity: 1})
		if c == "bad" {
			body = []byte("{")
		} else {
			want[c] = append(want[c], rid)
		}
		msgs = append(msgs, queue.Message{ID: rid, Key: c, Body: body, Attempt: i + 1})
	}
	got := w.group(msgs)
	var order []string
	for _, b := range got {
		order = append(order, b.campaignID)
		var ids []string
		for i, r := range b.requests {
			ids = append(ids, r.RequestID)
			if want := msgs[indexOf(msgs, r.RequestID)].Attempt; b.attempts[i] != want {
				t.Errorf("%s: got attempt %d, want %d", r.RequestID, b.attempts[i], want)
			}
		}
		if fmt.Sprint(ids) != fmt.Sprint(want[b.campaignID]) {
			t.Errorf("campaign %s: got %v, want %v", b.campaignID, ids, want[b.campaignID])
		}
	}
	if fmt.Sprint(order) != "[a b c]" {
		t.Fatalf("got campaigns %v, want [a b c]", order)
	}
}

func indexOf(msgs []queue.Message, id string) int {
	for i, m := range msgs {
		if m.ID == id {
			return i
		}
	}
	return -1
}

// stallingOrders holds the first insert until a later batch has been
// deducted (overlapped records whether that happened within 10 s), and makes
// the first fail inserts report an error without inserting anything.
type stallingOrders struct {
	Orders
	laterDeducted chan struct{} // closed by the test when a second batch is deducted
	once          sync.Once
	overlapped    atomic.Bool
	fail          atomic.Int32
}

func (s *stallingOrders) InsertOrders(ctx context.Context, orders []model.Order, epochs model.Epochs) error {
	s.once.Do(func() {
		select {
		case <-s.laterDeducted:
			s.overlapped.Store(true)
		case <-time.After(10 * time.Second):
		}
	})
	if s.fail.Add(-1) >= 0 {
		return errors.New("MySQL unavailable")
	}
	return s.Orders.InsertOrders(ctx, orders, epochs)
}

// TestPipelinedRun: on a pipelining queue the worker deducts a campaign's
// next batch while the previous batch's orders are being inserted, and when
// that insert fails the redelivered batches keep their first results: every
// success ends in MySQL once, Redis and MySQL agree, nobody is over the limit.
func TestPipelinedRun(t *testing.T) {
	for _, failures := range []int32{0, 1} {
		t.Run(fmt.Sprintf("insert_failures=%d", failures), func(t *testing.T) {
			f := newFixture(t, 30, 1)
			msgs := f.admit(t, 64, 48) // 48 users, 16 of them twice; stock 30
			orders := &stallingOrders{Orders: f.db, laterDeducted: make(chan struct{})}
			orders.fail.Store(failures)
			checkReplay := replayChecker(t)
			var deductions atomic.Int32
			w := New(discard(), f.st, orders, metrics.New(), Options{
				PersistAttempts: 1,
				AfterDeduct: func(_ string, rs []model.Result) error {
					checkReplay(rs)
					if deductions.Add(1) == 2 {
						close(orders.laterDeducted)
					}
					return nil
				},
			})
			stop := runOnMemqueue(t, w, msgs, memqueue.Options{Partitions: 1, BatchSize: 16, RedeliveryDelay: 5 * time.Millisecond})
			waitSettled(t, f, len(msgs))
			stop()
			if !orders.overlapped.Load() {
				t.Errorf("no later batch was deducted before the first insert returned, want the next one deducted meanwhile")
			}

			checkSoldOut(t, f.snapshot(t, msgs), 30)
			if n := orders.fail.Load(); n >= 0 {
				t.Errorf("%d injected insert failures did not happen", n+1)
			}
		})
	}
}
