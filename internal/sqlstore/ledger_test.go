package sqlstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

func mustCampaign(t *testing.T, db *DB, id string) model.Campaign {
	t.Helper()
	start := time.Now().Add(-time.Hour)
	c, err := db.CreateCampaign(t.Context(), model.Campaign{ID: id, Name: "ledger", Stock: 100, PerUserLimit: 5,
		StartAt: start, EndAt: start.Add(24 * time.Hour)})
	if err != nil {
		t.Fatalf("create campaign %s: %v", id, err)
	}
	return c
}

func mustBump(t *testing.T, db *DB, id string) (model.Campaign, []model.Order) {
	t.Helper()
	c, orders, err := db.BumpEpoch(t.Context(), id)
	if err != nil {
		t.Fatalf("BumpEpoch(%s): %v", id, err)
	}
	return c, orders
}

func countOrders(t *testing.T, db *DB, campaignID string) int64 {
	t.Helper()
	st, err := db.CampaignOrderStats(t.Context(), campaignID)
	if err != nil {
		t.Fatalf("order stats: %v", err)
	}
	return st.Orders
}

// TestInsertOrdersFenced: orders are stored only under their campaign's
// epoch in MySQL; an insert under any other epoch, or for a campaign not
// stored, changes nothing — not even the rows of the batch's other
// campaigns.
func TestInsertOrdersFenced(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			a, b := mustCampaign(t, db, "fa"), mustCampaign(t, db, "fb")
			if a.Epoch != 0 || a.Paused {
				t.Fatalf("new campaign: got epoch %d, paused %v; want 0, false", a.Epoch, a.Paused)
			}
			if err := db.InsertOrders(t.Context(), testOrders("fa", 0, 3), model.Epochs{"fa": 0}); err != nil {
				t.Fatalf("insert under epoch 0: %v", err)
			}
			a, orders := mustBump(t, db, "fa")
			if a.Epoch != 1 || len(orders) != 3 {
				t.Fatalf("BumpEpoch: got epoch %d with %d orders, want 1 with 3", a.Epoch, len(orders))
			}

			tests := []struct {
				name    string
				orders  []model.Order
				epochs  model.Epochs
				wantErr error
			}{
				{name: "older epoch", orders: testOrders("fa", 10, 2), epochs: model.Epochs{"fa": 0}, wantErr: model.ErrLedgerMoved},
				{name: "newer epoch", orders: testOrders("fa", 10, 2), epochs: model.Epochs{"fa": 2}, wantErr: model.ErrLedgerMoved},
				{name: "one campaign of two moved", orders: append(testOrders("fa", 10, 2), testOrders("fb", 20, 2)...),
					epochs: model.Epochs{"fa": 1, "fb": 1}, wantErr: model.ErrLedgerMoved},
				{name: "campaign not stored", orders: testOrders("fz", 10, 2), epochs: model.Epochs{"fz": 0}, wantErr: model.ErrNotFound},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					err := db.InsertOrders(t.Context(), tc.orders, tc.epochs)
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("got %v, want %v", err, tc.wantErr)
					}
					if n, m := countOrders(t, db, "fa"), countOrders(t, db, "fb"); n != 3 || m != 0 {
						t.Fatalf("refused insert changed the ledger: got %d and %d orders, want 3 and 0", n, m)
					}
				})
			}
			if err := db.InsertOrders(t.Context(), testOrders("fa", 10, 2), model.Epochs{}); err == nil || errors.Is(err, model.ErrLedgerMoved) {
				t.Fatalf("insert without an epoch: got %v, want an error that is not %v", err, model.ErrLedgerMoved)
			}
			if err := db.InsertOrders(t.Context(), append(testOrders("fa", 10, 2), testOrders("fb", 20, 2)...),
				model.Epochs{"fa": a.Epoch, "fb": b.Epoch}); err != nil {
				t.Fatalf("insert under the current epochs: %v", err)
			}
			if n, m := countOrders(t, db, "fa"), countOrders(t, db, "fb"); n != 5 || m != 2 {
				t.Fatalf("got %d and %d orders, want 5 and 2", n, m)
			}
		})
	}
}

