package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// countingLedger counts the loads (BumpEpoch) that go through it.
type countingLedger struct {
	*sqlstore.DB
	bumps atomic.Int64
}

func (l *countingLedger) BumpEpoch(ctx context.Context, id string) (model.Campaign, []model.Order, error) {
	l.bumps.Add(1)
	return l.DB.BumpEpoch(ctx, id)
}

// restoreBundle is a sale on real Redis and MySQL with 3 of 10 units sold
// and stored, as the worker does it.
type restoreBundle struct {
	rdb    *redis.Client
	st     *store.Store
	ledger *countingLedger
	c      model.Campaign
	m      *metrics.Metrics
	log    bytes.Buffer
}

// newRestoreBundle starts a sale that opened a minute ago and ends in end
// (negative: over), loaded unless epoch0.
func newRestoreBundle(t *testing.T, end time.Duration, epoch0 bool) *restoreBundle {
	t.Helper()
	db, err := sqlstore.Open(t.Context(), sqlstore.DriverMySQL, testenv.MySQLDSN(t))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	b := &restoreBundle{rdb: testenv.Redis(t), ledger: &countingLedger{DB: db}, m: metrics.New()}
	b.st = store.New(b.rdb)
	now := time.Now().Truncate(time.Second)
	b.c = model.Campaign{ID: testenv.Name(t, "rs-"), Name: "rs", Stock: 10, PerUserLimit: 1,
		StartAt: now.Add(-time.Hour), EndAt: now.Add(end)}
	if _, err := db.CreateCampaign(t.Context(), b.c); err != nil {
		t.Fatalf("create: %v", err)
	}
	if epoch0 {
		return b
	}
	if b.c, err = Load(t.Context(), db, b.st, b.c.ID); err != nil {
		t.Fatalf("load: %v", err)
	}
	var batch []model.Deduction
	for i := range 3 {
		rid := model.FormatRequestID(b.c.ID, fmt.Sprintf("%032x", i+1))
		batch = append(batch, model.Deduction{RequestID: rid, UserID: fmt.Sprintf("u%d", i), Quantity: 1, OrderID: model.OrderIDOf(rid)})
	}
	reply, err := b.st.Deduct(t.Context(), b.c.ID, batch)
	if err != nil {
		t.Fatalf("deduct: %v", err)
	}
	var orders []model.Order
	for _, r := range reply.Results {
		orders = append(orders, model.Order{ID: r.OrderID, RequestID: r.RequestID, CampaignID: b.c.ID,
			UserID: r.UserID, Quantity: r.Quantity, Status: model.OrderPendingPayment})
	}
	if err := db.InsertOrders(t.Context(), orders, model.Epochs{b.c.ID: reply.Epoch}); err != nil {
		t.Fatalf("insert: %v", err)
	}
	return b
}

// restorer returns a Restorer of its own (a process), logging to b.log.
func (b *restoreBundle) restorer(opts RestorerOptions) *Restorer {
	return NewRestorer(slog.New(slog.NewJSONHandler(&b.log, nil)), b.ledger, b.st, b.m, opts)
}

