package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// TestLaggingReplicaFailover: on a real Redis Cluster, a campaign's master
// dies while its replica lags a load behind (the replica stopped before a
// forced reload and the sales after it; then the master is SIGKILLed and
// the replica, resumed, takes over). Redis then holds the older epoch:
// what workers decide against it MySQL refuses (model.ErrLedgerMoved), so
// nothing is sold twice; the operator's preload rebuilds the campaign from
// MySQL under a new epoch, after which Redis agrees with MySQL and the sale
// goes on, never selling more than the stock.
func TestLaggingReplicaFailover(t *testing.T) {
	cl := testenv.PrivateCluster(t, 3, 1)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	st := store.New(rdb)
	db, err := sqlstore.Open(t.Context(), sqlstore.DriverMySQL, testenv.MySQLDSN(t))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	const stock = 10
	c := model.Campaign{ID: testenv.Name(t, "lag-"), Name: "lag", Stock: stock, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Minute).Truncate(time.Second), EndAt: time.Now().Add(time.Hour).Truncate(time.Second)}
	if _, err := db.CreateCampaign(t.Context(), c); err != nil {
		t.Fatalf("create: %v", err)
	}
	users := 0
	// sell decides n new shoppers' purchases in Redis and stores their
	// orders under the epoch Redis decided them in, as the worker does.
	sell := func(n int) (model.DeductReply, error) {
		t.Helper()
		var batch []model.Deduction
		for range n {
			users++
			rid := model.FormatRequestID(c.ID, fmt.Sprintf("%032x", users))
			batch = append(batch, model.Deduction{RequestID: rid, UserID: fmt.Sprintf("u%d", users), Quantity: 1, OrderID: model.OrderIDOf(rid)})
		}
		reply, err := st.Deduct(t.Context(), c.ID, batch)
		if err != nil {
			t.Fatalf("deduct: %v", err)
		}
		var orders []model.Order
		for _, r := range reply.Results {
			if r.Status == model.StatusSuccess {
				orders = append(orders, model.Order{ID: r.OrderID, RequestID: r.RequestID, CampaignID: c.ID,
					UserID: r.UserID, Quantity: r.Quantity, Status: model.OrderPendingPayment})
			}
		}
		return reply, db.InsertOrders(t.Context(), orders, model.Epochs{c.ID: reply.Epoch})
	}
	mustSell := func(n int) {
		t.Helper()
		if _, err := sell(n); err != nil {
			t.Fatalf("sell %d: %v", n, err)
		}
	}
	load := func() model.Campaign {
		t.Helper()
		loaded, err := Load(t.Context(), db, st, c.ID)
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		return loaded
	}

	first := load()
	mustSell(3)
	master, err := rdb.MasterForKey(t.Context(), "fs:{"+c.ID+"}:meta")
	if err != nil {
		t.Fatal(err)
	}
	replicated(t, master, c.ID)
	// The replica stopped, and its link cut: a stopped process's kernel
	// still takes in what its master sends, and the replica would apply it
	// on waking.
	resume := cl.StopReplicaOf(t, master)
	if err := master.ClientKillByFilter(t.Context(), "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	second := load() // forced: the replica never sees it
	mustSell(3)
	if second.Epoch <= first.Epoch {
		t.Fatalf("epochs: %d then %d, want a newer one", first.Epoch, second.Epoch)
	}

	_, port, _ := net.SplitHostPort(master.Options().Addr)
	p, _ := strconv.Atoi(port)
	if err := cl.Kill(p); err != nil {
		t.Fatal(err)
	}
	resume()
	var proj model.Projection
	testenv.Eventually(t, 60*time.Second, "the replica serving the campaign", func() (bool, string) {
		rdb.ReloadState(t.Context())
		proj, err = st.Projection(t.Context(), c.ID)
		return err == nil && proj.Loaded, fmt.Sprint(err)
	})
	if proj.Epoch != first.Epoch {
		t.Fatalf("after the failover Redis holds epoch %d, want %d (the replica lagged a load behind)", proj.Epoch, first.Epoch)
	}

	// Workers against the stale state: what they decide, MySQL refuses.
	if _, err := sell(2); !errors.Is(err, model.ErrLedgerMoved) {
		t.Fatalf("an order decided against the lagging replica: got %v, want %v", err, model.ErrLedgerMoved)
	}

	// The operator's preload: Redis rebuilt from MySQL, the sale goes on.
	third := load()
	if third.Epoch <= second.Epoch {
		t.Fatalf("epoch after the preload: %d, want newer than %d", third.Epoch, second.Epoch)
	}
	report, err := New(st, db).Check(t.Context(), c.ID)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if len(report.Differences) != 0 {
		t.Fatalf("after the preload Redis and MySQL differ: %+v", report.Differences)
	}
	reply, err := sell(stock) // more shoppers than units left
	if err != nil {
		t.Fatalf("sell after the preload: %v", err)
	}
	sold := 0
	for _, r := range reply.Results {
		if r.Status == model.StatusSuccess {
			sold++
		}
	}
	orders, err := db.CampaignOrders(t.Context(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sold != stock-6 || len(orders) != stock {
		t.Fatalf("after the preload: %d sold, %d orders in MySQL; want %d and %d (every unit once)", sold, len(orders), stock-6, stock)
	}
}

// replicated waits until master's replicas hold every write made so far to
// the campaign's slot: a write on one connection, then WAIT on it
// (replication is in order).
func replicated(t *testing.T, master *redis.Client, campaignID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn := master.Conn()
	defer conn.Close()
	key := "fs:{" + campaignID + "}:replicated"
	if err := conn.Set(ctx, key, 1, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Do(ctx, "WAIT", 1, 10_000).Int(); err != nil || n < 1 {
		t.Fatalf("WAIT: %d replicas, %v; want 1", n, err)
	}
}