// TestSetPaused: the flag is durable and setting it twice changes nothing;
// BumpEpoch keeps it.
func TestSetPaused(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			mustCampaign(t, db, "p1")
			for _, want := range []bool{true, true, false, false, true} {
				c, err := db.SetPaused(t.Context(), "p1", want)
				if err != nil || c.Paused != want {
					t.Fatalf("SetPaused(%v): got %v, %v", want, c.Paused, err)
				}
				if got, _ := db.Campaign(t.Context(), "p1"); got.Paused != want {
					t.Fatalf("after SetPaused(%v): stored %v", want, got.Paused)
				}
			}
			if c, _ := mustBump(t, db, "p1"); !c.Paused || c.Epoch != 1 {
				t.Fatalf("BumpEpoch of a paused campaign: got paused %v, epoch %d; want true, 1", c.Paused, c.Epoch)
			}
			if _, err := db.SetPaused(t.Context(), "nope", true); !errors.Is(err, model.ErrNotFound) {
				t.Fatalf("SetPaused of an unknown campaign: got %v, want %v", err, model.ErrNotFound)
			}
			if _, _, err := db.BumpEpoch(t.Context(), "nope"); !errors.Is(err, model.ErrNotFound) {
				t.Fatalf("BumpEpoch of an unknown campaign: got %v, want %v", err, model.ErrNotFound)
			}
		})
	}
}

// TestBumpEpochWaitsForInserts: an insert that has read the epoch holds
// the bump back until it commits, so the orders the bump returns include
// its rows; an insert under the old epoch after the bump is refused.
func TestBumpEpochWaitsForInserts(t *testing.T) {
	db := openDBs(t)[DriverMySQL](t)
	id := "bw" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	mustCampaign(t, db, id)
	held, release := make(chan struct{}), make(chan struct{})
	db.afterEpochCheck = func() {
		close(held)
		<-release
	}
	inserted := make(chan error, 1)
	go func() { inserted <- db.InsertOrders(t.Context(), testOrders(id, 0, 4), model.Epochs{id: 0}) }()
	<-held
	db.afterEpochCheck = nil

	type bumped struct {
		c      model.Campaign
		orders []model.Order
		err    error
	}
	done := make(chan bumped, 1)
	go func() {
		c, orders, err := db.BumpEpoch(t.Context(), id)
		done <- bumped{c, orders, err}
	}()
	// The bump must be executing and waiting for the insert's lock.
	waitLockWait(t, db, id)
	select {
	case b := <-done:
		t.Fatalf("BumpEpoch returned (%d orders, %v) while an insert of the old epoch was open", len(b.orders), b.err)
	default:
	}
	close(release)
	if err := <-inserted; err != nil {
		t.Fatalf("held insert: %v", err)
	}
	b := <-done
	if b.err != nil || b.c.Epoch != 1 || len(b.orders) != 4 {
		t.Fatalf("BumpEpoch: got epoch %d, %d orders, %v; want 1, 4 (the held insert's), nil", b.c.Epoch, len(b.orders), b.err)
	}
	if err := db.InsertOrders(t.Context(), testOrders(id, 10, 1), model.Epochs{id: 0}); !errors.Is(err, model.ErrLedgerMoved) {
		t.Fatalf("insert under the old epoch after the bump: got %v, want %v", err, model.ErrLedgerMoved)
	}
}

