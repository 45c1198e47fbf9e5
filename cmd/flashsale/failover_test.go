package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/redisstream"
)

// TestMasterKilledMidSale: gateway, worker and notifier on a private Redis
// Cluster (3 masters, with min_replicas_ack+1 replicas each); mid-sale, under load, the master of
// the campaign's slot is killed with SIGKILL and its replica takes over. No
// unit is oversold and no user holds more than the limit (MySQL), every
// admitted request ends with one final result that matches MySQL, and the
// shoppers who waited on a WebSocket through the failover get theirs.
//
// With redis.min_replicas_ack 1 no deduction whose result went out can be
// lost with the master, so Redis agrees with MySQL without a repair. With 0
// the last deductions before the kill may be lost (docs/RELIABILITY.md, "A
// Redis master lost"): Redis is then repaired from MySQL (reconcile
// --repair, after ending the sale), and agrees after it.
//
// The redisstream run keeps the queue in the same cluster: the partitions
// on the killed master fail over with it, and at min_replicas_ack 1 a
// purchase is answered 202 only once a replica holds its queue entry, so
// none of the accepted requests may be lost.
func TestMasterKilledMidSale(t *testing.T) {
	for _, run := range []struct {
		ack    int
		driver string
	}{{1, "memqueue"}, {0, "memqueue"}, {1, "redisstream"}} {
		name := "min_replicas_ack=" + strconv.Itoa(run.ack)
		if run.driver != "memqueue" {
			name += "/" + run.driver
		}
		t.Run(name, func(t *testing.T) { masterKilledMidSale(t, run.ack, run.driver) })
	}
}

