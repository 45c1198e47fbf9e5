package store

import (
	"maps"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// TestRemaining reads the units left of loaded campaigns and leaves out one
// never loaded.
func TestRemaining(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		full, sold := newCampaign(t, 5, 5), newCampaign(t, 3, 3)
		mustLoad(t, s, full)
		mustLoad(t, s, sold)
		l := newLabels(sold.ID)
		mustDeduct(t, s, sold.ID, []model.Deduction{{RequestID: l.rid("r1"), UserID: "u", Quantity: 2, OrderID: "o1"}})
		never := newCampaign(t, 1, 1).ID

		got, err := s.Remaining(t.Context(), []string{full.ID, sold.ID, never})
		if err != nil {
			t.Fatalf("Remaining: %v", err)
		}
		if want := map[string]int64{full.ID: 5, sold.ID: 1}; !maps.Equal(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
}