// waitLockWait waits until a bump of campaign id's epoch is executing (the
// caller then checks that it has not returned: it waits for a lock).
func waitLockWait(t *testing.T, db *DB, id string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "a bump of "+id+"'s epoch executing", func() (bool, string) {
		var n int64
		err := db.pool.QueryRowContext(t.Context(),
			"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%ledger_epoch` + 1%' AND INFO LIKE ?",
			"%"+id+"%").Scan(&n)
		if err != nil {
			t.Fatalf("read the process list: %v", err)
		}
		return n > 0, "none in the process list"
	})
}

// TestLoadWaitsForInFlightInsert: a worker's insert that read the epoch
// before a load bumped it holds the load back; the load then sees its
// orders, so Redis, rebuilt, counts their units once, keeps their
// results, and a redelivery of the batch changes nothing.
func TestLoadWaitsForInFlightInsert(t *testing.T) {
	db := openDBs(t)[DriverMySQL](t)
	st := store.New(testenv.Redis(t))
	start := time.Now().Add(-time.Hour)
	c, err := db.CreateCampaign(t.Context(), model.Campaign{ID: testenv.Name(t, "lw"), Name: "ledger", Stock: 5, PerUserLimit: 1,
		StartAt: start, EndAt: start.Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if c, err = reconcile.Load(t.Context(), db, st, c.ID); err != nil {
		t.Fatalf("load: %v", err)
	}
	// Decided as the worker does, then stored with the epoch of the decision.
	var batch []model.Deduction
	for i := range 3 {
		batch = append(batch, model.Deduction{RequestID: model.FormatRequestID(c.ID, fmt.Sprintf("%032x", i)),
			UserID: fmt.Sprintf("u%d", i), Quantity: 1, OrderID: fmt.Sprintf("%s-o%d", c.ID, i)})
	}
	reply, err := st.Deduct(t.Context(), c.ID, batch)
	if err != nil {
		t.Fatal(err)
	}
	orders := make([]model.Order, len(reply.Results))
	for i, r := range reply.Results {
		orders[i] = model.Order{ID: r.OrderID, RequestID: r.RequestID, CampaignID: c.ID, UserID: r.UserID, Quantity: 1,
			Status: model.OrderPendingPayment}
	}
	held, release := make(chan struct{}), make(chan struct{})
	db.afterEpochCheck = func() {
		close(held)
		<-release
	}
	inserted := make(chan error, 1)
	go func() { inserted <- db.InsertOrders(t.Context(), orders, model.Epochs{c.ID: reply.Epoch}) }()
	<-held
	db.afterEpochCheck = nil
	loaded := make(chan error, 1)
	go func() {
		_, err := reconcile.Load(t.Context(), db, st, c.ID)
		loaded <- err
	}()
	waitLockWait(t, db, c.ID)
	close(release)
	if err := <-inserted; err != nil {
		t.Fatalf("insert in flight: %v", err)
	}
	if err := <-loaded; err != nil {
		t.Fatalf("load: %v", err)
	}

	check := func() {
		t.Helper()
		rep, err := reconcile.New(st, db).Check(t.Context(), c.ID)
		if err != nil || !rep.Consistent() || rep.DBUnits != 3 || rep.RedisSold != 3 {
			t.Fatalf("Redis vs MySQL: %+v, %v; want consistent with 3 units", rep, err)
		}
		for _, r := range reply.Results {
			if got, err := st.Result(t.Context(), r.RequestID); err != nil || got.Status != model.StatusSuccess || got.OrderID != r.OrderID {
				t.Fatalf("result of %s: got %+v, %v; want its success %s", r.RequestID, got, err, r.OrderID)
			}
		}
	}
	check()
	again, err := st.Deduct(t.Context(), c.ID, batch)
	if err != nil || again.Epoch != c.Epoch+1 {
		t.Fatalf("redelivery: got epoch %d, %v; want %d", again.Epoch, err, c.Epoch+1)
	}
	if err := db.InsertOrders(t.Context(), orders, model.Epochs{c.ID: again.Epoch}); err != nil {
		t.Fatalf("redelivered insert: %v", err)
	}
	check()
}