// lose deletes every key of the campaign, as a Redis restarted empty has.
func (b *restoreBundle) lose(t *testing.T) {
	t.Helper()
	keys, err := b.rdb.Keys(t.Context(), "fs:{"+b.c.ID+"}:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys of %s: got %d, %v", b.c.ID, len(keys), err)
	}
	if err := b.rdb.Del(t.Context(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
}

// epoch reads the campaign's epoch in MySQL.
func (b *restoreBundle) epoch(t *testing.T) model.Epoch {
	t.Helper()
	c, err := b.ledger.Campaign(t.Context(), b.c.ID)
	if err != nil {
		t.Fatal(err)
	}
	return c.Epoch
}

// TestRestore: a restore rebuilds a campaign Redis lost (none of it, or
// an older epoch) from MySQL, with one log line and the metric, so that
// Redis agrees with MySQL; it changes nothing for a campaign never loaded,
// one Redis holds, one whose sale is over, or one another process holds
// the restore lock of.
func TestRestore(t *testing.T) {
	tests := []struct {
		name        string
		end         time.Duration
		epoch0      bool
		lose        func(b *restoreBundle, t *testing.T)
		wantRebuilt bool
	}{
		{name: "lost", end: time.Hour, lose: (*restoreBundle).lose, wantRebuilt: true},
		{name: "older epoch", end: time.Hour, lose: func(b *restoreBundle, t *testing.T) {
			// A load Redis never saw: a failover to a replica that lagged
			// it.
			if _, _, err := b.ledger.DB.BumpEpoch(t.Context(), b.c.ID); err != nil {
				t.Fatal(err)
			}
		}, wantRebuilt: true},
		{name: "current", end: time.Hour, lose: func(*restoreBundle, *testing.T) {}},
		{name: "never loaded", end: time.Hour, epoch0: true, lose: func(*restoreBundle, *testing.T) {}},
		{name: "sale over", end: -time.Minute, lose: (*restoreBundle).lose},
		{name: "locked", end: time.Hour, lose: func(b *restoreBundle, t *testing.T) {
			b.lose(t)
			token, err := b.st.LockRestore(t.Context(), b.c.ID, time.Minute)
			if err != nil || token == "" {
				t.Fatalf("lock: got %q, %v", token, err)
			}
			t.Cleanup(func() { _, _ = b.st.UnlockRestore(context.Background(), b.c.ID, token) })
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newRestoreBundle(t, tc.end, tc.epoch0)
			tc.lose(b, t)
			before := b.epoch(t)
			// NeedsRestore tells the same, with the campaign as MySQL
			// holds it (a reader tells a sale over from one never loaded).
			c, lost, err := b.restorer(RestorerOptions{}).NeedsRestore(t.Context(), b.c.ID)
			if err != nil || lost != (tc.wantRebuilt || tc.name == "locked") || c.ID != b.c.ID || c.Epoch != before || !c.EndAt.Equal(b.c.EndAt) {
				t.Fatalf("NeedsRestore: got %v, %v, campaign %s epoch %d ending %v; want %v, %s epoch %d ending %v",
					lost, err, c.ID, c.Epoch, c.EndAt, tc.wantRebuilt || tc.name == "locked", b.c.ID, before, b.c.EndAt)
			}
			rebuilt, err := b.restorer(RestorerOptions{}).Restore(t.Context(), b.c.ID, "deduct")
			if err != nil || rebuilt != tc.wantRebuilt {
				t.Fatalf("Restore: got %v, %v; want %v", rebuilt, err, tc.wantRebuilt)
			}
			wantBumps, wantEpoch, wantLines := 0, before, 0
			if tc.wantRebuilt {
				wantBumps, wantEpoch, wantLines = 1, before+1, 1
			}
			if got := b.ledger.bumps.Load(); got != int64(wantBumps) {
				t.Errorf("loads: got %d, want %d", got, wantBumps)
			}
			if got := b.epoch(t); got != wantEpoch {
				t.Errorf("epoch in MySQL: got %d, want %d", got, wantEpoch)
			}
			if got := testutil.ToFloat64(b.m.Restores.WithLabelValues("deduct")); got != float64(wantLines) {
				t.Errorf("flashsale_restores_total{trigger=deduct}: got %v, want %d", got, wantLines)
			}
			lines := bytes.Count(b.log.Bytes(), []byte("\n"))
			if lines != wantLines {
				t.Fatalf("log: got %d lines, want %d:\n%s", lines, wantLines, b.log.String())
			}
			if !tc.wantRebuilt {
				return
			}
			var line struct {
				CampaignID string `json:"campaign_id"`
				Trigger    string `json:"trigger"`
				Epoch      int64  `json:"epoch"`
				Orders     int64  `json:"orders"`
				Duration   any    `json:"duration"`
			}
			if err := json.Unmarshal(b.log.Bytes(), &line); err != nil {
				t.Fatal(err)
			}
			if line.CampaignID != b.c.ID || line.Epoch != int64(wantEpoch) || line.Orders != 3 || line.Trigger != "deduct" || line.Duration == nil {
				t.Errorf("log line: got %s, want campaign_id, epoch %d, orders 3, trigger deduct, duration", b.log.String(), wantEpoch)
			}
			rep, err := New(b.st, b.ledger).Check(t.Context(), b.c.ID)
			if err != nil || !rep.Consistent() {
				t.Errorf("after the restore Redis and MySQL differ: %+v, %v", rep.Differences, err)
			}
		})
	}
}

// TestRestoreOnce: many processes, each with many callers, restore a lost
// campaign at once: exactly one loads it.
func TestRestoreOnce(t *testing.T) {
	b := newRestoreBundle(t, time.Hour, false)
	b.lose(t)
	before := b.epoch(t)
	const processes, callers = 4, 8
	var rebuilt atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range processes {
		r := b.restorer(RestorerOptions{})
		for range callers {
			wg.Go(func() {
				<-start
				ok, err := r.Restore(t.Context(), b.c.ID, "admit")
				if err != nil {
					t.Errorf("Restore: %v", err)
				}
				if ok {
					rebuilt.Add(1)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if got := rebuilt.Load(); got != 1 {
		t.Errorf("restores that rebuilt: got %d, want 1", got)
	}
	if got := b.ledger.bumps.Load(); got != 1 {
		t.Errorf("loads: got %d, want 1", got)
	}
	if got := b.epoch(t); got != before+1 {
		t.Errorf("epoch: got %d, want %d", got, before+1)
	}
}

// TestRestoreInterval: a process tries a campaign at most once per
// Interval: a loss right after an attempt waits for the next one.
func TestRestoreInterval(t *testing.T) {
	b := newRestoreBundle(t, time.Hour, false)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	r := b.restorer(RestorerOptions{Interval: time.Second, Now: clock})
	restore := func() bool {
		t.Helper()
		ok, err := r.Restore(t.Context(), b.c.ID, "deduct")
		if err != nil {
			t.Fatalf("Restore: %v", err)
		}
		return ok
	}
	if restore() {
		t.Fatal("Redis holds the campaign: got rebuilt")
	}
	b.lose(t)
	if restore() {
		t.Fatal("within the interval of the last attempt: got rebuilt")
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	if !restore() {
		t.Fatal("after the interval: got nothing rebuilt")
	}
	if got := b.ledger.bumps.Load(); got != 1 {
		t.Errorf("loads: got %d, want 1", got)
	}
}

// loadingFirst is a store where another process loads the campaign
// between a restore's check and its lock.
type loadingFirst struct {
	*store.Store
	db *sqlstore.DB
}

func (s loadingFirst) LockRestore(ctx context.Context, campaignID string, ttl time.Duration) (string, error) {
	if _, err := Load(ctx, s.db, s.Store, campaignID); err != nil {
		return "", err
	}
	return s.Store.LockRestore(ctx, campaignID, ttl)
}

// TestRestoreRechecks: a campaign another process loaded while a restore
// waited for the lock is not loaded again.
func TestRestoreRechecks(t *testing.T) {
	b := newRestoreBundle(t, time.Hour, false)
	b.lose(t)
	r := NewRestorer(slog.New(slog.NewJSONHandler(&b.log, nil)), b.ledger, loadingFirst{Store: b.st, db: b.ledger.DB}, b.m, RestorerOptions{})
	rebuilt, err := r.Restore(t.Context(), b.c.ID, "deduct")
	if err != nil || rebuilt {
		t.Fatalf("Restore: got %v, %v; want false (loaded meanwhile)", rebuilt, err)
	}
	if got := b.ledger.bumps.Load(); got != 0 {
		t.Errorf("loads by the restore: got %d, want 0", got)
	}
}

// heldLedger is the ledgers of several campaigns, each in its own
// database, behind one Ledger; the first read of campaign held waits for
// release, so that an attempt on it stays running.
type heldLedger struct {
	byCampaign map[string]*countingLedger
	held       string
	entered    chan struct{} // closed at the first read of held
	release    chan struct{}
	enter      sync.Once
}

func (l *heldLedger) Campaign(ctx context.Context, id string) (model.Campaign, error) {
	if id == l.held {
		first := false
		l.enter.Do(func() { first = true; close(l.entered) })
		if first {
			select {
			case <-l.release:
			case <-ctx.Done():
				return model.Campaign{}, ctx.Err()
			}
		}
	}
	return l.byCampaign[id].Campaign(ctx, id)
}

func (l *heldLedger) BumpEpoch(ctx context.Context, id string) (model.Campaign, []model.Order, error) {
	return l.byCampaign[id].BumpEpoch(ctx, id)
}

func (l *heldLedger) CampaignOrders(ctx context.Context, id string) ([]model.Order, error) {
	return l.byCampaign[id].CampaignOrders(ctx, id)
}

func (l *heldLedger) Refusals(ctx context.Context, id string) ([]model.Result, error) {
	return l.byCampaign[id].Refusals(ctx, id)
}

// TestRestoreInBackground: callers of a lost campaign return at once while
// one attempt runs; that one attempt loads the campaign and calls its
// rebuilt once, and no other starts meanwhile. Another campaign is not
// held up by it, and once the attempt ended (and the interval passed) a
// new loss is restored again.
func TestRestoreInBackground(t *testing.T) {
	a, b := newRestoreBundle(t, 24*time.Hour, false), newRestoreBundle(t, 24*time.Hour, false)
	a.lose(t)
	b.lose(t)
	ledger := &heldLedger{byCampaign: map[string]*countingLedger{a.c.ID: a.ledger, b.c.ID: b.ledger},
		held: a.c.ID, entered: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	const interval = time.Second
	r := NewRestorer(slog.New(slog.NewJSONHandler(&a.log, nil)), ledger, a.st, a.m, RestorerOptions{Interval: interval, Now: clock})

	rebuiltA := make(chan int, 16)
	const callers = 8
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { r.RestoreInBackground(t.Context(), a.c.ID, "admit", func() { rebuiltA <- i }) })
	}
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("RestoreInBackground waited for the restore")
	}
	select {
	case <-ledger.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no attempt on the lost campaign started")
	}

	// While a's attempt is held: b restores, a's later callers start nothing.
	rebuiltB := make(chan struct{}, 2)
	r.RestoreInBackground(t.Context(), b.c.ID, "poll", func() { rebuiltB <- struct{}{} })
	select {
	case <-rebuiltB:
	case <-time.After(30 * time.Second):
		t.Fatal("another campaign was not restored while the first one's attempt ran")
	}
	mu.Lock()
	now = now.Add(interval) // only a's running attempt holds these off
	mu.Unlock()
	for range callers {
		r.RestoreInBackground(t.Context(), a.c.ID, "admit", func() { rebuiltA <- -1 })
	}
	if got := a.ledger.bumps.Load(); got != 0 {
		t.Fatalf("loads of the held campaign before its release: got %d, want 0", got)
	}

	close(ledger.release)
	select {
	case i := <-rebuiltA:
		if i < 0 {
			t.Errorf("rebuilt called for a caller that came while an attempt ran")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the lost campaign was not rebuilt")
	}
	// The attempt ends right after its rebuilt; a loss after that, once
	// the interval passed, is restored by a new one.
	a.lose(t)
	testenv.Eventually(t, 30*time.Second, "a new attempt restores a new loss", func() (bool, string) {
		if n := a.ledger.bumps.Load(); n == 2 {
			return true, ""
		}
		mu.Lock()
		now = now.Add(interval)
		mu.Unlock()
		r.RestoreInBackground(t.Context(), a.c.ID, "admit", func() { rebuiltA <- -2 })
		return false, fmt.Sprintf("%d loads", a.ledger.bumps.Load())
	})
	select {
	case i := <-rebuiltA:
		if i != -2 {
			t.Errorf("rebuilt: got a second call from caller %d, want one per rebuild", i)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second loss was not reported rebuilt")
	}
	if len(rebuiltA) != 0 || len(rebuiltB) != 0 {
		t.Errorf("rebuilt called more than once per rebuild: %d more for the first campaign, %d for the second", len(rebuiltA), len(rebuiltB))
	}
	if got := b.ledger.bumps.Load(); got != 1 {
		t.Errorf("loads of the other campaign: got %d, want 1", got)
	}
}
