package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
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
func TestMasterKilledMidSale(t *testing.T) {
	for _, ack := range []int{1, 0} {
		t.Run("min_replicas_ack="+strconv.Itoa(ack), func(t *testing.T) { masterKilledMidSale(t, ack) })
	}
}

func masterKilledMidSale(t *testing.T, ack int) {
	// The replica promoted must itself have ack replicas, or every
	// deduction after the failover falls short until the dead node returns
	// as a replica: a master gets ack+1 of them (docs/RELIABILITY.md).
	cl := testenv.PrivateCluster(t, 3, ack+1)
	cfg := realConfig(t, "memqueue") // the queue is not what this test kills
	cfg.Redis.Mode, cfg.Redis.Addr, cfg.Redis.Addrs = "cluster", "", cl.Addrs()
	cfg.Redis.ClusterReloadInterval = 500 * time.Millisecond
	cfg.Redis.MinReplicasAck, cfg.Redis.ReplicaAckTimeout = ack, time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := startSystem(t, cfg)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ClusterStateReloadInterval: 500 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })

	campaign := testenv.Name(t, "failover-")
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
						r, err := c.wsResult(user, rid, 90*time.Second)
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
	var wg sync.WaitGroup
	next := make(chan string)
	for range 16 {
		wg.Go(func() {
			for user := range next {
				shop(user)
			}
		})
	}
	go func() {
		for i := range users {
			next <- fmt.Sprintf("s%04d", i)
		}
		close(next)
	}()

	deadline := time.Now().Add(60 * time.Second)
	for c.stats(campaign).Sold < stock/3 {
		if time.Now().After(deadline) {
			t.Fatalf("a third of the stock not sold within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
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
	st := c.settle(campaign, 90*time.Second)
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
		if p, ok := pushed[rid]; ok && (p.Status != res.Status || p.OrderID != res.OrderID) {
			t.Errorf("%s: pushed %s (order %q), polled %s (order %q)", rid, p.Status, p.OrderID, res.Status, res.OrderID)
		}
	}
	for _, err := range waitErrs {
		t.Errorf("WebSocket waiter: %v", err)
	}

	rc := reconcile.New(store.New(rdb), openOrders(t, cfg.Database))
	rep, err := rc.Check(context.Background(), campaign)
	if err != nil {
		t.Fatal(err)
	}
	repairTook := time.Duration(0)
	if ack > 0 {
		if !rep.Consistent() {
			t.Errorf("min_replicas_ack %d: Redis vs MySQL after the failover: %+v, want no difference", ack, rep.Differences)
		}
	} else if !rep.Consistent() {
		// The lost-writes window: end the sale (no worker decides) and
		// rebuild Redis from MySQL.
		if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/end", c.admin, nil, nil, nil); code != http.StatusOK {
			t.Fatalf("end: got %d", code)
		}
		start := time.Now()
		_, after, err := rc.Repair(context.Background(), campaign)
		repairTook = time.Since(start)
		if err != nil || !after.Consistent() {
			t.Errorf("repair: %+v, %v; want consistent", after.Differences, err)
		}
	}
	t.Logf("min_replicas_ack %d, stock %d: replica took over %s after the kill; sold %d (MySQL %d units); %d admitted, final %v; "+
		"%d pushed over WebSocket; differences before repair %d %v; repair %s; codes %v",
		ack, stock, tookOver.Round(time.Millisecond), st.Sold, total, len(admitted), final, len(pushed),
		len(rep.Differences), rep.Differences, repairTook.Round(time.Millisecond), codes)
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
