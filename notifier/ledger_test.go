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

// fakeLedger is the orders in memory, failing with fail when it is set.
type fakeLedger struct {
	mu     sync.Mutex
	orders map[string]model.Order
	fail   error
}

func (l *fakeLedger) Order(_ context.Context, orderID string) (model.Order, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail != nil {
		return model.Order{}, l.fail
	}
	o, ok := l.orders[orderID]
	if !ok {
		return model.Order{}, fmt.Errorf("order %s: %w", orderID, model.ErrNotFound)
	}
	return o, nil
}

// ledgers are the Ledger implementations the poll's fallback must work
// with; store puts an order in one.
var ledgers = []struct {
	name string
	make func(t *testing.T, campaign string) (l Ledger, store func(t *testing.T, o model.Order))
}{
	{"fake", func(t *testing.T, _ string) (Ledger, func(*testing.T, model.Order)) {
		l := &fakeLedger{orders: map[string]model.Order{}}
		return l, func(_ *testing.T, o model.Order) { l.orders[o.ID] = o }
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
