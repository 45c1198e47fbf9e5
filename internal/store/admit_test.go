package store

import (
	"fmt"
	"sync"
	"testing"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// admitCall is one request of an Admit batch in a table; rid is a label.
type admitCall struct {
	rid, user, key, ip string
	want               AdmitCode
	wantRID            string // label of the request id Admit must return; "" = none
}

func TestAdmit(t *testing.T) {
	tests := []struct {
		name         string
		notLoaded    bool
		limits       RateLimits
		calls        []admitCall
		wantAccepted int64
	}{
		{
			name: "new requests are queued",
			calls: []admitCall{
				{rid: "r1", user: "u1", key: "k1", want: Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", want: Admitted, wantRID: "r2"},
			},
			wantAccepted: 2,
		},
		{
			name: "same key same user in one batch returns the first request",
			calls: []admitCall{
				{rid: "r1", user: "u1", key: "k1", want: Admitted, wantRID: "r1"},
				{rid: "r2", user: "u1", key: "k1", want: AdmitExisting, wantRID: "r1"},
				{rid: "r3", user: "u2", key: "k1", want: Admitted, wantRID: "r3"},
			},
			wantAccepted: 2,
		},
		{
			name: "same request id twice counts once",
			calls: []admitCall{
				{rid: "r1", user: "u1", key: "k1", want: Admitted, wantRID: "r1"},
				{rid: "r1", user: "u1", key: "k1", want: Admitted, wantRID: "r1"},
			},
			wantAccepted: 1,
		},
		{
			name:      "campaign not loaded",
			notLoaded: true,
			calls:     []admitCall{{rid: "r1", user: "u1", key: "k1", want: AdmitNotLoaded}},
		},
		{
			name:   "user over its burst is refused, others are not",
			limits: RateLimits{UserRate: 1, UserBurst: 2},
			calls: []admitCall{
				{rid: "r1", user: "u1", want: Admitted, wantRID: "r1"},
				{rid: "r2", user: "u1", want: Admitted, wantRID: "r2"},
				{rid: "r3", user: "u1", want: AdmitUserRateLimited},
				{rid: "r4", user: "u2", want: Admitted, wantRID: "r4"},
			},
			wantAccepted: 3,
		},
		{
			name:   "campaign over its burst is refused",
			limits: RateLimits{CampaignRate: 1, CampaignBurst: 2},
			calls: []admitCall{
				{rid: "r1", user: "u1", want: Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", want: Admitted, wantRID: "r2"},
				{rid: "r3", user: "u3", want: AdmitCampaignRateLimited},
			},
			wantAccepted: 2,
		},
		{
			name:   "client IP over its burst is refused across users",
			limits: RateLimits{IPRate: 1, IPBurst: 2, UserRate: 100, UserBurst: 100},
			calls: []admitCall{
				{rid: "r1", user: "u1", ip: "10.0.0.1", want: Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", ip: "10.0.0.1", want: Admitted, wantRID: "r2"},
				{rid: "r3", user: "u3", ip: "10.0.0.1", want: AdmitIPRateLimited},
				{rid: "r4", user: "u3", ip: "10.0.0.2", want: Admitted, wantRID: "r4"},
				{rid: "r5", user: "u4", want: Admitted, wantRID: "r5"}, // unknown IP: not limited
			},
			wantAccepted: 4,
		},
		{
			name:   "IP limit on, no request with a known IP",
			limits: RateLimits{IPRate: 1, IPBurst: 1},
			calls: []admitCall{
				{rid: "r1", user: "u1", want: Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", want: Admitted, wantRID: "r2"},
			},
			wantAccepted: 2,
		},
		{
			// An IP refusal must not use up the user's own allowance.
			name:   "IP refusal leaves the user limit alone",
			limits: RateLimits{IPRate: 1, IPBurst: 1, UserRate: 1, UserBurst: 1},
			calls: []admitCall{
				{rid: "r1", user: "u1", ip: "10.0.0.1", want: Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", ip: "10.0.0.1", want: AdmitIPRateLimited},
				{rid: "r3", user: "u2", ip: "10.0.0.2", want: Admitted, wantRID: "r3"},
			},
			wantAccepted: 2,
		},
		{
			// A user refused by its own limit must not use up the campaign's.
			name:   "user refusal leaves the campaign limit alone",
			limits: RateLimits{UserRate: 1, UserBurst: 1, CampaignRate: 1, CampaignBurst: 2},
			calls: []admitCall{
				{rid: "r1", user: "u1", want: Admitted, wantRID: "r1"},
				{rid: "r2", user: "u1", want: AdmitUserRateLimited},
				{rid: "r3", user: "u2", want: Admitted, wantRID: "r3"},
			},
			wantAccepted: 2,
		},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(10, 2)
				if !tt.notLoaded {
					mustPreload(t, s, c)
				}
				ids := newLabels(c.ID)
				batch := make([]Acceptance, len(tt.calls))
				for i, call := range tt.calls {
					batch[i] = Acceptance{RequestID: ids.rid(call.rid), CampaignID: c.ID, UserID: call.user, Quantity: 1, IdempotencyKey: call.key, ClientIP: call.ip}
				}
				got, err := s.Admit(t.Context(), c.ID, batch, tt.limits)
				if err != nil {
					t.Fatalf("Admit: %v", err)
				}
				for i, call := range tt.calls {
					wantRID := ""
					if call.wantRID != "" {
						wantRID = ids.rid(call.wantRID)
					}
					if got[i].Code != call.want || got[i].RequestID != wantRID {
						t.Errorf("request %d (%s): got code %d id %q, want code %d id %q", i, call.rid, got[i].Code, got[i].RequestID, call.want, wantRID)
					}
					limited := call.want == AdmitUserRateLimited || call.want == AdmitCampaignRateLimited || call.want == AdmitIPRateLimited
					if limited != (got[i].RetryAfter > 0) {
						t.Errorf("request %d (%s): got retry after %v, want it set only when rate limited", i, call.rid, got[i].RetryAfter)
					}
				}
				st := mustStats(t, s, c.ID)
				if st.Accepted != tt.wantAccepted || st.Queued() != tt.wantAccepted {
					t.Errorf("accepted/queued: got %d/%d, want %d/%d", st.Accepted, st.Queued(), tt.wantAccepted, tt.wantAccepted)
				}
				for i, call := range tt.calls {
					if call.want == Admitted {
						if r := mustResult(t, s, batch[i].RequestID); r.Status != model.StatusQueued || r.UserID != call.user {
							t.Errorf("Result(%s): got %s for %s, want queued for %s", call.rid, r.Status, r.UserID, call.user)
						}
					} else if call.want != AdmitExisting || call.rid != call.wantRID {
						mustNoResult(t, s, batch[i].RequestID)
					}
				}
			})
		}
	})
}

// TestAdmitIdempotencyRace: concurrent batches carrying one shopper's key
// under different request ids must agree on exactly one winner.
func TestAdmitIdempotencyRace(t *testing.T) {
	const goroutines, perBatch = 32, 8
	s := New(testenv.Redis(t))
	c := newCampaign(10, 1)
	mustPreload(t, s, c)
	var (
		mu       sync.Mutex
		admitted []string
		answers  = map[string]int{} // request id answered -> how many times
		wg       sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			batch := make([]Acceptance, perBatch)
			for i := range batch {
				batch[i] = Acceptance{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: "k1"}
			}
			got, err := s.Admit(t.Context(), c.ID, batch, RateLimits{})
			if err != nil {
				t.Errorf("Admit: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, a := range got {
				if a.Code == Admitted {
					admitted = append(admitted, batch[i].RequestID)
				}
				answers[a.RequestID]++
			}
		})
	}
	wg.Wait()
	if len(admitted) != 1 {
		t.Fatalf("got %d admitted requests, want exactly 1", len(admitted))
	}
	if len(answers) != 1 || answers[admitted[0]] != goroutines*perBatch {
		t.Errorf("answers: got %v, want every one of %d to name %s", answers, goroutines*perBatch, admitted[0])
	}
	if st := mustStats(t, s, c.ID); st.Accepted != 1 {
		t.Errorf("accepted: got %d, want 1", st.Accepted)
	}
}

func TestUnacceptBatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(10, 1)
		mustPreload(t, s, c)
		var batch []Acceptance
		for i := range 3 {
			batch = append(batch, Acceptance{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: fmt.Sprintf("u%d", i), Quantity: 1, IdempotencyKey: "k"})
		}
		if _, err := s.Admit(t.Context(), c.ID, batch, RateLimits{}); err != nil {
			t.Fatalf("Admit: %v", err)
		}
		// A request a worker already decided keeps its result.
		mustDeduct(t, s, c.ID, []Deduction{{RequestID: batch[0].RequestID, UserID: "u0", Quantity: 1, OrderID: "o1"}})
		if err := s.UnacceptBatch(t.Context(), batch); err != nil {
			t.Fatalf("UnacceptBatch: %v", err)
		}
		if r := mustResult(t, s, batch[0].RequestID); r.Status != model.StatusSuccess {
			t.Errorf("decided request: got %s, want %s", r.Status, model.StatusSuccess)
		}
		for _, a := range batch[1:] {
			mustNoResult(t, s, a.RequestID)
		}
		if st := mustStats(t, s, c.ID); st.Accepted != 1 || st.Queued() != 0 {
			t.Errorf("accepted/queued: got %d/%d, want 1/0", st.Accepted, st.Queued())
		}
	})
}
