package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// holdingStock decides every request a success under epoch 1, or fails
// with err when it is set.
type holdingStock struct {
	Stock
	err error
}

func (s holdingStock) Deduct(_ context.Context, _ string, batch []model.Deduction) (model.DeductReply, error) {
	if s.err != nil {
		return model.DeductReply{}, s.err
	}
	out := model.DeductReply{Epoch: 1}
	for _, d := range batch {
		out.Results = append(out.Results, model.Result{RequestID: d.RequestID, CampaignID: "c", UserID: d.UserID,
			Status: model.StatusSuccess, Quantity: d.Quantity, OrderID: d.OrderID})
	}
	return out, nil
}

func (holdingStock) PublishResults(context.Context, []model.Result) error { return nil }

// holdingOrders fails every insert with err.
type holdingOrders struct {
	Orders
	err error
}

func (o holdingOrders) Campaign(context.Context, string) (model.Campaign, error) {
	return model.Campaign{ID: "c", Price: 100, PaymentWindow: time.Minute}, nil
}

func (o holdingOrders) InsertOrders(context.Context, []model.Order, model.Epochs) error { return o.err }

// TestHeld: the store's and MySQL's holds reach the queue as queue.ErrHeld
// and are counted; any other failure is not a hold.
func TestHeld(t *testing.T) {
	msg := func() []queue.Message {
		req := model.PurchaseRequest{RequestID: model.FormatRequestID("c", "00112233445566778899aabbccddeeff"),
			CampaignID: "c", UserID: "u", Quantity: 1, AdmittedAt: time.Now()}
		body, err := model.EncodePurchaseRequest(req)
		if err != nil {
			t.Fatal(err)
		}
		return []queue.Message{{ID: req.RequestID, Key: "c", Body: body, Attempt: 1}}
	}
	tests := []struct {
		name           string
		deduct, insert error
		wantHeld       bool
	}{
		{name: "not loaded", deduct: fmt.Errorf("deduct: %w", model.ErrNotLoaded), wantHeld: true},
		{name: "paused", deduct: fmt.Errorf("deduct: %w", model.ErrPaused), wantHeld: true},
		{name: "replicas behind", deduct: fmt.Errorf("deduct: %w", model.ErrUnavailable), wantHeld: true},
		{name: "redis fails", deduct: errors.New("ERR script error"), wantHeld: false},
		{name: "ledger moved", insert: fmt.Errorf("insert: %w", model.ErrLedgerMoved), wantHeld: true},
		{name: "mysql fails", insert: errors.New("driver: bad connection"), wantHeld: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := metrics.New()
			w := New(discard(), holdingStock{err: tc.deduct}, holdingOrders{err: tc.insert}, m,
				Options{PersistAttempts: 1, PersistBackoff: time.Millisecond})
			finish, err := w.Decide(t.Context(), msg())
			if err == nil {
				err = finish(t.Context())
			}
			if err == nil {
				t.Fatal("got nil, want an error")
			}
			if got := errors.Is(err, queue.ErrHeld); got != tc.wantHeld {
				t.Errorf("errors.Is(%v, queue.ErrHeld): got %v, want %v", err, got, tc.wantHeld)
			}
			want := 0.0
			if tc.wantHeld {
				want = 1
			}
			if got := testutil.ToFloat64(m.HeldBatches); got != want {
				t.Errorf("held batches: got %v, want %v", got, want)
			}
		})
	}
}
