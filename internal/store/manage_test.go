package store

import (
	"errors"
	"maps"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// TestEndEarly: once a sale is ended early, every request not decided yet
// is rejected (ended_early), a paused sale's held ones included; decided
// ones keep their results; nothing more is sold; a load carries the flag.
func TestEndEarly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 5, 2)
		ids := newLabels(c.ID)
		if ok, err := s.EndEarly(t.Context(), c); err != nil || ok {
			t.Fatalf("EndEarly before a load: got %v, %v; want false, nil", ok, err)
		}
		mustLoad(t, s, c)
		first := mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: ids.rid("r1"), UserID: "alice", Quantity: 1, OrderID: "o1"}})
		if first.Results[0].Status != model.StatusSuccess {
			t.Fatalf("before the end: got %+v, want a success", first.Results[0])
		}
		c.Paused = true
		if ok, err := s.SetPaused(t.Context(), c); err != nil || !ok {
			t.Fatalf("SetPaused: got %v, %v", ok, err)
		}
		other := c
		other.Epoch++
		if ok, err := s.EndEarly(t.Context(), other); err != nil || ok {
			t.Fatalf("EndEarly under another epoch: got %v, %v; want false, nil", ok, err)
		}
		if _, err := s.Deduct(t.Context(), c.ID, []model.Deduction{{RequestID: ids.rid("r2"), UserID: "bob", Quantity: 1, OrderID: "o2"}}); !errors.Is(err, model.ErrPaused) {
			t.Fatalf("paused, not ended: got %v, want held", err)
		}
		c.EndedEarly = true
		if ok, err := s.EndEarly(t.Context(), c); err != nil || !ok {
			t.Fatalf("EndEarly: got %v, %v; want true, nil", ok, err)
		}
		r := mustDeduct(t, s, c.ID, []model.Deduction{
			{RequestID: ids.rid("r1"), UserID: "alice", Quantity: 1, OrderID: "o9"}, // decided before: stays
			{RequestID: ids.rid("r2"), UserID: "bob", Quantity: 1, OrderID: "o2"},
			{RequestID: ids.rid("r3"), UserID: "carol", Quantity: 2, OrderID: "o3"},
		})
		want := []struct {
			status model.Status
			reason string
		}{{model.StatusSuccess, ""}, {model.StatusRejected, model.ReasonEndedEarly}, {model.StatusRejected, model.ReasonEndedEarly}}
		for i, w := range want {
			if got := r.Results[i]; got.Status != w.status || got.Reason != w.reason {
				t.Errorf("request %d: got %s %q, want %s %q", i, got.Status, got.Reason, w.status, w.reason)
			}
		}
		if st := mustStats(t, s, c.ID); st.Remaining != 4 || st.Sold != 1 || st.Queued() != 0 {
			t.Fatalf("stats after the end: got %+v, want 4 remaining, 1 sold, none queued", st)
		}
		// A load from MySQL (which has the flag) keeps refusing.
		c.Epoch++
		mustLoad(t, s, c)
		r = mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: ids.rid("r4"), UserID: "dave", Quantity: 1, OrderID: "o4"}})
		if r.Results[0].Reason != model.ReasonEndedEarly {
			t.Fatalf("after a load: got %+v, want rejected ended_early", r.Results[0])
		}
	})
}

// TestRemove: every key of the campaign goes, unless a request was
// admitted since the caller looked; other campaigns keep theirs.
func TestRemove(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c, other := newCampaign(t, 5, 1), newCampaign(t, 5, 1)
		mustLoad(t, s, c)
		mustLoad(t, s, other)
		ids := newLabels(c.ID)
		mustAdmit(t, s, model.AdmitRequest{RequestID: ids.rid("r1"), CampaignID: c.ID, UserID: "alice", Quantity: 1, IdempotencyKey: "k1", ClientIP: "192.0.2.1"})
		mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: ids.rid("r1"), UserID: "alice", Quantity: 1, OrderID: "o1"}})
		before := campaignState(t, s, c.ID)
		if n, err := s.Remove(t.Context(), c.ID, 0); !errors.Is(err, model.ErrConflict) || n != 0 {
			t.Fatalf("Remove with a stale admitted count: got %d, %v; want 0, conflict", n, err)
		}
		if after := campaignState(t, s, c.ID); !maps.Equal(before, after) {
			t.Fatalf("refused Remove changed %v into %v", before, after)
		}
		otherBefore := campaignState(t, s, other.ID)
		if n, err := s.Remove(t.Context(), c.ID, 1); err != nil || n < 5 {
			t.Fatalf("Remove: got %d, %v; want the campaign's keys", n, err)
		}
		if keys, err := s.rdb.Keys(t.Context(), "fs:{"+c.ID+"}*").Result(); err != nil || len(keys) != 0 {
			t.Fatalf("keys left: got %v, %v; want none", keys, err)
		}
		if got := campaignState(t, s, other.ID); !maps.Equal(got, otherBefore) {
			t.Fatalf("another campaign changed: %v into %v", otherBefore, got)
		}
		if n, err := s.Remove(t.Context(), c.ID, 0); err != nil || n != 0 {
			t.Fatalf("Remove again: got %d, %v; want 0, nil", n, err)
		}
		left, err := s.Remaining(t.Context(), []string{c.ID, other.ID})
		if err != nil || len(left) != 1 || left[other.ID] != 5 {
			t.Fatalf("Remaining: got %v, %v; want only %s with 5", left, err, other.ID)
		}
	})
}
