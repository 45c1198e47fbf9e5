package reconcile

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

type fixture struct {
	rdb      *redis.Client
	st       *store.Store
	db       *sqlstore.DB
	raw      *sql.DB
	campaign model.Campaign
	rc       *Reconciler
	rids     []string
}

// newFixture sells 6 of 10 units to 6 users, exactly as the worker would
// (Lua deduction, then the order insert), in a sale that has ended.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	rdb := testenv.Redis(t)
	dsn := testenv.MySQLDSN(t)
	db, err := sqlstore.Open(t.Context(), sqlstore.DriverMySQL, dsn)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	raw, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("open raw: %v", err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	f := &fixture{rdb: rdb, st: store.New(rdb), db: db, raw: raw}
	start := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	f.campaign = model.Campaign{ID: testenv.UniqueName("rc-"), Name: "rc", Stock: 10, PerUserLimit: 1,
		StartAt: start, EndAt: start.Add(time.Hour)}
	if _, err := db.CreateCampaign(t.Context(), f.campaign); err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := f.st.Preload(t.Context(), f.campaign, start.Add(-time.Minute), false); err != nil {
		t.Fatalf("preload: %v", err)
	}
	var batch []model.Deduction
	for i := range 6 {
		rid := model.FormatRequestID(f.campaign.ID, fmt.Sprintf("%032x", i+1))
		f.rids = append(f.rids, rid)
		batch = append(batch, model.Deduction{RequestID: rid, UserID: fmt.Sprintf("u%d", i), Quantity: 1, OrderID: fmt.Sprintf("o%d", i)})
	}
	reply, err := f.st.Deduct(t.Context(), f.campaign.ID, batch)
	if err != nil {
		t.Fatalf("deduct: %v", err)
	}
	var orders []model.Order
	for _, r := range reply.Results {
		orders = append(orders, model.Order{ID: r.OrderID, RequestID: r.RequestID, CampaignID: r.CampaignID,
			UserID: r.UserID, Quantity: r.Quantity, Status: model.OrderPendingPayment})
	}
	if err := db.InsertOrders(t.Context(), orders); err != nil {
		t.Fatalf("insert: %v", err)
	}
	f.rc = New(f.st, db)
	return f
}

func (f *fixture) key(name string) string { return "fs:{" + f.campaign.ID + "}:" + name }

func kinds(r Report) map[string]int {
	out := map[string]int{}
	for _, d := range r.Differences {
		out[d.Kind]++
	}
	return out
}

func TestCheckAndRepair(t *testing.T) {
	tests := []struct {
		name      string
		corrupt   func(t *testing.T, f *fixture)
		wantKinds map[string]int
		wantRows  int
		wantSold  int64
	}{
		{
			name:      "consistent",
			corrupt:   func(*testing.T, *fixture) {},
			wantKinds: map[string]int{},
			wantRows:  6, wantSold: 6,
		},
		{
			name: "order row lost",
			corrupt: func(t *testing.T, f *fixture) {
				if _, err := f.raw.ExecContext(context.Background(), "DELETE FROM orders WHERE request_id = ?", f.rids[2]); err != nil {
					t.Fatal(err)
				}
			},
			wantKinds: map[string]int{KindMissingInDB: 1, KindSoldMismatch: 1, KindUserUnits: 1},
			wantRows:  6, wantSold: 6, // the shopper was told success: repair restores the row
		},
		{
			name: "redis counters drifted",
			corrupt: func(t *testing.T, f *fixture) {
				ctx := context.Background()
				f.rdb.HIncrBy(ctx, f.key("counters"), "sold", 3)
				f.rdb.HSet(ctx, f.key("users"), "ghost", 2)
				f.rdb.Set(ctx, f.key("soldout"), "1", 0)
			},
			wantKinds: map[string]int{KindSoldMismatch: 1, KindStockMismatch: 1, KindUserUnits: 1, KindSoldOutFlag: 1},
			wantRows:  6, wantSold: 6,
		},
		{
			name: "order without a redis result",
			corrupt: func(t *testing.T, f *fixture) {
				rid := model.FormatRequestID(f.campaign.ID, fmt.Sprintf("%032x", 99))
				err := f.db.InsertOrders(context.Background(), []model.Order{{ID: "o99", RequestID: rid, CampaignID: f.campaign.ID,
					UserID: "late", Quantity: 1, Status: model.OrderPendingPayment}})
				if err != nil {
					t.Fatal(err)
				}
			},
			wantKinds: map[string]int{KindMissingInRedis: 1, KindSoldMismatch: 1, KindUserUnits: 1},
			wantRows:  7, wantSold: 7,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.corrupt(t, f)
			rep, err := f.rc.Check(t.Context(), f.campaign.ID)
			if err != nil {
				t.Fatalf("check: %v", err)
			}
			got := kinds(rep)
			if fmt.Sprint(got) != fmt.Sprint(tc.wantKinds) {
				t.Fatalf("got differences %v (%+v), want %v", got, rep.Differences, tc.wantKinds)
			}
			_, after, err := f.rc.Repair(t.Context(), f.campaign.ID)
			if err != nil {
				t.Fatalf("repair: %v", err)
			}
			if !after.Consistent() {
				t.Fatalf("after repair: %+v", after.Differences)
			}
			if after.DBOrders != tc.wantRows || after.RedisSold != tc.wantSold {
				t.Fatalf("after repair: got %d rows, sold %d; want %d, %d", after.DBOrders, after.RedisSold, tc.wantRows, tc.wantSold)
			}
		})
	}
}

