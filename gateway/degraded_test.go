package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// memDecider is an in-memory Decider with sqlstore's semantics, on the one
// campaign of a memCampaigns (whose Campaign then reads DecidedInMySQL and
// UnitsHeld, as *sqlstore.DB's does): one mutex, maps.
type memDecider struct {
	mu        sync.Mutex
	campaigns *memCampaigns
	results   map[string]model.Result // decided requests
	units     map[string]int64        // units of each user's active orders
	keys      map[string]memKey       // "<campaign>|<user>|<key>"
	takeOvers int
	batches   []int // the sizes of the Decide calls
	// hold, when set, blocks Decide until closed; entered hears each call.
	hold    chan struct{}
	entered chan struct{}
	// onDecide runs at the start of every Decide.
	onDecide func()
}

type memKey struct {
	requestID string
	quantity  int64
}

var _ Decider = (*memDecider)(nil)

func newMemDecider(campaigns *memCampaigns) *memDecider {
	return &memDecider{campaigns: campaigns, results: map[string]model.Result{}, units: map[string]int64{},
		keys: map[string]memKey{}, entered: make(chan struct{}, 1024)}
}

func (m *memDecider) TakeOver(_ context.Context, id string) (model.Campaign, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.campaigns.mu.Lock()
	defer m.campaigns.mu.Unlock()
	c := &m.campaigns.c
	if c.ID != id {
		return model.Campaign{}, model.ErrNotFound
	}
	m.takeOvers++
	if !c.DecidedInMySQL {
		c.Epoch++
		c.DecidedInMySQL = true
		c.UnitsHeld = 0
		for _, r := range m.results {
			if r.Status == model.StatusSuccess {
				c.UnitsHeld += r.Quantity
			}
		}
	}
	return *c, nil
}

func (m *memDecider) Decide(_ context.Context, id string, ds []model.Deduction, _ time.Time) ([]model.Result, error) {
	m.entered <- struct{}{}
	if m.hold != nil {
		<-m.hold
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.onDecide != nil {
		m.onDecide()
	}
	m.campaigns.mu.Lock()
	defer m.campaigns.mu.Unlock()
	c := &m.campaigns.c
	switch {
	case c.ID != id:
		return nil, model.ErrNotFound
	case !c.DecidedInMySQL:
		return nil, fmt.Errorf("decide: %w", model.ErrLedgerMoved)
	case c.Paused:
		return nil, fmt.Errorf("decide: %w", model.ErrPaused)
	}
	m.batches = append(m.batches, len(ds))
	out := make([]model.Result, len(ds))
	for i, d := range ds {
		if r, ok := m.results[d.RequestID]; ok {
			out[i] = r
			continue
		}
		r := model.Result{RequestID: d.RequestID, CampaignID: id, UserID: d.UserID, Quantity: d.Quantity}
		switch {
		case c.UnitsHeld >= c.Stock:
			r.Status = model.StatusSoldOut
		case c.UnitsHeld+d.Quantity > c.Stock:
			r.Status, r.Reason = model.StatusRejected, model.ReasonInsufficientStock
		case m.units[d.UserID]+d.Quantity > c.PerUserLimit:
			r.Status = model.StatusLimitExceeded
		default:
			r.Status, r.OrderID = model.StatusSuccess, d.OrderID
			m.units[d.UserID] += d.Quantity
			c.UnitsHeld += d.Quantity
		}
		m.results[d.RequestID] = r
		out[i] = r
	}
	return out, nil
}

func (m *memDecider) ClaimKey(ctx context.Context, campaignID, userID, key string, quantity int64, requestID string) (string, int64, error) {
	m.mu.Lock()
	k := campaignID + "|" + userID + "|" + key
	if _, ok := m.keys[k]; !ok {
		m.keys[k] = memKey{requestID: requestID, quantity: quantity}
	}
	m.mu.Unlock()
	return m.KeyHolder(ctx, campaignID, userID, key)
}

func (m *memDecider) KeyHolder(_ context.Context, campaignID, userID, key string) (string, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.keys[campaignID+"|"+userID+"|"+key]
	if !ok {
		return "", 0, model.ErrNotFound
	}
	return h.requestID, h.quantity, nil
}

func (m *memDecider) DecidedStats(_ context.Context, id string) (model.Stats, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.campaigns.mu.Lock()
	defer m.campaigns.mu.Unlock()
	c := m.campaigns.c
	if c.ID != id || !c.DecidedInMySQL {
		return model.Stats{}, false, nil
	}
	st := model.Stats{Loaded: true, Stock: c.Stock, Sold: c.UnitsHeld, Remaining: c.Stock - c.UnitsHeld,
		SoldOut: c.UnitsHeld >= c.Stock, FinishedByStatus: map[model.Status]int64{}}
	for _, r := range m.results {
		st.Admitted++
		st.FinishedByStatus[r.Status]++
	}
	return st, true, nil
}

// handBack is a load of Redis from MySQL (BumpEpoch): Redis decides again.
func (m *memDecider) handBack() {
	m.campaigns.mu.Lock()
	defer m.campaigns.mu.Unlock()
	m.campaigns.c.Epoch++
	m.campaigns.c.DecidedInMySQL = false
}

// giveBack ends the order of success r (expired, say) and returns its units.
func (m *memDecider) giveBack(r model.Result) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.campaigns.mu.Lock()
	defer m.campaigns.mu.Unlock()
	m.units[r.UserID] -= r.Quantity
	m.campaigns.c.UnitsHeld -= r.Quantity
}

