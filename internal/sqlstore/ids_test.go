package sqlstore

import (
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// mustCreate stores a campaign open for a day.
func mustCreate(t *testing.T, db *DB, id, name string) model.Campaign {
	t.Helper()
	start := time.Now().Add(-time.Hour)
	c, err := db.CreateCampaign(t.Context(), model.Campaign{ID: id, Name: name, Stock: 10, PerUserLimit: 5,
		StartAt: start, EndAt: start.Add(24 * time.Hour)})
	if err != nil {
		t.Fatalf("create campaign %s: %v", id, err)
	}
	return c
}

// checkIDsCaseSensitive: every id is an exact string on both backends.
// Campaign b1 and campaign B1 are two campaigns, each with its own orders;
// user ids, order ids, request ids and payment ids that differ in case
// only are different ids too. A case-insensitive collation would answer
// B1 with b1, refuse to create B1, and drop B1's orders as duplicates.
func checkIDsCaseSensitive(t *testing.T, db *DB) {
	t.Helper()
	ctx := t.Context()
	mustCreate(t, db, "b1", "lower")
	if _, err := db.Campaign(ctx, "B1"); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("Campaign(B1) with only b1 stored: got %v, want ErrNotFound", err)
	}
	if c := mustCreate(t, db, "B1", "upper"); c.ID != "B1" {
		t.Fatalf("created %q, want B1", c.ID)
	}
	for id, name := range map[string]string{"b1": "lower", "B1": "upper"} {
		if c, err := db.Campaign(ctx, id); err != nil || c.ID != id || c.Name != name {
			t.Fatalf("Campaign(%s): got %s %q, %v; want %s %q", id, c.ID, c.Name, err, id, name)
		}
	}

	hex := "0123456789abcdef0123456789abcdef"
	lower := model.Order{ID: "order-a", RequestID: model.FormatRequestID("b1", hex), CampaignID: "b1", UserID: "alice",
		Quantity: 1, Amount: 10, Status: model.OrderPendingPayment, ExpiresAt: testExpiry}
	upper := model.Order{ID: "ORDER-A", RequestID: model.FormatRequestID("B1", hex), CampaignID: "B1", UserID: "Alice",
		Quantity: 2, Amount: 20, Status: model.OrderPendingPayment, ExpiresAt: testExpiry}
	mustInsert(t, db, []model.Order{lower, upper})
	for _, want := range []model.Order{lower, upper} {
		got, err := db.Order(ctx, want.ID)
		if err != nil || got.RequestID != want.RequestID || got.UserID != want.UserID || got.Quantity != want.Quantity {
			t.Fatalf("Order(%s): got %+v, %v; want request %s of %s, quantity %d", want.ID, got, err, want.RequestID, want.UserID, want.Quantity)
		}
		st, err := db.CampaignOrderStats(ctx, want.CampaignID)
		if err != nil || st.Orders != 1 || st.Units != want.Quantity {
			t.Fatalf("CampaignOrderStats(%s): got %+v, %v; want 1 order of %d units", want.CampaignID, st, err, want.Quantity)
		}
		list, _, err := db.UserOrders(ctx, want.UserID, "", 10)
		if err != nil || len(list) != 1 || list[0].ID != want.ID {
			t.Fatalf("UserOrders(%s): got %v, %v; want [%s]", want.UserID, orderIDs(list), err, want.ID)
		}
	}

	for _, p := range []model.Payment{{ID: "pay_a", OrderID: lower.ID, Amount: 10, Status: model.PaymentSucceeded},
		{ID: "PAY_A", OrderID: upper.ID, Amount: 20, Status: model.PaymentSucceeded}} {
		got, created, err := db.RecordPayment(ctx, p)
		if err != nil || !created || got.OrderID != p.OrderID {
			t.Fatalf("RecordPayment(%s): got %+v, created %v, %v; want a new payment of %s", p.ID, got, created, err, p.OrderID)
		}
	}
	for _, id := range []string{lower.ID, upper.ID} {
		if o := mustOrder(t, db, id); o.Status != model.OrderPaid {
			t.Fatalf("order %s: got %s, want paid", id, o.Status)
		}
	}
}

func TestIDsCaseSensitive(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) { checkIDsCaseSensitive(t, open(t)) })
	}
}

// TestMigrateToBinaryCollation: tables created case-insensitive (by an
// earlier version, or a server whose default collation is) are converted
// at Open, with their rows kept, and ids compare exactly afterwards.
func TestMigrateToBinaryCollation(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	raw, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer raw.Close()
	// The schema as gorm created it before: the server's default collation.
	old := mustOpen(t, DriverMySQL, dsn)
	for _, table := range migratedTables {
		if _, err := raw.ExecContext(t.Context(), "ALTER TABLE `"+table+"` CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"); err != nil {
			t.Fatalf("make %s case-insensitive: %v", table, err)
		}
	}
	mustCreate(t, old, "kept", "from before")
	if _, err := old.Campaign(t.Context(), "KEPT"); err != nil {
		t.Fatalf("before the migration, Campaign(KEPT): got %v, want the case-insensitive match", err)
	}
	_ = old.Close()

	db := mustOpen(t, DriverMySQL, dsn)
	rows, err := raw.QueryContext(t.Context(), "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "+
		"WHERE TABLE_SCHEMA = DATABASE() AND COLLATION_NAME IS NOT NULL")
	if err != nil {
		t.Fatalf("columns: %v", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var table, column, collation string
		if err := rows.Scan(&table, &column, &collation); err != nil {
			t.Fatalf("scan: %v", err)
		}
		n++
		if collation != binaryCollation {
			t.Errorf("%s.%s: got collation %s, want %s", table, column, collation, binaryCollation)
		}
	}
	if err := rows.Err(); err != nil || n == 0 {
		t.Fatalf("columns: %d read, %v", n, err)
	}
	for _, table := range migratedTables {
		var collation string
		err := raw.QueryRowContext(t.Context(), "SELECT TABLE_COLLATION FROM information_schema.TABLES "+
			"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", table).Scan(&collation)
		if err != nil || collation != binaryCollation {
			t.Errorf("table %s: got collation %q, %v; want %s", table, collation, err, binaryCollation)
		}
	}
	if c, err := db.Campaign(t.Context(), "kept"); err != nil || c.Name != "from before" {
		t.Fatalf("campaign kept: got %+v, %v", c, err)
	}
	checkIDsCaseSensitive(t, db)
}

// TestCampaignIDs: every campaign's id, exactly as stored, and one more
// than the limit says there are more.
func TestCampaignIDs(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			for _, id := range []string{"b1", "B1", "c-2"} {
				mustCreate(t, db, id, id)
			}
			ids, err := db.CampaignIDs(t.Context(), 10)
			slices.Sort(ids)
			if err != nil || !slices.Equal(ids, []string{"B1", "b1", "c-2"}) {
				t.Fatalf("CampaignIDs(10): got %v, %v; want [B1 b1 c-2]", ids, err)
			}
			if ids, err := db.CampaignIDs(t.Context(), 2); err != nil || len(ids) != 3 {
				t.Fatalf("CampaignIDs(2): got %v, %v; want 3 ids (the limit and one more)", ids, err)
			}
			if ids, err := db.CampaignIDs(t.Context(), 1); err != nil || len(ids) != 2 {
				t.Fatalf("CampaignIDs(1): got %v, %v; want 2 ids", ids, err)
			}
		})
	}
}
