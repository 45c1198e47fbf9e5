package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// bucketHistory reads, in one atomic script, the given buckets' units
// (remaining, plus those taken by a transfer not yet given) and the
// sold_out results decided so far. It knows the keyspace of
// internal/store (fs:{tag}:stock, counters, xpend, xfer) on purpose: it is
// the test's own view of Redis, independent of the code under test.
var bucketHistory = redis.NewScript(`
local units, soldout = 0, 0
for i = 1, #KEYS, 4 do
  units = units + tonumber(redis.call('GET', KEYS[i]) or '0')
  soldout = soldout + tonumber(redis.call('HGET', KEYS[i + 1], 'fin:sold_out') or '0')
  for _, id in ipairs(redis.call('SMEMBERS', KEYS[i + 2])) do
    local v = redis.call('HGET', KEYS[i + 3], id) or ''
    units = units + tonumber(string.match(v, '^[^|]*|([^|]*)|') or '0')
  end
end
return { units, soldout }`)

// TestWholePathBuckets: the whole-path sale with the stock in 1, 4 and 16
// buckets, on one Redis and on the test cluster, with a skewed crowd (60%
// of the requests from shoppers of bucket 0, which empties first): exactly
// the stock is sold, the per-user limit holds, and, in the recorded history
// of samples of every bucket, no sold_out result exists while any bucket (or
// a transfer in flight) still holds a unit.
func TestWholePathBuckets(t *testing.T) {
	for _, mode := range []string{"single", "cluster"} {
		for _, buckets := range []int{1, 4, 16} {
			t.Run(fmt.Sprintf("%s/buckets=%d", mode, buckets), func(t *testing.T) {
				testWholePathBuckets(t, mode, buckets)
			})
		}
	}
}

func testWholePathBuckets(t *testing.T, mode string, buckets int) {
	cfg := realConfig(t, "redisstream")
	cfg.Gateway.UserRate, cfg.Gateway.UserBurst = 100, 100
	var rdb redis.UniversalClient
	if mode == "cluster" {
		cfg.Redis.Mode, cfg.Redis.Addr, cfg.Redis.Addrs = "cluster", "", testenv.ClusterAddrs(t)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: cfg.Redis.Addrs})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
	}
	t.Cleanup(func() { _ = rdb.Close() })
	c := startSystem(t, cfg)
	campaign := testenv.Name(t, "bk-")
	const stock, limit = 100, 2
	c.openCampaignOf(campaignBody{ID: campaign, Name: "Test " + campaign, Stock: stock, PerUserLimit: limit,
		StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour), Buckets: buckets})

	var keys [][]string // per bucket: its stock, counters, xpend, xfer
	for b := range max(buckets, 1) {
		p := "fs:{" + model.BucketTag(campaign, b, buckets) + "}:"
		keys = append(keys, []string{p + "stock", p + "counters", p + "xpend", p + "xfer"})
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok && buckets == 16 {
		masters := map[string]bool{}
		for _, k := range keys {
			m, err := cc.MasterForKey(t.Context(), k[0])
			if err != nil {
				t.Fatal(err)
			}
			masters[m.Options().Addr] = true
		}
		if len(masters) < 3 {
			t.Fatalf("16 buckets landed on %d masters, want all 3", len(masters))
		}
	}
	var samples, violations atomic.Int64
	var firstViolation atomic.Value
	ctx, stop := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for ctx.Err() == nil {
			units, soldout, err := sampleBuckets(ctx, rdb, keys)
			if err != nil {
				continue
			}
			samples.Add(1)
			if units > 0 && soldout > 0 {
				violations.Add(1)
				firstViolation.CompareAndSwap(nil, fmt.Sprintf("%d units held, %d sold_out answered", units, soldout))
			}
		}
	}()
	st, buyer, orderID := runSkewedSale(t, c, campaign, stock, limit, buckets)
	stop()
	<-sampled
	if n := violations.Load(); n > 0 {
		t.Errorf("%d of %d samples saw sold_out answered while stock remained (first: %v)", n, samples.Load(), firstViolation.Load())
	}
	if st.Sold != stock || st.Remaining != 0 {
		t.Errorf("sold %d, %d remaining; want exactly %d sold (demand exceeded stock: no undersell)", st.Sold, st.Remaining, stock)
	}
	t.Logf("%d history samples", samples.Load())
	reconcileAgrees(t, cfg, campaign)

	// A cancelled order's unit goes back to its buyer's bucket,
	// once, and the campaign is on sale again: a shopper of
	// another bucket buys it (moved by a transfer).
	ctx = t.Context()
	buyerStock := "fs:{" + model.BucketTag(campaign, model.BucketOf(buyer, buckets), buckets) + "}:stock"
	for i := range 2 {
		// A repeated cancel answers as the first (idempotent) and
		// must give nothing back again.
		if code, _ := c.orderAction(c.token(buyer), orderID, "cancel"); code != http.StatusOK {
			t.Fatalf("cancel %d: got %d, want 200", i+1, code)
		}
		if n, err := rdb.Get(ctx, buyerStock).Int64(); err != nil || n != 1 {
			t.Fatalf("cancel %d: buyer's bucket holds %d (%v), want 1", i+1, n, err)
		}
		if st := c.stats(campaign); st.Remaining != 1 || st.SoldOut {
			t.Fatalf("cancel %d: stats %+v, want 1 remaining, not sold out", i+1, st)
		}
	}
	other := "late-" + buyer
	for b := 0; model.BucketOf(other, buckets) == model.BucketOf(buyer, buckets) && buckets > 1; b++ {
		other = fmt.Sprintf("late%d-%s", b, buyer)
	}
	var p purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(other), map[string]int{"quantity": 1}, nil, &p); code != http.StatusAccepted {
		t.Fatalf("purchase after the release: got %d (%s), want 202", code, p.Code)
	}
	if r, err := c.wsResult(other, p.RequestID, 30*time.Second); err != nil || r.Status != "success" {
		t.Fatalf("purchase after the release: got %+v, %v; want success", r, err)
	}
	if st := c.stats(campaign); st.Remaining != 0 || st.Sold != stock {
		t.Fatalf("after the resale: stats %+v, want all %d sold", st, stock)
	}
	reconcileAgrees(t, cfg, campaign)

	// The ledger rebuild writes every bucket from MySQL under a
	// new epoch (each order's units in its buyer's bucket, the
	// cancelled one released there), and the campaign stays one.
	if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/pause", c.admin, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("pause: got %d", code)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"reconcile", "--campaign", campaign, "--repair"}, &out, commandEnv(cfg), logTo(io.Discard)); err != nil {
		t.Fatalf("repair: %v\n%s", err, out.String())
	}
	reconcileAgrees(t, cfg, campaign)
	if st := c.stats(campaign); st.Remaining != 0 || st.Sold != stock || !st.SoldOut {
		t.Fatalf("after the rebuild: stats %+v, want all %d sold, sold out", st, stock)
	}
}