func (m *memDecider) stats() (takeOvers int, batches []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.takeOvers, slices.Clone(m.batches)
}

// downStock is the real store, whose admissions fail as a Redis out does
// while down is set. It counts the admission calls.
type downStock struct {
	*store.Store
	down   *atomic.Bool
	admits *atomic.Int32
}

func (d downStock) Admit(ctx context.Context, campaignID string, batch []model.AdmitRequest, limits model.RateLimits) ([]model.AdmitReply, error) {
	d.admits.Add(1)
	if d.down.Load() {
		return nil, fmt.Errorf("admit: %w: i/o timeout", model.ErrUnavailable)
	}
	return d.Store.Admit(ctx, campaignID, batch, limits)
}

func (d downStock) Stats(ctx context.Context, campaignID string) (model.Stats, error) {
	if d.down.Load() {
		return model.Stats{}, fmt.Errorf("stats: %w: i/o timeout", model.ErrUnavailable)
	}
	return d.Store.Stats(ctx, campaignID)
}

// syncBuffer is a log destination for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.b.String(), s)
}

// degradedBundle is a Service deciding in MySQL and what a test drives it
// with.
type degradedBundle struct {
	svc  *Service
	dec  *memDecider
	pub  *gatePublisher
	c    model.Campaign
	down *atomic.Bool // Redis out, to the Service and its store
	// admits counts the store's Admit calls: the Redis path taken.
	admits *atomic.Int32
	log    *syncBuffer
	// now is the Service's clock, in unix ns.
	now *atomic.Int64
}

