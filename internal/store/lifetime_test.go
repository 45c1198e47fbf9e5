package store

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// campaignKeyTTLs returns the TTL of every key of a campaign by its name
// after the hash tag ("meta", "rl:users"); a key without expiry is -1.
func campaignKeyTTLs(t *testing.T, s *Store, campaignID string) map[string]time.Duration {
	t.Helper()
	prefix := "fs:{" + campaignID + "}:"
	node := s.rdb
	if c, ok := s.rdb.(*redis.ClusterClient); ok { // KEYS reads one node: the campaign's master
		m, err := c.MasterForKey(t.Context(), prefix)
		if err != nil {
			t.Fatalf("master of %s: %v", campaignID, err)
		}
		node = m
	}
	names, err := node.Keys(t.Context(), prefix+"*").Result()
	if err != nil {
		t.Fatalf("keys of %s: %v", campaignID, err)
	}
	out := map[string]time.Duration{}
	for _, k := range names {
		ttl, err := s.rdb.TTL(t.Context(), k).Result()
		if err != nil {
			t.Fatalf("TTL %s: %v", k, err)
		}
		out[strings.TrimPrefix(k, prefix)] = ttl
	}
	return out
}

// checkLifetimes: every key of the campaign exists and expires at want,
// give or take the test's own duration, but for the campaign rate limit,
// which keeps its shorter expiry.
func checkLifetimes(t *testing.T, s *Store, campaignID string, names []string, want time.Time, took time.Duration) {
	t.Helper()
	got := campaignKeyTTLs(t, s, campaignID)
	for _, name := range names {
		if _, ok := got[name]; !ok {
			t.Errorf("key %s: missing (keys: %v)", name, got)
		}
	}
	for name, ttl := range got {
		if name == "rl:all" {
			if ttl <= 0 || ttl > time.Minute {
				t.Errorf("key rl:all: TTL %v, want its own short one", ttl)
			}
			continue
		}
		left := time.Until(want)
		if ttl < left-took-2*time.Second || ttl > left+2*time.Second {
			t.Errorf("key %s: TTL %v, want %v (expiring at %s)", name, ttl, left, want.Format(time.RFC3339))
		}
	}
}

