package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// recordingRestorer records what it is asked to restore.
type recordingRestorer struct {
	mu    sync.Mutex
	calls []string // campaign/trigger
}

func (r *recordingRestorer) Restore(_ context.Context, campaignID, trigger string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, campaignID+"/"+trigger)
	return true, nil
}

// TestHeldRestores: a batch held because Redis may have lost its campaign
// (not loaded; MySQL at a later epoch) asks the Restorer for it before the
// hold reaches the queue; other holds and failures do not.
func TestHeldRestores(t *testing.T) {
	req := model.PurchaseRequest{RequestID: model.FormatRequestID("c", "00112233445566778899aabbccddeeff"),
		CampaignID: "c", UserID: "u", Quantity: 1, AdmittedAt: time.Now()}
	body, err := model.EncodePurchaseRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []queue.Message{{ID: req.RequestID, Key: "c", Body: body, Attempt: 1}}
	tests := []struct {
		name           string
		deduct, insert error
		want           []string
	}{
		{name: "not loaded", deduct: fmt.Errorf("deduct: %w", model.ErrNotLoaded), want: []string{"c/deduct"}},
		{name: "ledger moved", insert: fmt.Errorf("insert: %w", model.ErrLedgerMoved), want: []string{"c/ledger_moved"}},
		{name: "paused", deduct: fmt.Errorf("deduct: %w", model.ErrPaused)},
		{name: "replicas behind", deduct: fmt.Errorf("deduct: %w", model.ErrUnavailable)},
		{name: "mysql fails", insert: errors.New("driver: bad connection")},
		{name: "redis fails", deduct: errors.New("ERR script error")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &recordingRestorer{}
			w := New(discard(), holdingStock{err: tc.deduct}, holdingOrders{err: tc.insert}, metrics.New(),
				Options{PersistAttempts: 1, PersistBackoff: time.Millisecond, Restorer: r})
			finish, err := w.Decide(t.Context(), msgs)
			if err == nil {
				err = finish(t.Context())
			}
			if err == nil {
				t.Fatal("got nil, want an error")
			}
			if !slices.Equal(r.calls, tc.want) {
				t.Errorf("restores: got %v, want %v", r.calls, tc.want)
			}
		})
	}
}