func masterKilledMidSale(t *testing.T, ack int, driver string) {
	// The replica promoted must itself have ack replicas, or every
	// deduction after the failover falls short until the dead node returns
	// as a replica: a master gets ack+1 of them (docs/RELIABILITY.md).
	cl := testenv.PrivateCluster(t, 3, ack+1)
	cfg := realConfig(t, driver)
	cfg.Redis.Mode, cfg.Redis.Addr, cfg.Redis.Addrs = "cluster", "", cl.Addrs()
	cfg.Redis.ClusterReloadInterval = 500 * time.Millisecond
	cfg.Redis.MinReplicasAck, cfg.Redis.ReplicaAckTimeout = ack, time.Second
	// A request lost with the master ends rejected (lost) once the queue
	// passed it, or this long after the sale's end when nothing comes
	// after it (the test ends the sale then).
	cfg.Worker.MaxQueueDelay = 10 * time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := startSystem(t, cfg)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ClusterStateReloadInterval: 500 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })

	campaign := testenv.Name(t, "failover-")
	if driver == "redisstream" {
		// A campaign whose queue partition shares its master: the kill
		// takes the purchases' queue entries with the stock.
		for i := 0; !samePartitionMaster(t, rdb, cfg.Queue, campaign); i++ {
			if i == 200 {
				t.Fatal("no campaign id whose queue partition shares its master")
			}
			campaign = testenv.Name(t, "failover-")
		}
	}
	soak := testenv.Soak()
	stock, limit := int64(150*soak), int64(2)
	users, tries := 200*soak, 3 // demand outlasts the stock
	c.openCampaign(campaign, stock, limit)

	var (
		mu       sync.Mutex
		admitted = map[string]string{} // request id -> user
		codes    = map[int]int{}
		killed   atomic.Bool
		waiters  sync.WaitGroup
		pushed   = map[string]resultBody{} // results pushed to the WebSocket waiters
		waitErrs []error
	)
	shop := func(user string) {
		for done, attempts := 0, 0; done < tries && attempts < 400; attempts++ {
			code, rid := c.tryBuy(campaign, user)
			if code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests {
				done++
			}
			mu.Lock()
			codes[code]++
			if code == http.StatusAccepted {
				admitted[rid] = user
				// Some shoppers wait on a WebSocket across the kill.
				if !killed.Load() && len(admitted)%10 == 0 {
					waiters.Go(func() {
						// A subscription whose stored read failed (the
						// master is gone) is refused "unavailable": the
						// client subscribes again, as the protocol says.
						r, err := c.wsResult(user, rid, 90*time.Second)
						for end := time.Now().Add(60 * time.Second); err != nil && strings.Contains(err.Error(), "unavailable") && time.Now().Before(end); {
							time.Sleep(200 * time.Millisecond)
							r, err = c.wsResult(user, rid, 90*time.Second)
						}
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							waitErrs = append(waitErrs, fmt.Errorf("%s: %w", rid, err))
							return
						}
						pushed[rid] = r
					})
				}
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}
	wg := c.shopUntilSold(campaign, users, stock/3, shop)
	master, err := rdb.MasterForKey(context.Background(), "{"+campaign+"}")
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(master.Options().Addr[len("127.0.0.1:"):])
	killed.Store(true)
	if err := cl.Kill(port); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	testenv.Eventually(t, 60*time.Second, "the replica to take over", func() (bool, string) {
		m, err := rdb.MasterForKey(context.Background(), "{"+campaign+"}")
		if err != nil {
			return false, err.Error()
		}
		err = m.Ping(context.Background()).Err()
		return err == nil && m.Options().Addr != master.Options().Addr, m.Options().Addr + " " + fmt.Sprint(err)
	})
	tookOver := time.Since(killedAt)
	wg.Wait()
	// Every accepted request final, and MySQL holding what Redis sold.
	// Not Redis's queued count: an admission the dying master applied but
	// whose reply was lost was answered 503 (not accepted, never queued)
	// and stays counted as queued (docs/RELIABILITY.md).
	pending := map[string]string{}
	for rid, user := range admitted {
		pending[rid] = user
	}
	var st statsBody
	// lost: accepted requests whose every record (queued marker, queue
	// message) was on the dead master and never reached its replica: they
	// end rejected (lost), never 404. Only min_replicas_ack 0 allows them.
	lost := map[string]bool{}
	settled := func() (bool, string) {
		for rid, user := range pending {
			code, r := c.poll(user, rid)
			switch {
			case code == http.StatusOK && r.Status == "rejected" && r.Reason == "lost":
				lost[rid] = true
				delete(pending, rid)
			case code == http.StatusOK && r.Status != "queued":
				delete(pending, rid)
			}
		}
		st = c.stats(campaign)
		return len(pending) == 0 && st.UnitsInDB == st.Sold, fmt.Sprintf("%d not final; %+v", len(pending), st)
	}
	rc := reconcile.New(store.New(rdb), openOrders(t, cfg.Database))
	var before reconcile.Report
	repairTook := time.Duration(0)
	if ack == 0 {
		// The recovery of docs/RELIABILITY.md when the failover lost
		// writes (up to the whole campaign, when the replica had not
		// synced it yet): check; if Redis and MySQL differ, pause, repair
		// from MySQL, resume.
		ok, _ := settledWithin(20*time.Second, settled)
		var err error
		if before, err = rc.Check(context.Background(), campaign); err != nil {
			t.Fatal(err)
		}
		if !ok || !consistentBut(before, reconcile.KindStillQueued) {
			if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/pause", c.admin, nil, nil, nil); code != http.StatusOK && code != http.StatusServiceUnavailable {
				t.Fatalf("pause: got %d", code)
			}
			start := time.Now()
			_, after, err := rc.Repair(context.Background(), campaign)
			repairTook = time.Since(start)
			if err != nil || !consistentBut(after, reconcile.KindStillQueued) {
				t.Fatalf("repair: %+v, %v; want consistent", after.Differences, err)
			}
			if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/resume", c.admin, nil, nil, nil); code != http.StatusOK {
				t.Fatalf("resume: got %d", code)
			}
			// The shoppers are gone: no later request will pass the lost
			// ones, so the sale's end must tell (max_queue_delay after it).
			if ok, _ := settledWithin(10*time.Second, settled); !ok {
				if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/end", c.admin, nil, nil, nil); code != http.StatusOK {
					t.Fatalf("end: got %d", code)
				}
			}
		}
	}
	testenv.Eventually(t, 90*time.Second, "every accepted request final and stored", settled)
	waiters.Wait()

	perUser, total := unitsByUser(t, cfg.Database, campaign)
	if total > stock {
		t.Errorf("MySQL holds %d units of %d: oversold", total, stock)
	}
	for user, n := range perUser {
		if n > limit {
			t.Errorf("%s holds %d units, limit %d", user, n, limit)
		}
	}
	orders := c.ordersInDB(campaign)
	final := map[string]int{}
	if len(lost) > 0 {
		t.Logf("min_replicas_ack 0: %d accepted requests lost with the master's unreplicated writes (the window min_replicas_ack closes), ended rejected (lost)", len(lost))
		if ack > 0 {
			t.Errorf("min_replicas_ack %d: %d accepted requests lost, want none", ack, len(lost))
		}
	}
	for rid, user := range admitted {
		code, res := c.poll(user, rid)
		oid, ordered := orders[rid]
		if code != http.StatusOK || res.Status == "queued" {
			t.Errorf("%s: got %d %+v, want a final result", rid, code, res)
			continue
		}
		final[res.Status]++
		if (res.Status == "success") != ordered || (ordered && res.OrderID != oid) {
			t.Errorf("%s: result %s (order %q), MySQL order %q", rid, res.Status, res.OrderID, oid)
		}
		// A result decided without an order (a refusal) lives only in
		// Redis: one the master had not replicated is lost with it, and
		// its request ends rejected (lost) after a refusal was pushed.
		// Only min_replicas_ack 0 allows it; a success is never taken back.
		if p, ok := pushed[rid]; ok && (p.Status != res.Status || p.OrderID != res.OrderID) &&
			!(lost[rid] && ack == 0 && p.Status != "success") {
			t.Errorf("%s: pushed %s (order %q), polled %s (order %q)", rid, p.Status, p.OrderID, res.Status, res.OrderID)
		}
	}
	for _, err := range waitErrs {
		t.Errorf("WebSocket waiter: %v", err)
	}

	rep, err := rc.Check(context.Background(), campaign)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.Queued; n > 0 {
		t.Logf("%d admissions counted as queued without an accepted request (their reply was lost with the master)", n)
	}
	if !consistentBut(rep, reconcile.KindStillQueued) {
		t.Errorf("min_replicas_ack %d: Redis vs MySQL at the end: %+v, want no difference", ack, rep.Differences)
	}
	if ack > 0 {
		before = rep // checked once, with no repair before it
	}
	t.Logf("min_replicas_ack %d, stock %d: replica took over %s after the kill; sold %d (MySQL %d units); %d admitted, final %v; "+
		"%d pushed over WebSocket; differences before repair %d %v; repair %s; codes %v",
		ack, stock, tookOver.Round(time.Millisecond), st.Sold, total, len(admitted), final, len(pushed),
		len(before.Differences), before.Differences, repairTook.Round(time.Millisecond), codes)
}

