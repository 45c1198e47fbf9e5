package sqlstore

import (
	"slices"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

// TestOpenCampaignIDs lists the campaigns whose window holds the instant
// given: not those that ended or have not started, the start included and
// the end excluded.
func TestOpenCampaignIDs(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			at := time.Now().UTC().Truncate(time.Second)
			windows := []struct {
				id         string
				start, end time.Time
			}{
				{"running", at.Add(-time.Hour), at.Add(time.Hour)},
				{"starts-now", at, at.Add(time.Hour)},
				{"ends-now", at.Add(-time.Hour), at},
				{"ended", at.Add(-2 * time.Hour), at.Add(-time.Hour)},
				{"upcoming", at.Add(time.Hour), at.Add(2 * time.Hour)},
			}
			for _, w := range windows {
				if _, err := db.CreateCampaign(t.Context(), model.Campaign{ID: w.id, Name: w.id, Stock: 1, PerUserLimit: 1,
					StartAt: w.start, EndAt: w.end}); err != nil {
					t.Fatalf("create %s: %v", w.id, err)
				}
			}
			got, err := db.OpenCampaignIDs(t.Context(), at)
			if err != nil {
				t.Fatalf("OpenCampaignIDs: %v", err)
			}
			if want := []string{"running", "starts-now"}; !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}