// newDegraded returns a Service with Degrade on and Redis out, on the test
// Redis, selling c (defaults: stock 30, limit 2, open for an hour), which
// Redis was deciding before the outage (loaded).
func newDegraded(t *testing.T, c model.Campaign, opts Options) degradedBundle {
	t.Helper()
	now := &atomic.Int64{}
	now.Store(time.Now().UnixNano())
	c.ID, c.Name = testenv.Name(t, "deg"), "t"
	if c.Stock == 0 {
		c.Stock = 30
	}
	if c.PerUserLimit == 0 {
		c.PerUserLimit = 2
	}
	c.StartAt, c.EndAt = time.Unix(0, now.Load()).Add(-time.Minute), time.Unix(0, now.Load()).Add(time.Hour)
	campaigns := &memCampaigns{c: c}
	st := store.New(testenv.Redis(t))
	b := degradedBundle{dec: newMemDecider(campaigns), pub: newGatePublisher(false), down: &atomic.Bool{}, admits: &atomic.Int32{},
		log: &syncBuffer{}, now: now}
	b.c = mustLoad(t, campaigns, st)
	b.down.Store(true)
	opts.Topic = testenv.Topic(t)
	opts.RedisDown = b.down.Load
	opts.Now = func() time.Time { return time.Unix(0, now.Load()) }
	if opts.Degrade {
		opts.Decider = b.dec
	}
	log := slog.New(slog.NewTextHandler(b.log, nil))
	b.svc = New(log, downStock{Store: st, down: b.down, admits: b.admits}, campaigns, b.pub, metrics.New(), opts)
	return b
}

func (b degradedBundle) buy(t *testing.T, user, key string, qty int64) (Admitted, error) {
	t.Helper()
	return b.svc.Purchase(t.Context(), Purchase{UserID: user, CampaignID: b.c.ID, Quantity: qty, IdempotencyKey: key}, nil)
}

// TestDegradedSale: 200 purchases of 50 shoppers at once against stock 30
// and a limit of 2, decided in MySQL: exactly 30 units sold, nobody above
// the limit, each request one result (the one the Decider stores), the
// campaign taken over once and the sold-out flag up after.
func TestDegradedSale(t *testing.T) {
	b := newDegraded(t, model.Campaign{Stock: 30, PerUserLimit: 2}, Options{Degrade: true})
	const users, purchases = 50, 200
	adms := make([]Admitted, purchases)
	errs := make([]error, purchases)
	var wg sync.WaitGroup
	for i := range purchases {
		wg.Go(func() { adms[i], errs[i] = b.buy(t, fmt.Sprintf("u%d", i%users), "", 1) })
	}
	wg.Wait()

	perUser := map[string]int64{}
	ids := map[string]bool{}
	var sold int64
	refused := 0
	for i, adm := range adms {
		if errs[i] != nil {
			if !errors.Is(errs[i], model.ErrSoldOut) {
				t.Fatalf("purchase %d: got %v, want a result or %v", i, errs[i], model.ErrSoldOut)
			}
			refused++
			continue
		}
		r := adm.Result
		if adm.Existing || ids[adm.RequestID] || r.RequestID != adm.RequestID || r.Quantity != 1 || r.UserID != fmt.Sprintf("u%d", i%users) {
			t.Fatalf("purchase %d: got %+v, want a new request of its own with its result", i, adm)
		}
		ids[adm.RequestID] = true
		if stored := b.dec.results[adm.RequestID]; stored != r {
			t.Fatalf("purchase %d: got result %+v, the Decider holds %+v", i, r, stored)
		}
		switch r.Status {
		case model.StatusSuccess:
			if r.OrderID != model.OrderIDOf(r.RequestID) {
				t.Fatalf("purchase %d: got order id %s, want %s", i, r.OrderID, model.OrderIDOf(r.RequestID))
			}
			sold += r.Quantity
			perUser[r.UserID] += r.Quantity
		case model.StatusSoldOut, model.StatusLimitExceeded:
		default:
			t.Fatalf("purchase %d: got status %s, want a final one", i, r.Status)
		}
	}
	if sold != 30 || len(ids)+refused != purchases {
		t.Errorf("got %d units sold, %d results and %d refusals; want 30 sold, %d answers", sold, len(ids), refused, purchases)
	}
	for u, n := range perUser {
		if n > 2 {
			t.Errorf("user %s: got %d units, want at most 2", u, n)
		}
	}
	if len(b.dec.results) != len(ids) {
		t.Errorf("got %d results stored, want %d: one per request answered", len(b.dec.results), len(ids))
	}
	takeOvers, batches := b.dec.stats()
	if takeOvers != 1 || slices.Max(batches) > maxDecideBatch {
		t.Errorf("got %d take-overs and batches %v, want 1 and none above %d", takeOvers, batches, maxDecideBatch)
	}
	if cc := b.svc.cache.get(b.c.ID); cc == nil || !cc.soldOut.Load() {
		t.Errorf("sold-out flag: got down, want up")
	}
	if n := b.log.count("deciding campaign in MySQL"); n != 1 {
		t.Errorf("got %d take-over warnings, want 1", n)
	}
	if got := b.pub.sizes(); len(got) != 0 {
		t.Errorf("got publishes %v, want none", got)
	}
}

