package store

import (
	"errors"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

func TestPreloadFresh(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(7, 2)
		got, err := s.Preload(t.Context(), c, c.StartAt.Add(-time.Minute), false)
		if err != nil || got != model.PreloadLoaded {
			t.Fatalf("Preload: got (%q, %v), want (%q, nil)", got, err, model.PreloadLoaded)
		}
		st := mustStats(t, s, c.ID)
		want := model.Stats{Loaded: true, Stock: 7, Remaining: 7, FinishedByStatus: finished(nil)}
		if !reflect.DeepEqual(st, want) {
			t.Errorf("Stats: got %+v, want %+v", st, want)
		}
		meta := mustMeta(t, s, c.ID)
		wantMeta := map[string]string{
			"stock": "7", "limit": "2",
			"start_ms": formatMs(c.StartAt), "end_ms": formatMs(c.EndAt),
		}
		if !reflect.DeepEqual(meta, wantMeta) {
			t.Errorf("meta: got %v, want %v", meta, wantMeta)
		}
	})
}

// TestPreloadAgain preloads a campaign, sells its only unit (with an
// idempotency key, so every key is populated), then preloads again.
func TestPreloadAgain(t *testing.T) {
	tests := []struct {
		name      string
		change    func(c *model.Campaign)
		afterNow  time.Duration // now relative to the stored start
		force     bool
		want      model.PreloadOutcome
		wantErr   error
		wantReset bool
	}{
		{name: "same values before start", afterNow: -time.Minute, want: model.PreloadUnchanged},
		{name: "same values after start", afterNow: time.Minute, want: model.PreloadUnchanged},
		{name: "same values after start with force", afterNow: time.Minute, force: true, want: model.PreloadUnchanged},
		{name: "other stock before start", change: func(c *model.Campaign) { c.Stock = 5 }, afterNow: -time.Minute, want: model.PreloadLoaded, wantReset: true},
		{name: "other limit before start", change: func(c *model.Campaign) { c.PerUserLimit = 3 }, afterNow: -time.Minute, want: model.PreloadLoaded, wantReset: true},
		{name: "other start before start", change: func(c *model.Campaign) { c.StartAt = c.StartAt.Add(time.Hour) }, afterNow: -time.Minute, want: model.PreloadLoaded, wantReset: true},
		{name: "other end before start", change: func(c *model.Campaign) { c.EndAt = c.EndAt.Add(time.Hour) }, afterNow: -time.Minute, want: model.PreloadLoaded, wantReset: true},
		{name: "other stock after start", change: func(c *model.Campaign) { c.Stock = 5 }, afterNow: time.Minute, wantErr: model.ErrSaleStarted},
		{name: "other stock at start", change: func(c *model.Campaign) { c.Stock = 5 }, afterNow: 0, wantErr: model.ErrSaleStarted},
		{name: "other start after start", change: func(c *model.Campaign) { c.StartAt = c.StartAt.Add(time.Hour) }, afterNow: time.Minute, wantErr: model.ErrSaleStarted},
		{name: "other stock after start with force", change: func(c *model.Campaign) { c.Stock = 5 }, afterNow: time.Minute, force: true, want: model.PreloadLoaded, wantReset: true},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(1, 1)
				mustPreload(t, s, c)
				a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: "k1"}
				mustAdmit(t, s, a)
				mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: a.RequestID, UserID: "u1", Quantity: 1, OrderID: "o1"}})
				before, beforeMeta := mustStats(t, s, c.ID), mustMeta(t, s, c.ID)
				if !before.SoldOut || before.Sold != 1 {
					t.Fatalf("setup: got %+v, want sold out with 1 sold", before)
				}

				next := c
				if tt.change != nil {
					tt.change(&next)
				}
				got, err := s.Preload(t.Context(), next, c.StartAt.Add(tt.afterNow), tt.force)
				if tt.wantErr != nil {
					if !errors.Is(err, tt.wantErr) {
						t.Fatalf("Preload: got (%q, %v), want error %v", got, err, tt.wantErr)
					}
				} else if err != nil || got != tt.want {
					t.Fatalf("Preload: got (%q, %v), want (%q, nil)", got, err, tt.want)
				}

				st, meta := mustStats(t, s, c.ID), mustMeta(t, s, c.ID)
				if !tt.wantReset {
					if !reflect.DeepEqual(st, before) {
						t.Errorf("Stats: got %+v, want unchanged %+v", st, before)
					}
					if !reflect.DeepEqual(meta, beforeMeta) {
						t.Errorf("meta: got %v, want unchanged %v", meta, beforeMeta)
					}
					if got := mustResult(t, s, a.RequestID); got.Status != model.StatusSuccess {
						t.Errorf("Result: got %s, want %s", got.Status, model.StatusSuccess)
					}
					if got := mustUserUnits(t, s, c.ID, "u1"); got != 1 {
						t.Errorf("UserUnits: got %d, want 1", got)
					}
					return
				}
				want := model.Stats{Loaded: true, Stock: next.Stock, Remaining: next.Stock, FinishedByStatus: finished(nil)}
				if !reflect.DeepEqual(st, want) {
					t.Errorf("Stats after reset: got %+v, want %+v", st, want)
				}
				wantMeta := map[string]string{
					"stock": formatInt(next.Stock), "limit": formatInt(next.PerUserLimit),
					"start_ms": formatMs(next.StartAt), "end_ms": formatMs(next.EndAt),
				}
				if !reflect.DeepEqual(meta, wantMeta) {
					t.Errorf("meta after reset: got %v, want %v", meta, wantMeta)
				}
				if got := mustSoldOut(t, s, c.ID); got {
					t.Errorf("SoldOut after reset: got true, want false")
				}
				mustNoResult(t, s, a.RequestID)
				if got := mustUserUnits(t, s, c.ID, "u1"); got != 0 {
					t.Errorf("UserUnits after reset: got %d, want 0", got)
				}
				retry := a
				retry.RequestID = newRequestID(c.ID)
				if rid, existing := mustAdmit(t, s, retry); rid != retry.RequestID || existing {
					t.Errorf("Admit with the old key after reset: got (%s, %v), want (%s, false)", rid, existing, retry.RequestID)
				}
			})
		}
	})
}

func mustMeta(t *testing.T, s *Store, campaignID string) map[string]string {
	t.Helper()
	m, err := s.rdb.HGetAll(t.Context(), campaignKeys(campaignID).meta).Result()
	if err != nil {
		t.Fatalf("HGETALL meta %s: %v", campaignID, err)
	}
	return m
}

func formatInt(n int64) string    { return strconv.FormatInt(n, 10) }
func formatMs(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
