package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// caseBlindCampaigns finds its campaign under any spelling of its id, as a
// MySQL table with a case-insensitive collation did.
type caseBlindCampaigns struct{ *memCampaigns }

func (m caseBlindCampaigns) Campaign(ctx context.Context, id string) (model.Campaign, error) {
	if strings.EqualFold(id, m.c.ID) {
		id = m.c.ID
	}
	return m.memCampaigns.Campaign(ctx, id)
}

// commandCounter counts the commands a Redis client sends.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// caseVariants returns n spellings of id other than id itself, each with a
// different set of its letters upper-cased.
func caseVariants(id string, n int) []string {
	var letters []int
	for i := 0; i < len(id); i++ {
		if 'a' <= id[i] && id[i] <= 'z' {
			letters = append(letters, i)
		}
	}
	out := make([]string, 0, n)
	for k := uint64(1); len(out) < n; k++ {
		b := []byte(id)
		for j, i := range letters {
			if k&(1<<j) != 0 {
				b[i] -= 'a' - 'A'
			}
		}
		out = append(out, string(b))
	}
	return out
}

// TestCampaignCacheUnderProbing: a crowd asking for thousands of spellings
// of a live campaign's id and of random ids, without a token, gets 404s,
// leaves the gateway's cache at one known campaign and a bounded number of
// unknown ids, sends Redis nothing, and does not make the periodic
// sold-out re-check read more than the live campaign's flag, during the
// probing or after it. The campaign's store ignores case, as MySQL did:
// the gateway alone must hold ids to their exact spelling. A shopper of the
// campaign is admitted throughout.
func TestCampaignCacheUnderProbing(t *testing.T) {
	var sent commandCounter
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(&sent)
	st := store.New(rdb)
	mem := &memCampaigns{c: model.Campaign{ID: testenv.Name(t, "probe-") + strings.Repeat("abcdefgh", 5), Name: "t",
		Stock: 100, PerUserLimit: 1, StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}}
	c := mustLoad(t, mem, st)
	t.Cleanup(func() {
		keys, _ := testenv.Redis(t).Keys(context.Background(), "fs:{"+c.ID+"}*").Result()
		if len(keys) > 0 {
			_ = testenv.Redis(t).Del(context.Background(), keys...).Err()
		}
	})
	m := metrics.New()
	svc := New(slog.New(slog.NewTextHandler(io.Discard, nil)), st, caseBlindCampaigns{mem}, newGatePublisher(false), m,
		Options{Topic: "t", AdmitConcurrency: 1})
	one := func() (int64, string, error) { return 1, "", nil }
	shopper := 0
	buy := func() {
		t.Helper()
		shopper++
		if _, err := svc.Purchase(t.Context(), Purchase{UserID: fmt.Sprintf("shopper%d", shopper), CampaignID: c.ID}, one); err != nil {
			t.Fatalf("purchase of shopper%d: %v", shopper, err)
		}
	}
	buy()

	const probes = 3000
	ids := caseVariants(c.ID, probes)
	for range probes {
		ids = append(ids, testenv.Name(t, "r"))
	}
	sent.n.Store(0)
	mem.reads.Store(0)
	start := time.Now()
	for i, id := range ids {
		if _, err := svc.Campaign(t.Context(), id); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("GET campaign %s: got %v, want %v", id, err, model.ErrNotFound)
		}
		if i%100 == 0 {
			if _, err := svc.Purchase(t.Context(), Purchase{UserID: "bot", CampaignID: id}, one); !errors.Is(err, model.ErrNotFound) {
				t.Fatalf("purchase in %s: got %v, want %v", id, err, model.ErrNotFound)
			}
		}
	}
	if n := sent.n.Load(); n != 0 {
		t.Fatalf("probing sent %d Redis commands, want 0", n)
	}
	// MySQL: the directory of ids, once per cache TTL, and no read per id.
	ttls := int64(time.Since(start)/svc.opts.CampaignCacheTTL) + 1
	if n := mem.reads.Load(); n > ttls {
		t.Fatalf("probing %d ids made %d MySQL reads, want at most %d (one directory read per campaign cache TTL)", len(ids), n, ttls)
	}
	known, unknown := svc.cache.len()
	if known != 1 || unknown > svc.opts.CachedUnknownIDs {
		t.Fatalf("cache after %d probes: got %d known, %d unknown; want 1, at most %d", len(ids), known, unknown, svc.opts.CachedUnknownIDs)
	}
	for kind, want := range map[string]int{"known": known, "unknown": unknown} {
		if got := testutil.ToFloat64(m.CachedCampaigns.WithLabelValues(kind)); got != float64(want) {
			t.Errorf("metric %s: got %v, want %d", kind, got, want)
		}
	}

	sent.n.Store(0)
	svc.recheckSoldOut(t.Context())
	if n := sent.n.Load(); n != 1 {
		t.Fatalf("sold-out re-check after probing: got %d Redis commands, want 1 (the live campaign's flag)", n)
	}
	buy()
}