// TestDegradedBatches: purchases of a campaign arriving while its decision
// is in flight share the next Decide, up to maxDecideBatch, and one request
// sent twice at once (the same Idempotency-Key) is one deduction.
func TestDegradedBatches(t *testing.T) {
	type buy struct{ user, key string }
	distinct := make([]buy, maxDecideBatch+2)
	for i := range distinct {
		distinct[i] = buy{user: fmt.Sprint("u", i)}
	}
	tests := []struct {
		name        string
		buys        []buy
		wantBatches []int // after the held one's
	}{
		{"capped", distinct, []int{maxDecideBatch, 2}},
		{"one request twice", []buy{{"u1", "k"}, {"u1", "k"}}, []int{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newDegraded(t, model.Campaign{Stock: 1000}, Options{Degrade: true})
			b.dec.hold = make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() { _, _ = b.buy(t, "first", "", 1) })
			<-b.dec.entered

			adms := make([]Admitted, len(tc.buys))
			errs := make([]error, len(tc.buys))
			for i, by := range tc.buys {
				wg.Go(func() { adms[i], errs[i] = b.buy(t, by.user, by.key, 1) })
			}
			testenv.Eventually(t, 5*time.Second, fmt.Sprintf("%d pending decisions", len(tc.buys)), func() (bool, string) {
				b.svc.degraded.mu.Lock()
				defer b.svc.degraded.mu.Unlock()
				got := len(b.svc.degraded.campaigns[b.c.ID].pending)
				return got == len(tc.buys), fmt.Sprintf("%d pending", got)
			})
			close(b.dec.hold)
			wg.Wait()

			ids := map[string]int{}
			for i, err := range errs {
				if err != nil || adms[i].Result.Status != model.StatusSuccess {
					t.Fatalf("purchase %d: got %+v, %v; want success", i, adms[i], err)
				}
				ids[adms[i].RequestID]++
			}
			for i, by := range tc.buys {
				if want := 1 + len(tc.buys) - len(ids); by.key != "" && ids[adms[i].RequestID] != want {
					t.Errorf("purchase %d: got request %s answered %d times, want %d", i, adms[i].RequestID, ids[adms[i].RequestID], want)
				}
			}
			if _, got := b.dec.stats(); !slices.Equal(got, append([]int{1}, tc.wantBatches...)) {
				t.Errorf("got batches %v, want [1 %v]", got, tc.wantBatches)
			}
		})
	}
}

