package store

import (
	"errors"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// acceptCall is one Accept in a table; rid is a label.
type acceptCall struct {
	rid, user, key string
	wantRID        string // label of the request id Accept must return
	wantExisting   bool
}

func TestAccept(t *testing.T) {
	tests := []struct {
		name         string
		calls        []acceptCall
		wantAccepted int64
		wantQueued   []string // labels with a queued result
		wantMissing  []string // labels without any result
	}{
		{
			name:         "new request is queued",
			calls:        []acceptCall{{rid: "r1", user: "u1", key: "k1", wantRID: "r1"}},
			wantAccepted: 1,
			wantQueued:   []string{"r1"},
		},
		{
			name: "same key same user returns the first request",
			calls: []acceptCall{
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r2", user: "u1", key: "k1", wantRID: "r1", wantExisting: true},
			},
			wantAccepted: 1,
			wantQueued:   []string{"r1"},
			wantMissing:  []string{"r2"},
		},
		{
			name: "same key different user is a new request",
			calls: []acceptCall{
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r2", user: "u2", key: "k1", wantRID: "r2"},
			},
			wantAccepted: 2,
			wantQueued:   []string{"r1", "r2"},
		},
		{
			name: "different keys same user are new requests",
			calls: []acceptCall{
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r2", user: "u1", key: "k2", wantRID: "r2"},
			},
			wantAccepted: 2,
			wantQueued:   []string{"r1", "r2"},
		},
		{
			name: "no key is never deduplicated",
			calls: []acceptCall{
				{rid: "r1", user: "u1", wantRID: "r1"},
				{rid: "r2", user: "u1", wantRID: "r2"},
			},
			wantAccepted: 2,
			wantQueued:   []string{"r1", "r2"},
		},
		{
			// go-redis retries a script whose reply was lost; the retry must not
			// count the request twice, or Queued never drains.
			name: "same request id accepted twice counts once",
			calls: []acceptCall{
				{rid: "r1", user: "u1", wantRID: "r1"},
				{rid: "r1", user: "u1", wantRID: "r1"},
			},
			wantAccepted: 1,
			wantQueued:   []string{"r1"},
		},
		{
			// The key already points at this very request: it is a retry, not a
			// duplicate, so the caller must still go on and publish it.
			name: "same request id and key accepted twice is not existing",
			calls: []acceptCall{
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r2", user: "u1", key: "k1", wantRID: "r1", wantExisting: true},
			},
			wantAccepted: 1,
			wantQueued:   []string{"r1"},
			wantMissing:  []string{"r2"},
		},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(10, 2)
				mustPreload(t, s, c)
				ids := newLabels(c.ID)
				for i, call := range tt.calls {
					rid, existing := mustAccept(t, s, Acceptance{
						RequestID: ids.rid(call.rid), CampaignID: c.ID, UserID: call.user, Quantity: 2, IdempotencyKey: call.key,
					})
					if rid != ids.rid(call.wantRID) || existing != call.wantExisting {
						t.Errorf("call %d: got (%s, %v), want (%s, %v)", i, rid, existing, ids.rid(call.wantRID), call.wantExisting)
					}
				}
				st := mustStats(t, s, c.ID)
				if st.Accepted != tt.wantAccepted || st.Queued() != tt.wantAccepted {
					t.Errorf("accepted/queued: got %d/%d, want %d/%d", st.Accepted, st.Queued(), tt.wantAccepted, tt.wantAccepted)
				}
				users := map[string]string{}
				for _, call := range tt.calls {
					if _, ok := users[call.rid]; !ok {
						users[call.rid] = call.user
					}
				}
				for _, l := range tt.wantQueued {
					want := model.Result{RequestID: ids.rid(l), CampaignID: c.ID, UserID: users[l], Status: model.StatusQueued, Quantity: 2}
					if got := mustResult(t, s, ids.rid(l)); got != want {
						t.Errorf("Result(%s): got %+v, want %+v", l, got, want)
					}
				}
				for _, l := range tt.wantMissing {
					mustNoResult(t, s, ids.rid(l))
				}
			})
		}
	})
}

func TestAcceptNotLoaded(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(10, 1) // never preloaded
		rid := newRequestID(c.ID)
		got, existing, err := s.Accept(t.Context(), Acceptance{RequestID: rid, CampaignID: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: "k1"})
		if !errors.Is(err, model.ErrNotLoaded) {
			t.Fatalf("Accept: got (%q, %v, %v), want error %v", got, existing, err, model.ErrNotLoaded)
		}
		k := campaignKeys(c.ID)
		n, err := s.Client().Exists(t.Context(), k.results, k.idem, k.counters, k.stock, k.meta).Result()
		if err != nil {
			t.Fatalf("EXISTS: %v", err)
		}
		if n != 0 {
			t.Errorf("keys written by a refused Accept: got %d, want 0", n)
		}
		mustNoResult(t, s, rid)
	})
}

func TestUnaccept(t *testing.T) {
	tests := []struct {
		name string
		key  string
		// decide runs Deduct on the request before Unaccept.
		decide bool
		// other unaccepts a different request id with the same key instead.
		other        bool
		times        int
		wantStatus   model.Status // "" = no result left
		wantAccepted int64
		wantQueued   int64
		// wantKeyKept: a new Accept with the same key returns the first request.
		wantKeyKept bool
	}{
		{name: "queued with key is removed", key: "k1", times: 1},
		{name: "queued without key is removed", times: 1},
		{name: "twice decrements once", key: "k1", times: 2},
		{
			name: "final result is kept", key: "k1", decide: true, times: 1,
			wantStatus: model.StatusSuccess, wantAccepted: 1, wantKeyKept: true,
		},
		{
			name: "another request's key entry is kept", key: "k1", other: true, times: 1,
			wantStatus: model.StatusQueued, wantAccepted: 1, wantQueued: 1, wantKeyKept: true,
		},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(10, 1)
				mustPreload(t, s, c)
				a := Acceptance{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: tt.key}
				mustAccept(t, s, a)
				if tt.decide {
					r := mustDeduct(t, s, c.ID, []Deduction{{RequestID: a.RequestID, UserID: a.UserID, Quantity: a.Quantity, OrderID: "o1"}})
					if r.Results[0].Status != model.StatusSuccess {
						t.Fatalf("Deduct: got %s, want %s", r.Results[0].Status, model.StatusSuccess)
					}
				}
				undo := a
				if tt.other {
					undo.RequestID = newRequestID(c.ID)
				}
				for range tt.times {
					mustUnaccept(t, s, undo)
				}

				if tt.wantStatus == "" {
					mustNoResult(t, s, a.RequestID)
				} else if got := mustResult(t, s, a.RequestID); got.Status != tt.wantStatus {
					t.Errorf("Result status: got %s, want %s", got.Status, tt.wantStatus)
				}
				st := mustStats(t, s, c.ID)
				if st.Accepted != tt.wantAccepted || st.Queued() != tt.wantQueued {
					t.Errorf("accepted/queued: got %d/%d, want %d/%d", st.Accepted, st.Queued(), tt.wantAccepted, tt.wantQueued)
				}
				if tt.key == "" {
					return
				}
				retry := Acceptance{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: a.UserID, Quantity: 1, IdempotencyKey: tt.key}
				rid, existing := mustAccept(t, s, retry)
				want, wantExisting := retry.RequestID, false
				if tt.wantKeyKept {
					want, wantExisting = a.RequestID, true
				}
				if rid != want || existing != wantExisting {
					t.Errorf("Accept with the same key after Unaccept: got (%s, %v), want (%s, %v)", rid, existing, want, wantExisting)
				}
			})
		}
	})
}
