package store

import (
	"errors"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// TestMarkDurable: a success decided by deduct.lua reads as queued, with no
// order id, in every reader a shopper sees (Result, Results, an
// Idempotency-Key's replay by admit.lua and by IdempotentRequest) until
// the durable mark reaches its decision number, and as the success after.
func TestMarkDurable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 10, 5)
		mustLoad(t, s, c)
		first := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 2, IdempotencyKey: "k1"}
		mustAdmit(t, s, first)
		second := model.Deduction{RequestID: newRequestID(c.ID), UserID: "u2", Quantity: 1, OrderID: "o2"}
		r1, err := s.Deduct(t.Context(), c.ID, []model.Deduction{{RequestID: first.RequestID, UserID: "u1", Quantity: 2, OrderID: "o1"}})
		if err != nil || r1.Made != 1 || r1.Results[0].Status != model.StatusSuccess || r1.Results[0].Reason != "" {
			t.Fatalf("Deduct: got %+v, %v; want a success numbered 1", r1, err)
		}
		r2, err := s.Deduct(t.Context(), c.ID, []model.Deduction{second})
		if err != nil || r2.Made != 2 {
			t.Fatalf("Deduct: got %+v, %v; want a success numbered 2", r2, err)
		}
		queued := model.Result{RequestID: first.RequestID, CampaignID: c.ID, UserID: "u1", Status: model.StatusQueued, Quantity: 2}
		success := r1.Results[0]
		replay := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 2, IdempotencyKey: "k1"}
		check := func(want model.Result) {
			t.Helper()
			if got := mustResult(t, s, first.RequestID); got != want {
				t.Errorf("Result: got %+v, want %+v", got, want)
			}
			rs, err := s.Results(t.Context(), []string{first.RequestID})
			if err != nil || len(rs) != 1 || rs[0] != want {
				t.Errorf("Results: got %+v, %v; want [%+v]", rs, err, want)
			}
			got, err := s.Admit(t.Context(), c.ID, []model.AdmitRequest{replay}, model.RateLimits{})
			if err != nil || len(got) != 1 || got[0].Code != model.AdmitExisting || got[0].Result != want {
				t.Errorf("Admit's replay: got %+v, %v; want %+v", got, err, want)
			}
			idem, ok, err := s.IdempotentRequest(t.Context(), replay)
			if err != nil || !ok || idem.Result != want {
				t.Errorf("IdempotentRequest: got %+v, %v, %v; want %+v", idem, ok, err, want)
			}
		}
		check(queued)

		if err := s.MarkDurable(t.Context(), c.ID, r2.Made, r2.Epoch); err != nil {
			t.Fatalf("MarkDurable(2): %v", err)
		}
		check(success)
		// The mark never goes down: a redelivered earlier batch leaves it.
		if err := s.MarkDurable(t.Context(), c.ID, r1.Made, r1.Epoch); err != nil {
			t.Fatalf("MarkDurable(1): %v", err)
		}
		if got := mustResult(t, s, second.RequestID); got.Status != model.StatusSuccess || got.OrderID != "o2" {
			t.Errorf("after a lower mark: got %+v, want the success o2", got)
		}
		// A redelivery replays the decision number.
		again, err := s.Deduct(t.Context(), c.ID, []model.Deduction{second})
		if err != nil || again.Made != 2 || again.Results[0] != r2.Results[0] {
			t.Errorf("redelivery: got %+v, %v; want %+v numbered 2", again, err, r2.Results[0])
		}
	})
}

// TestMarkDurableEpoch: a mark of a batch decided before a load is refused
// (model.ErrLedgerMoved) and changes nothing, so it cannot uncover the new
// load's successes; the successes a load restores from orders are durable
// without a mark; a tag Redis lost is model.ErrNotLoaded.
func TestMarkDurableEpoch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 10, 5)
		mustLoad(t, s, c)
		rid := newRequestID(c.ID)
		old := model.Deduction{RequestID: rid, UserID: "u1", Quantity: 1, OrderID: model.OrderIDOf(rid)}
		before, err := s.Deduct(t.Context(), c.ID, []model.Deduction{old, {RequestID: newRequestID(c.ID), UserID: "u2", Quantity: 1, OrderID: "o2"}})
		if err != nil || before.Made != 1 || before.Results[1].Status != model.StatusSuccess {
			t.Fatalf("Deduct: got %+v, %v; want two successes numbered 1", before, err)
		}
		// The load finds the first order stored; the second was not.
		c.Epoch++
		mustRebuild(t, s, c, []model.Order{{ID: old.OrderID, RequestID: old.RequestID, CampaignID: c.ID, UserID: "u1",
			Quantity: 1, Status: model.OrderPendingPayment}})
		if got := mustResult(t, s, old.RequestID); got.Status != model.StatusSuccess || got.OrderID != old.OrderID {
			t.Errorf("restored by the load: got %+v, want the success", got)
		}
		fresh := model.Deduction{RequestID: newRequestID(c.ID), UserID: "u3", Quantity: 1, OrderID: "o3"}
		// Numbered 1 again: the load reset the counters, so the old mark
		// would uncover it.
		if r := mustDeductOnly(t, s, c.ID, fresh); r.Made != 1 {
			t.Fatalf("Deduct after the load: got %+v, want a success numbered 1", r)
		}
		if err := s.MarkDurable(t.Context(), c.ID, before.Made, before.Epoch); !errors.Is(err, model.ErrLedgerMoved) {
			t.Errorf("MarkDurable of the old epoch: got %v, want %v", err, model.ErrLedgerMoved)
		}
		if got := mustResult(t, s, fresh.RequestID); got.Status != model.StatusQueued {
			t.Errorf("the new load's success after an old mark: got %s, want queued", got.Status)
		}

		lost := newCampaign(t, 10, 5)
		if err := s.MarkDurable(t.Context(), lost.ID, 1, lost.Epoch); !errors.Is(err, model.ErrNotLoaded) {
			t.Errorf("MarkDurable of a tag not loaded: got %v, want %v", err, model.ErrNotLoaded)
		}
	})
}

// mustDeductOnly decides d without raising the durable mark.
func mustDeductOnly(t *testing.T, s *Store, tag string, d model.Deduction) model.DeductReply {
	t.Helper()
	r, err := s.Deduct(t.Context(), tag, []model.Deduction{d})
	if err != nil || r.Results[0].Status != model.StatusSuccess {
		t.Fatalf("Deduct(%s): got %+v, %v; want a success", d.RequestID, r, err)
	}
	return r
}
