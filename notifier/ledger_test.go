package notifier

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

var _ Ledger = (*fakeLedger)(nil)

// fakeLedger is what MySQL holds as decided, in memory: orders (each its
// request's success) and refusals decided in MySQL. It fails with fail
// when that is set, and counts its reads.
type fakeLedger struct {
	mu       sync.Mutex
	orders   map[string]model.Order
	refusals map[string]model.Result
	fail     error
	reads    int
}

func newFakeLedger() *fakeLedger {
	return &fakeLedger{orders: map[string]model.Order{}, refusals: map[string]model.Result{}}
}

func (l *fakeLedger) Decided(_ context.Context, requestIDs []string) (map[string]model.Result, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reads++
	if l.fail != nil {
		return nil, fmt.Errorf("decided: %w", l.fail)
	}
	out := map[string]model.Result{}
	for _, id := range requestIDs {
		if o, ok := l.orders[model.OrderIDOf(id)]; ok && o.RequestID == id {
			out[id] = model.Result{RequestID: id, CampaignID: o.CampaignID, UserID: o.UserID, Status: model.StatusSuccess,
				Quantity: o.Quantity, OrderID: o.ID}
		} else if r, ok := l.refusals[id]; ok {
			out[id] = r
		}
	}
	return out, nil
}

// order stores o, as a success decided in Redis and stored, or decided in
// MySQL.
func (l *fakeLedger) order(o model.Order) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.orders[o.ID] = o
}

// refuse stores the refusal r, decided in MySQL.
func (l *fakeLedger) refuse(r model.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refusals[r.RequestID] = r
}

func (l *fakeLedger) setFail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fail = err
}

// readCount returns how many times Decided was called.
func (l *fakeLedger) readCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reads
}

// ledgers are the Ledger implementations the poll's fallback must work
// with; store puts an order in one.
var ledgers = []struct {
	name string
	make func(t *testing.T, campaign string) (l Ledger, store func(t *testing.T, o model.Order))
}{
	{"fake", func(t *testing.T, _ string) (Ledger, func(*testing.T, model.Order)) {
		l := newFakeLedger()
		return l, func(_ *testing.T, o model.Order) { l.order(o) }
	}},
	{"mysql", func(t *testing.T, campaign string) (Ledger, func(*testing.T, model.Order)) {
		db, err := sqlstore.Open(mustContext(t), sqlstore.DriverMySQL, testenv.MySQLDSN(t))
		if err != nil {
			t.Fatalf("open MySQL: %v", err)
		}
		t.Cleanup(func() { _ = db.Close() })
		c, err := db.CreateCampaign(mustContext(t), model.Campaign{ID: campaign, Name: "ledger test", Stock: 10, PerUserLimit: 10,
			StartAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatalf("create campaign: %v", err)
		}
		return db, func(t *testing.T, o model.Order) {
			if err := db.InsertOrders(mustContext(t), []model.Order{o}, model.Epochs{c.ID: c.Epoch}); err != nil {
				t.Fatalf("insert order: %v", err)
			}
		}
	}},
}

// TestPollLedger: a poll for a request Redis has no result for (it lost
// it) answers the success of its order in MySQL, to its user only; without
// an order it is not found, and a ledger that cannot answer is unavailable.
func TestPollLedger(t *testing.T) {
	t.Parallel()
	for _, impl := range ledgers {
		t.Run(impl.name, func(t *testing.T) {
			e := redisEnv(t)
			ledger, store := impl.make(t, e.campaign)
			h := newHarness(t, e.src, Options{Ledger: ledger})
			lost := newRequestID(t, e.campaign) // decided and stored, then lost by Redis
			store(t, model.Order{ID: model.OrderIDOf(lost), RequestID: lost, CampaignID: e.campaign, UserID: "alice",
				Quantity: 2, Status: model.OrderPendingPayment})
			queued := e.newRequest(t, "alice")
			tests := []struct {
				name       string
				user       string
				requestID  string
				wantStatus int
				wantBody   map[string]any
				wantCode   string
			}{
				{name: "owner", user: "alice", requestID: lost, wantStatus: http.StatusOK,
					wantBody: map[string]any{"request_id": lost, "campaign_id": e.campaign, "status": "success", "quantity": 2.0, "order_id": model.OrderIDOf(lost)}},
				{name: "other user", user: "bob", requestID: lost, wantStatus: http.StatusNotFound, wantCode: "not_found"},
				{name: "no order", user: "alice", requestID: newRequestID(t, e.campaign), wantStatus: http.StatusNotFound, wantCode: "not_found"},
				{name: "known to Redis", user: "alice", requestID: queued, wantStatus: http.StatusOK,
					wantBody: map[string]any{"request_id": queued, "campaign_id": e.campaign, "status": "queued", "quantity": 1.0, "ahead": 0.0, "eta_ms": 0.0}},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					status, body := mustGet(t, h, tt.user, "/api/v1/purchases/"+tt.requestID)
					checkAnswer(t, status, body, tt.wantStatus, tt.wantBody, tt.wantCode)
				})
			}
		})
	}
}

// TestPollLedgerDown: a ledger that cannot answer makes the poll
// unavailable (503), not unknown: the request may have succeeded.
func TestPollLedgerDown(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{Ledger: &fakeLedger{fail: errors.New("connection refused")}})
	status, body := mustGet(t, h, "alice", "/api/v1/purchases/"+newRequestID(t, e.campaign))
	if status != http.StatusServiceUnavailable || body["code"] != "unavailable" {
		t.Errorf("got %d %v, want %d unavailable", status, body["code"], http.StatusServiceUnavailable)
	}
}
