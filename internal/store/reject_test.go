package store

import (
	"testing"

	"github.com/flashsale/flashsale/model"
)

func TestReject(t *testing.T) {
	tests := []struct {
		name       string
		prior      func(t *testing.T, s *Store, c model.Campaign, d model.Deduction)
		wantStatus model.Status
		wantReason string
		wantFinRej int64
	}{
		{
			name: "queued request becomes rejected",
			prior: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) {
				mustAdmit(t, s, model.AdmitRequest{RequestID: d.RequestID, CampaignID: c.ID, UserID: d.UserID, Quantity: d.Quantity})
			},
			wantStatus: model.StatusRejected, wantReason: model.ReasonPoison, wantFinRej: 1,
		},
		{
			name:       "unknown request becomes rejected",
			prior:      func(*testing.T, *Store, model.Campaign, model.Deduction) {},
			wantStatus: model.StatusRejected, wantReason: model.ReasonPoison, wantFinRej: 1,
		},
		{
			name: "a success stands",
			prior: func(t *testing.T, s *Store, c model.Campaign, d model.Deduction) {
				mustDeduct(t, s, c.ID, []model.Deduction{d})
			},
			wantStatus: model.StatusSuccess, wantFinRej: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, s *Store) {
				c := newCampaign(t, 5, 1)
				mustLoad(t, s, c)
				d := model.Deduction{RequestID: newRequestID(c.ID), UserID: "u1", Quantity: 1, OrderID: "o1"}
				tc.prior(t, s, c, d)
				for range 2 { // idempotent: the second call changes nothing
					got, err := s.Reject(t.Context(), d, c.ID, model.ReasonPoison)
					if err != nil {
						t.Fatalf("Reject: %v", err)
					}
					if got.Status != tc.wantStatus || got.Reason != tc.wantReason {
						t.Fatalf("got %s/%q, want %s/%q", got.Status, got.Reason, tc.wantStatus, tc.wantReason)
					}
				}
				if r := mustResult(t, s, d.RequestID); r.Status != tc.wantStatus {
					t.Fatalf("stored: got %s, want %s", r.Status, tc.wantStatus)
				}
				if got := mustStats(t, s, c.ID).FinishedByStatus[model.StatusRejected]; got != tc.wantFinRej {
					t.Fatalf("fin:rejected: got %d, want %d", got, tc.wantFinRej)
				}
			})
		})
	}
}

func TestDeductRejectsBadQuantity(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 5, 10)
		mustLoad(t, s, c)
		reply := mustDeduct(t, s, c.ID, []model.Deduction{
			{RequestID: newRequestID(c.ID), UserID: "u1", Quantity: 0, OrderID: "o1"},
			{RequestID: newRequestID(c.ID), UserID: "u1", Quantity: -2, OrderID: "o2"},
		})
		for i, r := range reply.Results {
			if r.Status != model.StatusRejected || r.Reason != model.ReasonBadMessage {
				t.Errorf("request %d: got %s/%q, want rejected/%s", i, r.Status, r.Reason, model.ReasonBadMessage)
			}
		}
		if st := mustStats(t, s, c.ID); st.Remaining != 5 || st.Sold != 0 {
			t.Fatalf("got remaining %d sold %d, want 5 and 0", st.Remaining, st.Sold)
		}
	})
}