// TestDegradedRateLimits: the rate limits hold per process while MySQL
// decides, in admit.lua's order and costs.
func TestDegradedRateLimits(t *testing.T) {
	type buy struct{ user, ip string }
	tests := []struct {
		name   string
		limits model.RateLimits
		buys   []buy
		want   []string // the refusal's reason, "" for a result
	}{
		{"user", model.RateLimits{UserRate: 1, UserBurst: 2},
			[]buy{{"u1", ""}, {"u1", ""}, {"u1", ""}, {"u2", ""}}, []string{"", "", "rate_user", ""}},
		{"ip", model.RateLimits{IPRate: 1, IPBurst: 1},
			[]buy{{"u1", "ip1"}, {"u2", "ip1"}, {"u3", "ip2"}, {"u4", ""}}, []string{"", "rate_ip", "", ""}},
		{"campaign", model.RateLimits{CampaignRate: 1, CampaignBurst: 2},
			[]buy{{"u1", ""}, {"u2", ""}, {"u3", ""}}, []string{"", "", "rate_campaign"}},
		{"a user refused costs the address nothing", model.RateLimits{UserRate: 1, UserBurst: 1, IPRate: 1, IPBurst: 2},
			[]buy{{"u1", "ip"}, {"u1", "ip"}, {"u2", "ip"}, {"u3", "ip"}}, []string{"", "rate_user", "", "rate_ip"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newDegraded(t, model.Campaign{Stock: 100, PerUserLimit: 10}, Options{Degrade: true, RateLimits: tc.limits})
			for i, by := range tc.buys {
				adm, err := b.svc.Purchase(t.Context(), Purchase{UserID: by.user, CampaignID: b.c.ID, Quantity: 1, ClientIP: by.ip}, nil)
				var rl *model.RateLimitError
				switch {
				case tc.want[i] == "" && (err != nil || adm.Result.Status != model.StatusSuccess):
					t.Fatalf("purchase %d: got %+v, %v; want success", i, adm, err)
				case tc.want[i] != "" && (!errors.As(err, &rl) || rl.RetryAfterSeconds < 1):
					t.Fatalf("purchase %d: got %+v, %v; want rate limited with a retry after", i, adm, err)
				case tc.want[i] != "":
					if n := testutil.ToFloat64(b.svc.m.Refusals.WithLabelValues(tc.want[i])); n != 1 {
						t.Fatalf("purchase %d: got %v refusals %s, want 1", i, n, tc.want[i])
					}
				}
			}
		})
	}
}

// TestLimiterSetBounded: live buckets never pass the set's bound, and
// buckets full again are dropped at the next sweep.
func TestLimiterSetBounded(t *testing.T) {
	limits := newLocalLimits(model.RateLimits{UserRate: 1, UserBurst: 2})
	l := &limits.user
	l.max = 3 * minSweep
	at := time.Now()
	for i := range 2 * l.max {
		if _, wait := l.take(fmt.Sprint(i), at); wait > 0 {
			t.Fatalf("key %d: refused its first event", i)
		}
		if len(l.m) > l.max {
			t.Fatalf("key %d: got %d limiters, want at most %d", i, len(l.m), l.max)
		}
	}
	at = at.Add(10 * time.Second) // every bucket is full again
	later := l.sweepAt - len(l.m) + 1
	for i := range later {
		l.take(fmt.Sprint("later", i), at)
	}
	if len(l.m) != later {
		t.Fatalf("after a sweep: got %d limiters, want the %d taken since", len(l.m), later)
	}
}

