package gateway

import (
	"errors"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

func TestPreloadOutcome(t *testing.T) {
	start := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	c := model.Campaign{ID: "c", Stock: 10, PerUserLimit: 2, StartAt: start, EndAt: start.Add(time.Hour), Epoch: 3}
	same := model.Projection{Loaded: true, Epoch: 3, Stock: 10, Limit: 2, StartAt: start, EndAt: start.Add(time.Hour)}
	with := func(f func(p *model.Projection)) model.Projection {
		p := same
		f(&p)
		return p
	}
	before, after := start.Add(-time.Minute), start.Add(time.Minute)
	tests := []struct {
		name    string
		c       model.Campaign
		p       model.Projection
		now     time.Time
		force   bool
		want    model.PreloadOutcome
		wantErr error
	}{
		{name: "same values before start", c: c, p: same, now: before, want: model.PreloadUnchanged},
		{name: "same values after start", c: c, p: same, now: after, want: model.PreloadUnchanged},
		{name: "same values after start with force", c: c, p: same, now: after, force: true, want: model.PreloadUnchanged},
		{name: "same values paused", c: c, p: with(func(p *model.Projection) { p.Paused = true }), now: after, want: model.PreloadUnchanged},
		{name: "other stock before start", c: c, p: with(func(p *model.Projection) { p.Stock = 5 }), now: before, want: model.PreloadLoaded},
		{name: "other limit before start", c: c, p: with(func(p *model.Projection) { p.Limit = 1 }), now: before, want: model.PreloadLoaded},
		{name: "other end before start", c: c, p: with(func(p *model.Projection) { p.EndAt = start }), now: before, want: model.PreloadLoaded},
		{name: "other stock after start", c: c, p: with(func(p *model.Projection) { p.Stock = 5 }), now: after, wantErr: model.ErrSaleStarted},
		{name: "other stock at start", c: c, p: with(func(p *model.Projection) { p.Stock = 5 }), now: start, wantErr: model.ErrSaleStarted},
		{name: "other stock after start with force", c: c, p: with(func(p *model.Projection) { p.Stock = 5 }), now: after, force: true, want: model.PreloadLoaded},
		{name: "never loaded", c: model.Campaign{ID: "c", Stock: 10, StartAt: start}, p: model.Projection{}, now: after, want: model.PreloadLoaded},
		{name: "loaded before epochs", c: model.Campaign{ID: "c", Stock: 10, PerUserLimit: 2, StartAt: start, EndAt: start.Add(time.Hour)},
			p: with(func(p *model.Projection) { p.Epoch = 0 }), now: after, want: model.PreloadUnchanged},
		{name: "lost", c: c, p: model.Projection{}, now: after, want: model.PreloadRebuilt},
		{name: "lost before start", c: c, p: model.Projection{}, now: before, want: model.PreloadRebuilt},
		{name: "older epoch", c: c, p: with(func(p *model.Projection) { p.Epoch = 2 }), now: after, want: model.PreloadRebuilt},
		{name: "later epoch", c: c, p: with(func(p *model.Projection) { p.Epoch = 4; p.Stock = 1 }), now: after, want: model.PreloadUnchanged},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := preloadOutcome(tt.c, tt.p, tt.now, tt.force)
			if got != tt.want || !errors.Is(err, tt.wantErr) {
				t.Fatalf("got (%q, %v), want (%q, %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// TestPause: a paused sale refuses purchases (model.ErrPaused) and workers
// hold it (Redis says paused); resumed, it admits again.
func TestPause(t *testing.T) {
	pub := newGatePublisher(false)
	svc, st, c := newAdmitService(t, pub, Options{})
	buy := func(user string) error {
		_, err := svc.Purchase(t.Context(), Purchase{UserID: user, CampaignID: c.ID, Quantity: 1}, nil)
		return err
	}
	if err := buy("u1"); err != nil {
		t.Fatalf("purchase before the pause: %v", err)
	}
	for range 2 {
		if got, err := svc.Pause(t.Context(), c.ID, true); err != nil || !got.Paused {
			t.Fatalf("Pause: got %+v, %v", got, err)
		}
	}
	if err := buy("u2"); !errors.Is(err, model.ErrPaused) {
		t.Fatalf("purchase while paused: got %v, want %v", err, model.ErrPaused)
	}
	if p, err := st.Projection(t.Context(), c.ID); err != nil || !p.Paused {
		t.Fatalf("Redis while paused: got %+v, %v; want paused", p, err)
	}
	if got, err := svc.Pause(t.Context(), c.ID, false); err != nil || got.Paused {
		t.Fatalf("resume: got %+v, %v", got, err)
	}
	if err := buy("u2"); err != nil {
		t.Fatalf("purchase after resume: %v", err)
	}
	if p, err := st.Projection(t.Context(), c.ID); err != nil || p.Paused {
		t.Fatalf("Redis after resume: got %+v, %v; want not paused", p, err)
	}
	if _, err := svc.Pause(t.Context(), "no such", true); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("Pause of a bad id: got %v, want %v", err, model.ErrNotFound)
	}
}