// TestKeysExpireWithCampaign: every key of a campaign, whichever script
// creates it (a load, admitting with an Idempotency-Key and every rate
// limit, deciding to the sold-out flag, a rejection, a release), expires
// once the sale is long over: the retention after its end plus the payment
// window, never while it sells or its orders may still be paid. Each case
// starts from a load that did not create the keys it checks.
func TestKeysExpireWithCampaign(t *testing.T) {
	const retention = 48 * time.Hour
	tests := []struct {
		name string
		// orders builds the load's orders; run then works the sale.
		orders func(l *labels) []model.Order
		run    func(t *testing.T, s *Store, c model.Campaign, l *labels)
		keys   []string
	}{
		{name: "load", orders: func(l *labels) []model.Order {
			return []model.Order{
				{ID: "o-active", RequestID: l.rid("active"), CampaignID: l.campaignID, UserID: "ann", Quantity: 1, Status: model.OrderPendingPayment},
				{ID: "o-ended", RequestID: l.rid("ended"), CampaignID: l.campaignID, UserID: "bob", Quantity: 1, Status: model.OrderExpired},
			}
		}, keys: []string{"meta", "stock", "counters", "users", "results", "released"}},
		{name: "admit", run: func(t *testing.T, s *Store, c model.Campaign, l *labels) {
			limits := model.RateLimits{UserRate: 100, UserBurst: 100, CampaignRate: 100, CampaignBurst: 100, IPRate: 100, IPBurst: 100}
			replies, err := s.Admit(t.Context(), c.ID, []model.AdmitRequest{{RequestID: l.rid("r1"), CampaignID: c.ID,
				UserID: "cid", Quantity: 1, IdempotencyKey: "k1", ClientIP: "192.0.2.1"}}, limits)
			if err != nil || replies[0].Code != model.Admitted {
				t.Fatalf("Admit: got %+v, %v; want admitted", replies, err)
			}
		}, keys: []string{"meta", "stock", "counters", "results", "idem", "rl:all", "rl:users", "rl:ips"}},
		{name: "deduct", run: func(t *testing.T, s *Store, c model.Campaign, l *labels) {
			r := mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: l.rid("r1"), UserID: "dee", Quantity: 3, OrderID: "o-r1"}})
			if r.Results[0].Status != model.StatusSuccess || !r.SoldOutNow {
				t.Fatalf("Deduct: got %+v, want a success that sells out", r)
			}
		}, keys: []string{"meta", "stock", "counters", "results", "users", "soldout"}},
		{name: "reject", run: func(t *testing.T, s *Store, c model.Campaign, l *labels) {
			if _, err := s.Reject(t.Context(), model.Deduction{RequestID: l.rid("poison"), UserID: "eve", Quantity: 1}, c.ID, "bad_message"); err != nil {
				t.Fatalf("Reject: %v", err)
			}
		}, keys: []string{"meta", "stock", "counters", "results"}},
		// The load sells out; the order is cancelled after it.
		{name: "release, then sold out again", orders: func(l *labels) []model.Order {
			return []model.Order{{ID: "o-all", RequestID: l.rid("all"), CampaignID: l.campaignID, UserID: "fay", Quantity: 3, Status: model.OrderPendingPayment}}
		}, run: func(t *testing.T, s *Store, c model.Campaign, l *labels) {
			if ok, err := s.Release(t.Context(), c.ID, "o-all", "fay", 3); err != nil || !ok {
				t.Fatalf("Release: got %v, %v; want released", ok, err)
			}
			r := mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: l.rid("again"), UserID: "gus", Quantity: 3, OrderID: "o-again"}})
			if r.Results[0].Status != model.StatusSuccess || !r.SoldOutNow {
				t.Fatalf("Deduct after the release: got %+v, want a success that sells out again", r)
			}
		}, keys: []string{"meta", "stock", "counters", "results", "users", "released", "soldout"}},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		WithKeyRetention(retention)(s)
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				began := time.Now()
				c := newCampaign(t, 3, 3)
				c.StartAt, c.EndAt, c.PaymentWindow = began.Add(-time.Minute), began.Add(time.Hour), 15*time.Minute
				l := newLabels(c.ID)
				var orders []model.Order
				if tc.orders != nil {
					orders = tc.orders(l)
				}
				mustRebuild(t, s, c, orders)
				if tc.run != nil {
					tc.run(t, s, c, l)
				}
				checkLifetimes(t, s, c.ID, tc.keys, c.EndAt.Add(c.PaymentWindow+retention), time.Since(began))
			})
		}
	})
}

// TestLateLoadKeepsKeys: a load after the sale is long over (a rebuild to
// decide what its queue still held) keeps its keys for the retention from
// the load, instead of writing keys that are gone at once.
func TestLateLoadKeepsKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		began := time.Now()
		c := newCampaign(t, 5, 1)
		c.StartAt, c.EndAt = began.Add(-60*24*time.Hour), began.Add(-30*24*time.Hour)
		mustLoad(t, s, c)
		want := began.Add(model.DefaultPaymentWindow + DefaultKeyRetention)
		checkLifetimes(t, s, c.ID, []string{"meta", "stock", "counters"}, want, time.Since(began))
		if st := mustStats(t, s, c.ID); !st.Loaded || st.Remaining != 5 {
			t.Fatalf("after a late load: got %+v, want loaded with 5 remaining", st)
		}
	})
}

// TestExpireAt: a campaign's keys expire the retention after its end and
// payment window, or after the load when that is later, rounded up to the
// second.
func TestExpireAt(t *testing.T) {
	s := New(nil, WithKeyRetention(time.Hour))
	end := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	c := model.Campaign{EndAt: end, PaymentWindow: 10 * time.Minute}
	tests := []struct {
		name string
		c    model.Campaign
		now  time.Time
		want time.Time
	}{
		{"during the sale", c, end.Add(-time.Hour), end.Add(70 * time.Minute)},
		{"default payment window", model.Campaign{EndAt: end}, end.Add(-time.Hour), end.Add(model.DefaultPaymentWindow + time.Hour)},
		{"loaded after the end", c, end.Add(5 * time.Hour), end.Add(5*time.Hour + 70*time.Minute)},
		{"rounded up", c, end.Add(5*time.Hour + time.Millisecond), end.Add(5*time.Hour + 70*time.Minute + time.Second)},
	}
	for _, tc := range tests {
		if got := s.expireAt(tc.c, tc.now); got != tc.want.Unix() {
			t.Errorf("%s: got %s, want %s", tc.name, time.Unix(got, 0).UTC(), tc.want)
		}
	}
}