// TestDegradedIdempotencyKey: a key sent again gets its request as it
// stands, in every phase of the sale; another quantity is refused.
func TestDegradedIdempotencyKey(t *testing.T) {
	b := newDegraded(t, model.Campaign{Stock: 2, PerUserLimit: 2}, Options{Degrade: true, CampaignCacheTTL: time.Hour})
	first, err := b.buy(t, "u1", "k1", 1)
	if err != nil || first.Existing || first.Result.Status != model.StatusSuccess {
		t.Fatalf("first purchase: got %+v, %v; want a new request, success", first, err)
	}
	queued := first.Result
	queued.Status, queued.OrderID = model.StatusQueued, ""
	phases := []struct {
		name    string
		enter   func()
		want    model.Result
		wantNew error // what a new key gets in this phase
	}{
		{name: "open", want: first.Result},
		{
			name: "sold out",
			enter: func() {
				if adm, err := b.buy(t, "u2", "", 1); err != nil || adm.Result.Status != model.StatusSuccess {
					t.Fatalf("the last unit: got %+v, %v", adm, err)
				}
				if adm, err := b.buy(t, "u3", "", 1); err != nil || adm.Result.Status != model.StatusSoldOut {
					t.Fatalf("after the last unit: got %+v, %v; want sold_out", adm, err)
				}
			},
			want: first.Result, wantNew: model.ErrSoldOut,
		},
		{
			name: "paused",
			enter: func() {
				if _, err := b.svc.campaigns.SetPaused(t.Context(), b.c.ID, true); err != nil {
					t.Fatal(err)
				}
				b.svc.applyEvent(model.Event{Type: model.EventChanged, CampaignID: b.c.ID})
			},
			want: queued, wantNew: model.ErrPaused,
		},
		{
			name:  "sale over",
			enter: func() { b.now.Store(b.c.EndAt.Add(time.Second).UnixNano()) },
			want:  queued, wantNew: model.ErrEnded,
		},
	}
	for i, ph := range phases {
		t.Run(ph.name, func(t *testing.T) {
			if ph.enter != nil {
				ph.enter()
			}
			adm, err := b.buy(t, "u1", "k1", 1)
			if err != nil || !adm.Existing || adm.RequestID != first.RequestID || adm.Result != ph.want {
				t.Errorf("replay: got %+v, %v; want request %s as %+v", adm, err, first.RequestID, ph.want)
			}
			if adm, err := b.buy(t, "u1", "k1", 2); !errors.Is(err, model.ErrIdempotencyKeyReused) {
				t.Errorf("replay with another quantity: got %+v, %v; want %v", adm, err, model.ErrIdempotencyKeyReused)
			}
			if ph.wantNew == nil {
				return
			}
			if adm, err := b.buy(t, "u1", fmt.Sprint("new-", i), 1); !errors.Is(err, ph.wantNew) {
				t.Errorf("new key: got %+v, %v; want %v", adm, err, ph.wantNew)
			}
		})
	}
}

// TestDegradedSoldOutFlag: a sold-out decision raises the flag (fewer
// units left than asked for does not), and each refresh of the campaign
// sets it from MySQL's count of units held, so a unit given back reopens
// the sale.
func TestDegradedSoldOutFlag(t *testing.T) {
	b := newDegraded(t, model.Campaign{Stock: 3, PerUserLimit: 2}, Options{Degrade: true, CampaignCacheTTL: time.Minute})
	flag := func() bool { return b.svc.cache.get(b.c.ID).soldOut.Load() }
	refresh := func() { b.now.Add(int64(time.Minute)) }
	steps := []struct {
		name     string
		user     string
		qty      int64
		before   func()
		want     model.Status // "": refused sold out before any Decide
		wantFlag bool
	}{
		{name: "two of three", user: "u1", qty: 2, want: model.StatusSuccess},
		{name: "two more: not enough, one left", user: "u2", qty: 2, want: model.StatusRejected},
		{name: "the last one", user: "u3", qty: 1, want: model.StatusSuccess},
		{name: "refused once sold out", user: "u4", qty: 2, want: model.StatusSoldOut, wantFlag: true},
		{name: "the flag refuses", user: "u5", qty: 1, wantFlag: true},
		{name: "a unit given back reopens", user: "u5", qty: 1, before: func() {
			b.dec.giveBack(b.dec.results[b.dec.firstSuccess("u3")])
			refresh()
		}, want: model.StatusSuccess},
		{name: "a refresh finds it sold out", user: "u6", qty: 1, before: refresh, wantFlag: true},
	}
	for _, st := range steps {
		if st.before != nil {
			st.before()
		}
		_, before := b.dec.stats()
		adm, err := b.buy(t, st.user, "", st.qty)
		_, after := b.dec.stats()
		switch {
		case st.want == "" && (!errors.Is(err, model.ErrSoldOut) || len(after) != len(before)):
			t.Fatalf("%s: got %+v, %v after %d decisions; want %v without one", st.name, adm, err, len(after)-len(before), model.ErrSoldOut)
		case st.want != "" && (err != nil || adm.Result.Status != st.want):
			t.Fatalf("%s: got %+v, %v; want %s", st.name, adm, err, st.want)
		}
		if flag() != st.wantFlag {
			t.Fatalf("%s: got flag %v, want %v", st.name, flag(), st.wantFlag)
		}
	}
}