// TestCampaignCacheSizes: past the bound of unknown ids, the oldest make
// room; past the bound of known campaigns, one makes room; a campaign
// first asked for while unknown ids churn is still found and kept.
func TestCampaignCacheSizes(t *testing.T) {
	c := newCampaignCache(2, 3, metrics.New().CachedCampaigns)
	found := func(id string) {
		cc := c.getOrAdd(id)
		cc.snap.Store(&campaignSnapshot{campaign: model.Campaign{ID: id}})
		c.promote(cc)
	}
	first := c.getOrAdd("first")
	for i := range 10 {
		c.getOrAdd(fmt.Sprintf("u%d", i))
	}
	if known, unknown := c.len(); known != 0 || unknown != 3 {
		t.Fatalf("after 11 unknown ids: got %d known, %d unknown; want 0, 3", known, unknown)
	}
	if c.get("first") != nil || c.get("u6") != nil || c.get("u9") == nil {
		t.Fatalf("kept the wrong unknown ids: first %v, u6 %v, u9 %v", c.get("first") != nil, c.get("u6") != nil, c.get("u9") != nil)
	}
	// A load that found "first" after its entry was pushed out still keeps it.
	first.snap.Store(&campaignSnapshot{campaign: model.Campaign{ID: "first"}})
	c.promote(first)
	if c.get("first") != first {
		t.Fatal("first not kept after its load found it")
	}
	found("second")
	found("third")
	// Each took a slot of the unknown ring on its way in: only u9 is left.
	if known, unknown := c.len(); known != 2 || unknown != 1 || c.get("u9") == nil {
		t.Fatalf("after 3 known campaigns: got %d known, %d unknown (u9 %v); want 2, 1 (u9)", known, unknown, c.get("u9") != nil)
	}
	if c.get("third") == nil {
		t.Fatal("the campaign just found was dropped")
	}
}

// failingDirectory is a store whose campaign ids cannot be read.
type failingDirectory struct {
	*memCampaigns
	idReads atomic.Int64
}

func (f *failingDirectory) CampaignIDs(context.Context, int) ([]string, error) {
	f.idReads.Add(1)
	return nil, errors.New("mysql: connection refused")
}

// TestDirectoryUnreadable: while the campaign ids cannot be read, unknown
// ids are looked up one by one (answered not found, and the campaign
// found), and the directory is tried again once per cache TTL, not at
// every id.
func TestDirectoryUnreadable(t *testing.T) {
	st := store.New(testenv.Redis(t))
	mem := &memCampaigns{c: model.Campaign{ID: testenv.Name(t, "dir-"), Name: "t", Stock: 10, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}}
	mustLoad(t, mem, st)
	f := &failingDirectory{memCampaigns: mem}
	svc := New(slog.New(slog.NewTextHandler(io.Discard, nil)), st, f, newGatePublisher(false), metrics.New(),
		Options{Topic: "t", AdmitConcurrency: 1, CampaignCacheTTL: time.Hour})
	for i := range 100 {
		if _, err := svc.Campaign(t.Context(), fmt.Sprintf("%s-%d", mem.c.ID, i)); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("unknown id %d: got %v, want %v", i, err, model.ErrNotFound)
		}
	}
	if _, err := svc.Campaign(t.Context(), mem.c.ID); err != nil {
		t.Fatalf("the campaign: %v", err)
	}
	if n := f.idReads.Load(); n != 1 {
		t.Fatalf("directory reads: got %d, want 1 within the TTL", n)
	}
}
