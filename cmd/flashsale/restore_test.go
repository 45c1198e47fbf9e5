package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// wipe deletes the server's data (its AOF), so its next start is empty: a
// Redis that lost everything.
func (rs *redisServer) wipe() {
	rs.t.Helper()
	entries, err := os.ReadDir(rs.dir)
	if err != nil {
		rs.t.Errorf("wipe: %v", err)
		return
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(rs.dir, e.Name())); err != nil {
			rs.t.Errorf("wipe: %v", err)
		}
	}
}

// TestRedisRestartEmpty: the test's own Redis is SIGKILLed mid-sale and
// restarts empty; on redisstream it holds the queue too, on
// redisstream-own, memqueue and the RocketMQ double the queue survives.
// Nobody preloads: the first role to notice restores the campaign from
// MySQL, and the sale resumes by itself: purchases are answered 202 again
// and decided, nothing is oversold and nobody passes the limit. Every
// request admitted before the loss ends final too, read by its owner's
// poll: one whose state and message died with Redis ends rejected (lost).
// A success polled before the loss is polled the same after it.
func TestRedisRestartEmpty(t *testing.T) {
	testenv.SkipShort(t, "a fault test: Redis restarted empty mid-sale")
	for _, driver := range []string{"redisstream", "redisstream-own", "memqueue", "rocketmq"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			testRedisRestartEmpty(t, driver)
		})
	}
}