// TestDegradedRedisAnswers: a gateway nobody buys from after an outage
// ends it when told Redis answers: the campaign stops counting as decided
// in MySQL here. Told while Redis is still out, it changes nothing.
func TestDegradedRedisAnswers(t *testing.T) {
	b := newDegraded(t, model.Campaign{}, Options{Degrade: true})
	gauge := func() float64 { return testutil.ToFloat64(b.svc.m.Degraded.WithLabelValues("gateway")) }
	if adm, err := b.buy(t, "u1", "", 1); err != nil || adm.Result.Status != model.StatusSuccess {
		t.Fatalf("purchase in the outage: got %+v, %v; want success", adm, err)
	}
	b.svc.RedisAnswers()
	if g := gauge(); g != 1 {
		t.Fatalf("Redis still out: got gauge %v, want 1", g)
	}
	b.down.Store(false)
	b.svc.RedisAnswers()
	if g := gauge(); g != 0 || b.svc.degraded.marked.Load() {
		t.Fatalf("Redis back: got gauge %v, marked %v; want 0, false", g, b.svc.degraded.marked.Load())
	}
	if n := b.log.count("no longer deciding campaign in MySQL: Redis is back"); n != 1 {
		t.Errorf("got %d hand-back logs, want 1", n)
	}
}

// TestDegradedStats: while Redis is out the admin's stats of a campaign
// MySQL decides are MySQL's count; of one it does not, Redis's error.
func TestDegradedStats(t *testing.T) {
	b := newDegraded(t, model.Campaign{Stock: 3, PerUserLimit: 2}, Options{Degrade: true})
	if st, err := b.svc.Stats(t.Context(), b.c.ID); !errors.Is(err, model.ErrUnavailable) {
		t.Fatalf("before MySQL decides: got %+v, %v; want %v", st, err, model.ErrUnavailable)
	}
	for _, p := range []struct {
		user string
		want model.Status
	}{{"u1", model.StatusSuccess}, {"u2", model.StatusRejected}} {
		if adm, err := b.buy(t, p.user, "", 2); err != nil || adm.Result.Status != p.want {
			t.Fatalf("%s buys 2: got %+v, %v; want %s", p.user, adm, err, p.want)
		}
	}
	st, err := b.svc.Stats(t.Context(), b.c.ID)
	want := model.Stats{Loaded: true, Stock: 3, Sold: 2, Remaining: 1, Admitted: 2,
		FinishedByStatus: map[model.Status]int64{model.StatusSuccess: 1, model.StatusRejected: 1}}
	if err != nil || !st.InMySQL || !reflect.DeepEqual(st.Store, want) {
		t.Fatalf("while MySQL decides: got %+v, %v; want %+v from MySQL", st, err, want)
	}
	b.down.Store(false)
	if st, err := b.svc.Stats(t.Context(), b.c.ID); err != nil || st.InMySQL || st.Store.Stock != 3 {
		t.Fatalf("Redis back: got %+v, %v; want Redis's count", st, err)
	}
}

// firstSuccess returns the request id of user's first success.
func (m *memDecider) firstSuccess(user string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, r := range m.results {
		if r.UserID == user && r.Status == model.StatusSuccess {
			return id
		}
	}
	return ""
}

