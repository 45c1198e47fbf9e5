package gateway

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// faultyStock is the real store with faults: Admit runs admit.lua and then
// fails as if its reply was lost, and Withdraw fails without running.
type faultyStock struct {
	*store.Store
	loseAdmitReply, failWithdraw bool
}

func (f *faultyStock) Admit(ctx context.Context, campaignID string, batch []model.AdmitRequest, limits model.RateLimits) ([]model.AdmitReply, error) {
	out, err := f.Store.Admit(ctx, campaignID, batch, limits)
	if err == nil && f.loseAdmitReply {
		return nil, fmt.Errorf("admit: %w: %w: read tcp: connection reset by peer", model.ErrUnavailable, model.ErrMaybeNotEnqueued)
	}
	return out, err
}

func (f *faultyStock) Withdraw(ctx context.Context, batch []model.AdmitRequest) error {
	if f.failWithdraw {
		return errors.New("withdraw: dial tcp: connection refused")
	}
	return f.Store.Withdraw(ctx, batch)
}

// passQueue admits a request of another shopper in campaignID and decides
// it, as a worker does for the requests behind a lost one: the queue has
// moved past everything admitted before.
func passQueue(t *testing.T, st *store.Store, campaignID string) {
	t.Helper()
	// A sweep first, as the sweeper's runs between admissions: it marks
	// the line the closing request's decision passes (grace never over).
	if swept, err := st.SweepNotEnqueued(t.Context(), []string{campaignID}, time.Hour, 0); err != nil || len(swept) != 0 {
		t.Fatalf("marking sweep: got %+v, %v; want none", swept, err)
	}
	a := model.AdmitRequest{RequestID: model.FormatRequestID(campaignID, "c105e"), CampaignID: campaignID, UserID: "closing", Quantity: 1}
	if got, err := st.Admit(t.Context(), campaignID, []model.AdmitRequest{a}, model.RateLimits{}); err != nil || got[0].Code != model.Admitted {
		t.Fatalf("admit the closing request: got %+v, %v", got, err)
	}
	if _, err := st.Deduct(t.Context(), campaignID, []model.Deduction{{RequestID: a.RequestID, UserID: a.UserID, Quantity: 1, OrderID: "o-closing"}}); err != nil {
		t.Fatalf("decide the closing request: %v", err)
	}
}

// TestMaybeNotEnqueued: a purchase answered 503 whose admission was stored
// all the same, its answer lost (admit.lua's reply, or the withdraw after a
// failed publish), is counted maybe not enqueued and is in the admissions
// set, so the workers' not-enqueued sweep ends it rejected (not_enqueued),
// once the queue has moved past it, instead of queued for good; a retry
// with its Idempotency-Key then gets that final result. (A gateway that
// dies between admitting and publishing leaves the same: internal/store
// TestSweepNotEnqueued.)
func TestMaybeNotEnqueued(t *testing.T) {
	for _, tc := range []struct {
		name string
		fs   *faultyStock
		pub  queue.Publisher
	}{
		{"admit reply lost", &faultyStock{loseAdmitReply: true}, newGatePublisher(false)},
		{"withdraw failed", &faultyStock{failWithdraw: true}, &gatePublisher{entered: make(chan struct{}, 1024), fail: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, st, c := newAdmitServiceOn(t, tc.pub, Options{}, func(st *store.Store) Stock { tc.fs.Store = st; return tc.fs })
			p := Purchase{UserID: "u1", CampaignID: c.ID, IdempotencyKey: "k1", Quantity: 1}
			if _, err := svc.Purchase(t.Context(), p, nil); !errors.Is(err, model.ErrUnavailable) {
				t.Fatalf("purchase: got %v, want %v", err, model.ErrUnavailable)
			}
			stored, ok, err := st.IdempotentRequest(t.Context(), model.AdmitRequest{CampaignID: c.ID, Tag: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: "k1"})
			if err != nil || !ok || stored.Result.Status != model.StatusQueued {
				t.Fatalf("the admission left behind: got %+v, %v, %v; want a queued request", stored, ok, err)
			}
			if swept, err := st.SweepNotEnqueued(t.Context(), []string{c.ID}, 0, 0); err != nil || len(swept) != 0 {
				t.Fatalf("swept before the queue moved past it: got %+v, %v; want none", swept, err)
			}
			passQueue(t, st, c.ID)
			swept, err := st.SweepNotEnqueued(t.Context(), []string{c.ID}, 0, 0)
			if err != nil || len(swept) != 1 || swept[0].RequestID != stored.RequestID || swept[0].Status != model.StatusRejected || swept[0].Reason != model.ReasonNotEnqueued {
				t.Fatalf("swept %+v, %v; want %s rejected (%s)", swept, err, stored.RequestID, model.ReasonNotEnqueued)
			}
			if got := testutil.ToFloat64(svc.m.MaybeNotEnqueued); got != 1 {
				t.Errorf("flashsale_maybe_not_enqueued_total: got %v, want 1", got)
			}

			tc.fs.loseAdmitReply, tc.fs.failWithdraw = false, false
			again, err := svc.Purchase(t.Context(), p, nil)
			if err != nil || !again.Existing || again.RequestID != stored.RequestID || again.Result.Status != model.StatusRejected {
				t.Errorf("retry with the key: got %+v, %v; want %s, rejected", again, err, stored.RequestID)
			}
		})
	}
}
