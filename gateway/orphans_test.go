package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// faultyStock is the real store with faults: Admit runs admit.lua and then
// fails as if its reply was lost, Withdraw fails without running, and the
// first failRecords calls of AddUnknown fail (Redis still unreachable).
type faultyStock struct {
	*store.Store
	loseAdmitReply, failWithdraw bool
	failRecords                  atomic.Int32
}

func (f *faultyStock) Admit(ctx context.Context, campaignID string, batch []model.AdmitRequest, limits model.RateLimits) ([]model.AdmitReply, error) {
	out, err := f.Store.Admit(ctx, campaignID, batch, limits)
	if err == nil && f.loseAdmitReply {
		return nil, fmt.Errorf("admit: %w: %w: read tcp: connection reset by peer", model.ErrUnavailable, model.ErrMaybeApplied)
	}
	return out, err
}

func (f *faultyStock) Withdraw(ctx context.Context, batch []model.AdmitRequest) error {
	if f.failWithdraw {
		return errors.New("withdraw: dial tcp: connection refused")
	}
	return f.Store.Withdraw(ctx, batch)
}

func (f *faultyStock) AddUnknown(ctx context.Context, topic string, batch []model.AdmitRequest) error {
	if f.failRecords.Add(-1) >= 0 {
		return errors.New("record: dial tcp: connection refused")
	}
	return f.Store.AddUnknown(ctx, topic, batch)
}

// TestOrphanedAdmission: a purchase whose admission was stored but whose
// answer was lost (admit.lua's reply, or the withdraw after a failed
// publish) is answered 503 and recorded for the sweep, retried while Redis
// does not answer, so that it ends rejected (not_enqueued) instead of
// queued for good; a retry with its Idempotency-Key then gets that final
// result, and one with a new key buys.
func TestOrphanedAdmission(t *testing.T) {
	for _, tc := range []struct {
		name string
		fs   *faultyStock
		pub  *gatePublisher
	}{
		{"admit reply lost", &faultyStock{loseAdmitReply: true}, newGatePublisher(false)},
		{"withdraw failed", &faultyStock{failWithdraw: true}, &gatePublisher{entered: make(chan struct{}, 1024), fail: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fs.failRecords.Store(2)
			svc, st, c := newAdmitServiceOn(t, tc.pub, Options{}, func(st *store.Store) Stock { tc.fs.Store = st; return tc.fs })
			p := Purchase{UserID: "u1", CampaignID: c.ID, IdempotencyKey: "k1", Quantity: 1}
			if _, err := svc.Purchase(t.Context(), p, nil); !errors.Is(err, model.ErrUnavailable) {
				t.Fatalf("purchase: got %v, want %v", err, model.ErrUnavailable)
			}
			stored, ok, err := st.IdempotentRequest(t.Context(), model.AdmitRequest{CampaignID: c.ID, Tag: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: "k1"})
			if err != nil || !ok || stored.Result.Status != model.StatusQueued {
				t.Fatalf("the admission left behind: got %+v, %v, %v; want a queued request", stored, ok, err)
			}
			var swept []model.Result
			testenv.Eventually(t, 10*time.Second, "the request recorded for the sweep", func() (bool, string) {
				rs, err := st.SweepUnknown(t.Context(), svc.opts.Topic, 0)
				swept = append(swept, rs...)
				return len(swept) > 0, fmt.Sprint(len(swept), " swept, ", err)
			})
			if len(swept) != 1 || swept[0].RequestID != stored.RequestID || swept[0].Status != model.StatusRejected || swept[0].Reason != model.ReasonNotEnqueued {
				t.Fatalf("swept %+v, want %s rejected (%s)", swept, stored.RequestID, model.ReasonNotEnqueued)
			}
			if got := testutil.ToFloat64(svc.m.Orphans.WithLabelValues("recorded")); got != 1 {
				t.Errorf("flashsale_orphaned_admissions_total{recorded}: got %v, want 1", got)
			}

			tc.fs.loseAdmitReply, tc.fs.failWithdraw = false, false
			tc.pub.mu.Lock()
			tc.pub.fail = false
			tc.pub.mu.Unlock()
			again, err := svc.Purchase(t.Context(), p, nil)
			if err != nil || !again.Existing || again.RequestID != stored.RequestID || again.Result.Status != model.StatusRejected {
				t.Errorf("retry with the key: got %+v, %v; want %s, rejected", again, err, stored.RequestID)
			}
			p.IdempotencyKey = "k2"
			if adm, err := svc.Purchase(t.Context(), p, nil); err != nil || adm.Existing {
				t.Errorf("a new key: got %+v, %v; want admitted", adm, err)
			}
		})
	}
}

// TestUnknownPublishRecordRetried: a publish of unknown outcome is answered
// 202 and recorded for the sweep; when Redis does not take the record at
// first (the publish's master is failing over), it is retried until it
// does, so the request still ends rejected (not_enqueued) if its message
// was never stored.
func TestUnknownPublishRecordRetried(t *testing.T) {
	fs := &faultyStock{}
	fs.failRecords.Store(3)
	svc, st, c := newAdmitServiceOn(t, &unknownPublisher{}, Options{}, func(st *store.Store) Stock { fs.Store = st; return fs })
	adm, err := svc.Purchase(t.Context(), Purchase{UserID: "u1", CampaignID: c.ID, Quantity: 1}, nil)
	if err != nil || adm.Existing {
		t.Fatalf("purchase: got %+v, %v; want admitted (202)", adm, err)
	}
	var swept []model.Result
	testenv.Eventually(t, 10*time.Second, "the request recorded for the sweep", func() (bool, string) {
		rs, err := st.SweepUnknown(t.Context(), svc.opts.Topic, 0)
		swept = append(swept, rs...)
		return len(swept) > 0, fmt.Sprint(len(swept), " swept, ", err)
	})
	if len(swept) != 1 || swept[0].RequestID != adm.RequestID || swept[0].Reason != model.ReasonNotEnqueued {
		t.Fatalf("swept %+v, want %s rejected (%s)", swept, adm.RequestID, model.ReasonNotEnqueued)
	}
}