// TestDegradedRefusals: what is not decided in MySQL while Redis is out.
func TestDegradedRefusals(t *testing.T) {
	tests := []struct {
		name     string
		campaign model.Campaign
		opts     Options
		want     error
	}{
		// Its spent challenges live in Redis.
		{"challenge", model.Campaign{ChallengeBits: 8}, Options{Degrade: true}, model.ErrUnavailable},
		{"degrade off", model.Campaign{}, Options{}, model.ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newDegraded(t, tc.campaign, tc.opts)
			if adm, err := b.buy(t, "u1", "", 1); !errors.Is(err, tc.want) {
				t.Fatalf("got %+v, %v; want %v", adm, err, tc.want)
			}
			if takeOvers, batches := b.dec.stats(); takeOvers != 0 || len(batches) != 0 {
				t.Fatalf("got %d take-overs, %d decisions; want none", takeOvers, len(batches))
			}
		})
	}
}

// TestDegradedHandBack: a Decide that finds the campaign back in Redis
// sends its purchase the Redis path: 503 while Redis is out to this
// gateway, which then leaves the campaign to Redis until it sees Redis
// again; admitted to Redis and published when Redis answers. A later
// outage takes the campaign over again.
func TestDegradedHandBack(t *testing.T) {
	b := newDegraded(t, model.Campaign{Stock: 100, PerUserLimit: 100}, Options{Degrade: true})
	steps := []struct {
		name  string
		enter func()
		// want is the purchase's status, "" for admitted to Redis, or
		// its error.
		want    model.Status
		wantErr error
		// The counts after it: take-overs, Decide calls, Admit calls
		// (the Redis path) and publishes.
		wantCounts [4]int
	}{
		{name: "outage", want: model.StatusSuccess, wantCounts: [4]int{1, 1, 0, 0}},
		{name: "handed back, Redis still out", enter: b.dec.handBack, wantErr: model.ErrUnavailable, wantCounts: [4]int{1, 1, 0, 0}},
		{name: "left to Redis", wantErr: model.ErrUnavailable, wantCounts: [4]int{1, 1, 1, 0}},
		{name: "Redis back", enter: func() { b.down.Store(false) }, wantCounts: [4]int{1, 1, 2, 1}},
		{name: "next outage", enter: func() { b.down.Store(true) }, want: model.StatusSuccess, wantCounts: [4]int{2, 2, 2, 1}},
		{name: "Redis back while deciding", enter: func() { b.down.Store(false) }, wantCounts: [4]int{2, 2, 3, 2}},
		{name: "third outage", enter: func() { b.down.Store(true) }, want: model.StatusSuccess, wantCounts: [4]int{3, 3, 3, 2}},
		{name: "handed back as Redis answers again", enter: func() {
			b.dec.handBack()
			b.dec.onDecide = func() { b.down.Store(false) }
		}, wantCounts: [4]int{3, 3, 4, 3}},
	}
	for i, st := range steps {
		if st.enter != nil {
			st.enter()
		}
		adm, err := b.buy(t, fmt.Sprint("u", i), "", 1)
		switch {
		case st.wantErr != nil && !errors.Is(err, st.wantErr):
			t.Fatalf("%s: got %+v, %v; want %v", st.name, adm, err, st.wantErr)
		case st.wantErr == nil && (err != nil || adm.Result.Status != st.want):
			t.Fatalf("%s: got %+v, %v; want status %q", st.name, adm, err, st.want)
		}
		takeOvers, batches := b.dec.stats()
		if got := [4]int{takeOvers, len(batches), int(b.admits.Load()), len(b.pub.sizes())}; got != st.wantCounts {
			t.Fatalf("%s: got %v take-overs, decisions, admissions and publishes; want %v", st.name, got, st.wantCounts)
		}
	}
	logs := []struct {
		msg  string
		want int
	}{
		{"level=WARN msg=\"deciding campaign in MySQL: Redis is out\"", 3},
		{"level=INFO msg=\"no longer deciding campaign in MySQL", 3},
		{"no longer deciding campaign in MySQL: Redis is back", 1},
	}
	for _, l := range logs {
		if got := b.log.count(l.msg); got != l.want {
			t.Errorf("log %s: got %d, want %d", l.msg, got, l.want)
		}
	}
}