func testRedisRestartEmpty(t *testing.T, driver string) {
	rs := startRedisServer(t)
	cfg := faultConfig(t, driver, rs.addr())
	// The lost rule's ended bound, which the test waits out.
	cfg.Worker.MaxQueueDelay = 10 * time.Second
	c := startOn(t, cfg)
	campaign := testenv.Name(t, "restore-")
	const stock, limit, users = 300, 1, 600
	c.openCampaign(campaign, stock, limit)

	var (
		mu          sync.Mutex
		restartedAt time.Time // zero until Redis is back, empty
		admitted    = map[string]string{}
		after       = map[string]bool{} // admitted after the restart
		codes       = map[int]int{}
		resumed     time.Duration // from the restart to the first 202
	)
	restarted := make(chan struct{})
	var remainingAtKill int64
	var told map[string]resultBody // successes polled before the loss
	go func() {
		defer close(restarted)
		remainingAtKill = c.saleUnderway(campaign, stock)
		// A few shoppers poll their result just before the loss; more
		// would delay the kill past the sale's end.
		told = c.toldSuccesses(campaign, 10)
		rs.kill()
		rs.wipe()
		rs.start()
		mu.Lock()
		restartedAt = time.Now()
		mu.Unlock()
	}()
	// Shoppers try until answered other than 503 (or 429), as the browser
	// client does; 10 at a time, 100 ms apart, for 30 s at most (a sale
	// that never resumes).
	deadline := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Go(func() {
			for i := w; i < users && time.Now().Before(deadline); i += 10 {
				user := fmt.Sprintf("r%05d", i)
				for time.Now().Before(deadline) {
					code, rid := c.tryBuy(campaign, user)
					mu.Lock()
					codes[code]++
					if code == http.StatusAccepted {
						admitted[rid] = user
						after[rid] = !restartedAt.IsZero()
						if after[rid] && resumed == 0 {
							resumed = time.Since(restartedAt)
						}
					}
					mu.Unlock()
					time.Sleep(100 * time.Millisecond)
					if code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	<-restarted
	if remainingAtKill == 0 || remainingAtKill == stock {
		t.Fatalf("Redis was killed with %d of %d left: want mid-sale", remainingAtKill, stock)
	}
	for code := range codes {
		switch code {
		case http.StatusAccepted, http.StatusGone, http.StatusServiceUnavailable, http.StatusTooManyRequests:
		default:
			t.Errorf("unexpected status %d (codes %v)", code, codes)
		}
	}
	nAfter := 0
	for _, a := range after {
		if a {
			nAfter++
		}
	}
	// A queue that outlived Redis (all but redisstream) may bring back a
	// backlog that takes every unit before a new purchase comes: the sale
	// resumed all the same, which the undersell check below proves.
	if nAfter == 0 && driver == "redisstream" {
		t.Fatalf("no purchase admitted after Redis restarted empty (codes %v): the sale did not resume", codes)
	}

	// Every purchase admitted after the restart is decided.
	byStatus := map[string]int{}
	for rid, user := range admitted {
		if after[rid] {
			byStatus[c.waitFinal(user, rid, 60*time.Second).Status]++
		}
	}
	// A queue that outlived Redis (all but redisstream) brings the requests
	// admitted before the loss first, and they may take every unit left.
	if byStatus["success"] == 0 && driver == "redisstream" {
		t.Errorf("results after the restart %v: want successes, %d units were left at the kill", byStatus, remainingAtKill)
	}
	testenv.Eventually(t, 60*time.Second, "MySQL holds every unit Redis sold", func() (bool, string) {
		st := c.stats(campaign)
		return st.UnitsInDB == st.Sold, fmt.Sprintf("%+v", st)
	})
	perUser, total := unitsByUser(t, cfg.Database, campaign)
	if total < stock {
		t.Errorf("orders hold %d units, stock %d: 600 shoppers wanted more, undersold", total, stock)
	}
	if total > stock {
		t.Errorf("orders hold %d units, stock %d: oversold", total, stock)
	}
	for user, n := range perUser {
		if n > limit {
			t.Errorf("%s holds %d units, limit %d", user, n, limit)
		}
	}
	if n := c.metricSum("flashsale_restores_total", ""); n < 1 {
		t.Errorf("flashsale_restores_total: got %v, want the restore counted", n)
	}

	// Admitted before the loss: decided and stored (an order), decided
	// with the result lost with Redis, or never decided (its message lost
	// with the queue). Each ends final all the same: its order's success,
	// or rejected (lost) once the queue has passed it. Sold out, nothing
	// more is admitted to pass it, so the sale is ended: the lost rule
	// then holds worker.max_queue_delay after the end.
	if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/end", c.admin, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("end the sale: got %d, want 200", code)
	}
	unresolved := 0
	before := map[string]int{}
	for rid, user := range admitted {
		if after[rid] {
			continue
		}
		r := c.waitFinal(user, rid, cfg.Worker.MaxQueueDelay+30*time.Second)
		before[r.Status+"/"+r.Reason]++
		switch {
		case r.Status == "success", r.Status == "sold_out", r.Status == "limit_exceeded":
		case r.Status == "rejected" && (r.Reason == model.ReasonNotEnqueued || r.Reason == model.ReasonLost || r.Reason == model.ReasonEndedEarly):
		default:
			unresolved++
			t.Errorf("request %s admitted before the loss: got %s (%s), want success, sold_out, limit_exceeded or rejected (not_enqueued, lost, ended_early)", rid, r.Status, r.Reason)
		}
	}
	c.checkStillTold(told)
	t.Logf("admitted before the loss, by result: %v; %d successes polled before it", before, len(told))
	t.Logf("killed with %d of %d left; first 202 %v after the restart; %d units in orders; codes %v; %d admitted, %d after the restart (results %v); "+
		"%d admitted before the loss without a final result; restores %v",
		remainingAtKill, stock, resumed.Round(time.Millisecond), total, codes, len(admitted), nAfter, byStatus, unresolved,
		c.metricSum("flashsale_restores_total", ""))
}

// TestPollRestoresSoldOutCampaign: a sold-out campaign loses Redis while
// nobody buys (the gateways' sold-out flag refuses without asking Redis),
// so no purchase or batch notices. The first poll does: it restores the
// campaign from MySQL and reads queued, not 404, for a request whose
// result died; a success reads the same from its order; and the lost
// request ends rejected (lost) by the lost rule's aged bound (sold out,
// nothing admitted passes it), with no operator.
func TestPollRestoresSoldOutCampaign(t *testing.T) {
	testenv.SkipShort(t, "a fault test: Redis lost a sold-out campaign")
	rs := startRedisServer(t)
	cfg := faultConfig(t, "memqueue", rs.addr())
	cfg.Worker.MaxQueueDelay = 3 * time.Second // the lost rule's aged bound, waited out below
	c := startOn(t, cfg)
	campaign := testenv.Name(t, "pollrestore-")
	c.openCampaign(campaign, 2, 1)
	// a buys twice (the second passes the limit), then b: each purchase
	// finds a unit left whenever the worker decides the ones before it, so
	// none meets the sold-out flag.
	rids := map[string]string{} // request id -> user
	for _, user := range []string{"a", "a", "b"} {
		code, rid := c.tryBuy(campaign, user)
		if code != http.StatusAccepted {
			t.Fatalf("buy as %s: got %d, want 202", user, code)
		}
		rids[rid] = user
	}
	// Known from MySQL, not polled: a notifier keeps the final results
	// it served, which would answer the poll below without Redis.
	testenv.Eventually(t, 30*time.Second, "three decided", func() (bool, string) {
		st := c.stats(campaign)
		return st.Sold == 2 && st.UnitsInDB == 2 && st.Queued == 0, fmt.Sprintf("%+v", st)
	})
	orders := c.ordersInDB(campaign)
	var refused string // the request whose result dies with Redis
	for rid := range rids {
		if _, ok := orders[rid]; !ok {
			refused = rid
		}
	}
	if len(orders) != 2 || refused == "" {
		t.Fatalf("orders %v of requests %v: want two, and one refused", orders, rids)
	}
	flushAll(t, rs.addr())

	code, r := c.poll(rids[refused], refused)
	if code != http.StatusOK || r.Status != "queued" {
		t.Fatalf("poll after the loss: got %d %+v, want 200 queued while the campaign is restored", code, r)
	}
	testenv.Eventually(t, 10*time.Second, "the poll's restore", func() (bool, string) {
		n := c.metricSum("flashsale_restores_total", `trigger="poll"`)
		return n == 1, fmt.Sprintf("flashsale_restores_total{trigger=\"poll\"} %v", n)
	})
	for rid, user := range rids {
		if rid == refused {
			continue
		}
		if got := c.waitFinal(user, rid, 10*time.Second); got.Status != "success" || got.OrderID != orders[rid] {
			t.Errorf("%s's success after the loss: got %+v, want order %s", user, got, orders[rid])
		}
	}
	if got := c.waitFinal(rids[refused], refused, cfg.Worker.MaxQueueDelay+30*time.Second); got.Status != "rejected" || got.Reason != model.ReasonLost {
		t.Errorf("the refused request after the loss: got %+v, want rejected (%s)", got, model.ReasonLost)
	}
}
