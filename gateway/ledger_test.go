package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
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

// lateStock holds the first Redis write of a pause until hold is closed,
// signalling held when it starts waiting.
type lateStock struct {
	*store.Store
	once       sync.Once
	held, hold chan struct{}
}

func (l *lateStock) SetPaused(ctx context.Context, c model.Campaign) (bool, error) {
	if c.Paused {
		l.once.Do(func() { close(l.held); <-l.hold })
	}
	return l.Store.SetPaused(ctx, c)
}

// TestPauseResumeAtOnce: two admins pause and resume at once; MySQL commits
// the pause first and the resume last, but the pause reaches Redis last.
// Redis ends with what MySQL committed last, not paused, so workers do not
// hold a sale the shop resumed.
func TestPauseResumeAtOnce(t *testing.T) {
	ls := &lateStock{held: make(chan struct{}), hold: make(chan struct{})}
	svc, st, c := newAdmitServiceOn(t, newGatePublisher(false), Options{}, func(st *store.Store) Stock { ls.Store = st; return ls })
	paused := make(chan error, 1)
	go func() {
		_, err := svc.Pause(context.Background(), c.ID, true)
		paused <- err
	}()
	<-ls.held // committed in MySQL, its Redis write waiting
	if got, err := svc.Pause(t.Context(), c.ID, false); err != nil || got.Paused {
		t.Fatalf("resume: got %+v, %v", got, err)
	}
	close(ls.hold)
	if err := <-paused; err != nil {
		t.Fatalf("pause: %v", err)
	}
	committed, err := svc.campaigns.Campaign(t.Context(), c.ID)
	if err != nil || committed.Paused {
		t.Fatalf("MySQL: got %+v, %v; want not paused (the resume committed last)", committed, err)
	}
	if p, err := st.Projection(t.Context(), c.ID); err != nil || p.Paused {
		t.Fatalf("Redis: got %+v, %v; want not paused, as MySQL", p, err)
	}
}

// TestAdmitLostRestores: a purchase of a campaign Redis lost is refused
// 503 and starts a restore from the ledger; a purchase moments later is
// admitted, under the next epoch. One never loaded stays 409 not_loaded.
func TestAdmitLostRestores(t *testing.T) {
	pub := newGatePublisher(false)
	svc, st, c := newAdmitService(t, pub, Options{})
	campaigns := svc.campaigns.(*memCampaigns)
	m := metrics.New()
	svc.opts.Restorer = reconcile.NewRestorer(slog.New(slog.NewTextHandler(io.Discard, nil)), campaigns, st, m,
		reconcile.RestorerOptions{Interval: time.Millisecond})
	if err := testenv.Redis(t).Del(t.Context(), "fs:{"+c.ID+"}:stock", "fs:{"+c.ID+"}:meta").Err(); err != nil {
		t.Fatalf("unload: %v", err)
	}
	if _, err := svc.Purchase(t.Context(), Purchase{UserID: "u0", CampaignID: c.ID, Quantity: 1}, nil); !errors.Is(err, model.ErrUnavailable) {
		t.Fatalf("purchase while lost: got %v, want %v", err, model.ErrUnavailable)
	}
	user := 0
	testenv.Eventually(t, 10*time.Second, "a purchase admitted after the restore", func() (bool, string) {
		user++
		_, err := svc.Purchase(t.Context(), Purchase{UserID: fmt.Sprintf("u%d", user), CampaignID: c.ID, Quantity: 1}, nil)
		return err == nil, fmt.Sprint(err)
	})
	if got, _ := campaigns.Campaign(t.Context(), c.ID); got.Epoch != c.Epoch+1 {
		t.Errorf("epoch after the restore: got %d, want %d", got.Epoch, c.Epoch+1)
	}
	if got := testutil.ToFloat64(m.Restores.WithLabelValues("admit")); got != 1 {
		t.Errorf("restores: got %v, want 1", got)
	}
}