// sampleBuckets returns the units the buckets hold (with transfers in
// flight) and the sold_out results answered. On one Redis all buckets are
// read in one script, atomically. On a cluster they live on several
// masters, so the sold_out counts are read first, then the units: during
// the sale units only go down (no release runs, a transfer keeps its units
// counted on its donor until settled), so units seen after a sold_out was
// seen were there when it was answered.
func sampleBuckets(ctx context.Context, rdb redis.UniversalClient, keys [][]string) (units, soldout int64, err error) {
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		v, err := bucketHistory.Run(ctx, rdb, slices.Concat(keys...)).Int64Slice()
		if err != nil {
			return 0, 0, err
		}
		return v[0], v[1], nil
	}
	for _, k := range keys {
		v, err := bucketHistory.Run(ctx, rdb, k).Int64Slice()
		if err != nil {
			return 0, 0, err
		}
		soldout += v[1]
	}
	for _, k := range keys {
		v, err := bucketHistory.Run(ctx, rdb, k).Int64Slice()
		if err != nil {
			return 0, 0, err
		}
		units += v[0]
	}
	return units, soldout, nil
}

// runSkewedSale fires 1,200 purchases from 900 shoppers (150 send 3), 60%
// of them from shoppers whose bucket is 0, and checks every invariant once
// the system settles.
// It returns the settled stats and one buyer with their order.
func runSkewedSale(t *testing.T, c *client, campaign string, stock, limit int64, buckets int) (st statsBody, buyer, orderID string) {
	t.Helper()
	next := make([]int, max(buckets, 1)) // per bucket: the next candidate name
	pick := func(b int) string {
		for {
			u := fmt.Sprintf("s%d-%05d", b, next[b])
			next[b]++
			if model.BucketOf(u, buckets) == b {
				return u
			}
		}
	}
	var users []string
	for i := range 900 {
		b := 0
		if i%10 >= 6 {
			b = i % max(buckets, 1)
		}
		u := pick(b)
		users = append(users, u)
		if i < 150 {
			users = append(users, u, u)
		}
	}
	outcomes := c.fireAll(campaign, users, 30*time.Second)

	st = c.settle(campaign, 90*time.Second)
	admitted := map[string]string{}
	for _, o := range outcomes {
		switch {
		case o.status == http.StatusAccepted:
			admitted[o.requestID] = o.user
			if o.wsResult != nil && o.wsErr != nil {
				t.Errorf("ws %s: %v", o.requestID, o.wsErr)
			}
		case o.status == http.StatusGone && o.code == "sold_out":
		default:
			t.Errorf("user %s: got status %d (%s), want 202 or 410 sold_out", o.user, o.status, o.code)
		}
	}
	byStatus := verifySettled(t, c, campaign, stock, limit, admitted, st)
	t.Logf("admitted %d, results %v", len(admitted), byStatus)
	for rid, u := range admitted {
		if _, r := c.poll(u, rid); r.Status == "success" {
			return st, u, r.OrderID
		}
	}
	t.Fatal("no success among the admitted requests")
	return
}

// reconcileAgrees runs `flashsale reconcile` on campaign: Redis (the
// buckets' sum) and MySQL must agree.
func reconcileAgrees(t *testing.T, cfg config.Config, campaign string) {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), []string{"reconcile", "--campaign", campaign}, &out, commandEnv(cfg), logTo(io.Discard))
	if err != nil || !strings.Contains(out.String(), "0 differences") {
		t.Fatalf("reconcile: got %v\n%s\nwant agreement", err, out.String())
	}
}