func openOrders(t *testing.T, db config.Database) *sqlstore.DB {
	t.Helper()
	sdb, err := sqlstore.Open(context.Background(), db.Driver, db.DSN)
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	t.Cleanup(func() { _ = sdb.Close() })
	return sdb
}

// consistentBut reports whether rep has no difference but of kind.
func consistentBut(rep reconcile.Report, kind string) bool {
	for _, d := range rep.Differences {
		if d.Kind != kind {
			return false
		}
	}
	return true
}

// settledWithin polls cond for up to d.
func settledWithin(d time.Duration, cond func() (bool, string)) (bool, string) {
	end := time.Now().Add(d)
	for {
		ok, progress := cond()
		if ok || time.Now().After(end) {
			return ok, progress
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// samePartitionMaster reports whether campaign's keys and its queue
// partition's stream (cfg's topic) live on one master.
func samePartitionMaster(t *testing.T, rdb *redis.ClusterClient, cfg config.Queue, campaign string) bool {
	t.Helper()
	ctx := context.Background()
	m1, err := rdb.MasterForKey(ctx, "{"+campaign+"}")
	if err != nil {
		t.Fatal(err)
	}
	m2, err := rdb.MasterForKey(ctx, redisstream.StreamKey(cfg.Topic, queue.PartitionOf(campaign, cfg.Partitions)))
	if err != nil {
		t.Fatal(err)
	}
	return m1.Options().Addr == m2.Options().Addr
}