func TestRepairRefusesOpenSale(t *testing.T) {
	f := newFixture(t)
	f.rc.now = func() time.Time { return f.campaign.EndAt.Add(-time.Minute) }
	f.rdb.HIncrBy(t.Context(), f.key("counters"), "sold", 1)
	if _, _, err := f.rc.Repair(t.Context(), f.campaign.ID); err == nil {
		t.Fatalf("repair of an open sale: got nil, want an error")
	}
	snap, err := f.st.Snapshot(t.Context(), f.campaign.ID)
	if err != nil || snap.Sold != 7 {
		t.Fatalf("refused repair changed Redis: sold %d (%v), want 7", snap.Sold, err)
	}
}

func TestRepairRefusesOversell(t *testing.T) {
	f := newFixture(t)
	// Five extra "successes" in Redis that MySQL lacks would make 11 of 10.
	for i := range 5 {
		rid := model.FormatRequestID(f.campaign.ID, fmt.Sprintf("%032x", 200+i))
		f.rdb.HSet(t.Context(), f.key("results"), rid, fmt.Sprintf("success|1|x%d||extra%d", i, i))
	}
	if _, _, err := f.rc.Repair(t.Context(), f.campaign.ID); err == nil {
		t.Fatalf("got nil, want a refusal: restoring would oversell")
	}
	rows, err := f.db.CampaignOrders(t.Context(), f.campaign.ID)
	if err != nil || len(rows) != 6 {
		t.Fatalf("refused repair changed MySQL: %d rows (%v), want 6", len(rows), err)
	}
}

// TestCheckCountsActiveOrders: the units of an order that ended unsold are
// back on sale once released, so Redis and MySQL agree when MySQL counts
// only active orders; between the transition and the release they differ.
func TestCheckCountsActiveOrders(t *testing.T) {
	f := newFixture(t)
	moved, err := f.db.TransitionOrder(t.Context(), "o1", model.OrderPendingPayment, model.OrderCancelled, time.Now())
	if err != nil || !moved {
		t.Fatalf("cancel: got %v, %v; want moved", moved, err)
	}
	rep, err := f.rc.Check(t.Context(), f.campaign.ID)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if got, want := fmt.Sprint(kinds(rep)), fmt.Sprint(map[string]int{KindSoldMismatch: 1, KindUserUnits: 1}); got != want {
		t.Fatalf("before the release: got differences %v (%+v), want %v", got, rep.Differences, want)
	}
	if ok, err := f.st.Release(t.Context(), f.campaign.ID, "o1", "u1", 1); err != nil || !ok {
		t.Fatalf("release: got %v, %v; want released", ok, err)
	}
	rep, err = f.rc.Check(t.Context(), f.campaign.ID)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if !rep.Consistent() || rep.DBUnits != 5 || rep.RedisSold != 5 || rep.DBOrders != 6 {
		t.Fatalf("after the release: got %+v, want consistent, 5 units of 6 orders", rep)
	}
}
