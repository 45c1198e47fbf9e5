package sqlstore

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// oldOrdersTable is the orders table as Open created it while order ids
// were drawn (UUIDv7) and the unique index on request_id deduplicated
// them, verbatim from each database's catalogue.
var oldOrdersTable = map[string][]string{
	DriverMySQL: {"CREATE TABLE `orders` (`id` varchar(64) NOT NULL, `request_id` varchar(120) NOT NULL, " +
		"`campaign_id` varchar(64) NOT NULL, `user_id` varchar(255) NOT NULL, `quantity` bigint(20) NOT NULL, " +
		"`amount` bigint(20) NOT NULL DEFAULT 0, `status` varchar(32) NOT NULL, `stock_returned` tinyint(1) NOT NULL DEFAULT 0, " +
		"`expires_at` datetime(3) DEFAULT NULL, `created_at` datetime(3) DEFAULT NULL, `updated_at` datetime(3) DEFAULT NULL, " +
		"PRIMARY KEY (`id`), UNIQUE KEY `idx_orders_request_id` (`request_id`), KEY `idx_orders_campaign_user` (`campaign_id`,`user_id`), " +
		"KEY `idx_orders_user` (`user_id`,`created_at`), KEY `idx_orders_due` (`status`,`stock_returned`,`expires_at`)" +
		") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"},
	DriverSQLite: {"CREATE TABLE `orders` (`id` text,`request_id` text NOT NULL,`campaign_id` text NOT NULL,`user_id` text NOT NULL," +
		"`quantity` integer NOT NULL,`amount` integer NOT NULL DEFAULT 0,`status` text NOT NULL,`stock_returned` numeric NOT NULL DEFAULT false," +
		"`expires_at` datetime,`created_at` datetime,`updated_at` datetime,PRIMARY KEY (`id`))",
		"CREATE INDEX `idx_orders_due` ON `orders`(`status`,`stock_returned`,`expires_at`)",
		"CREATE INDEX `idx_orders_user` ON `orders`(`user_id`,`created_at`)",
		"CREATE INDEX `idx_orders_campaign_user` ON `orders`(`campaign_id`,`user_id`)",
		"CREATE UNIQUE INDEX `idx_orders_request_id` ON `orders`(`request_id`)"},
}

// dsnOf returns a database of the test's own that outlives a DB: MySQL's,
// or an SQLite file.
func dsnOf(t *testing.T, driver string) string {
	if driver == DriverMySQL {
		return testenv.MySQLDSN(t)
	}
	return filepath.Join(t.TempDir(), "flashsale.db")
}

// requestIDIndexes returns the names of the orders table's indexes that
// cover request_id.
func requestIDIndexes(t *testing.T, db *DB) []string {
	t.Helper()
	indexes, err := db.gdb.WithContext(t.Context()).Migrator().GetIndexes(&orderRow{})
	if err != nil {
		t.Fatalf("indexes of orders: %v", err)
	}
	var names []string
	for _, ix := range indexes {
		if slices.Contains(ix.Columns(), "request_id") {
			names = append(names, ix.Name())
		}
	}
	return names
}

// TestNoRequestIDIndex: a new database keys orders by their id alone, so
// the INSERT maintains no index on request_id.
func TestNoRequestIDIndex(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			if got := requestIDIndexes(t, open(t)); len(got) != 0 {
				t.Fatalf("got indexes %v on request_id, want none", got)
			}
		})
	}
}

// TestMigrateRequestIDIndex: Open migrates the old orders table, rows and
// ids kept. It drops the unique index on request_id only when every stored
// order's id is the derived one; while an order has a drawn id the index
// stays, and a success stored under a drawn id and decided again (under
// its derived id) is still stored once.
func TestMigrateRequestIDIndex(t *testing.T) {
	for _, driver := range []string{DriverSQLite, DriverMySQL} {
		for _, tc := range []struct {
			name      string
			drawn     int // orders stored with a drawn id, then as many derived
			derived   int
			wantIndex bool
		}{
			{name: "no orders", wantIndex: false},
			{name: "derived ids only", derived: 1500, wantIndex: false}, // more than a page of the scan
			{name: "one drawn id", drawn: 1, derived: 1500, wantIndex: true},
			{name: "drawn ids only", drawn: 5, wantIndex: true},
		} {
			t.Run(driver+"/"+tc.name, func(t *testing.T) {
				dsn := dsnOf(t, driver)
				old := mustOpen(t, driver, dsn)
				for _, stmt := range append([]string{"DROP TABLE `orders`"}, oldOrdersTable[driver]...) {
					if _, err := old.pool.ExecContext(t.Context(), stmt); err != nil {
						t.Fatalf("old schema: %s: %v", stmt, err)
					}
				}
				const c = "mig"
				drawn := testOrders(c, 0, tc.drawn)
				for i := range drawn {
					drawn[i].ID = uuid.Must(uuid.NewV7()).String()
				}
				derived := testOrders(c, tc.drawn, tc.derived)
				stored := append(slices.Clone(drawn), derived...)
				mustInsert(t, old, stored)
				_ = old.Close()

				var wantIndexes []string
				if tc.wantIndex {
					wantIndexes = []string{legacyRequestIndex}
				}
				db := mustOpen(t, driver, dsn)
				if got := requestIDIndexes(t, db); !slices.Equal(got, wantIndexes) {
					t.Fatalf("after Open: indexes on request_id %v, want %v", got, wantIndexes)
				}
				checkOrders(t, db, c, stored)

				// Every stored success delivered again, as the worker
				// decides it now (derived ids), and a new one.
				again := testOrders(c, 0, tc.drawn+tc.derived+1)
				mustInsert(t, db, again)
				checkOrders(t, db, c, append(stored, again[len(again)-1]))

				// A second Open changes nothing.
				_ = db.Close()
				db = mustOpen(t, driver, dsn)
				if got := requestIDIndexes(t, db); !slices.Equal(got, wantIndexes) {
					t.Fatalf("after a second Open: indexes on request_id %v, want %v", got, wantIndexes)
				}
			})
		}
	}
}

// checkOrders checks that a campaign's stored orders are want, ids
// included.
func checkOrders(t *testing.T, db *DB, campaignID string, want []model.Order) {
	t.Helper()
	got, err := db.CampaignOrders(context.Background(), campaignID)
	if err != nil {
		t.Fatalf("CampaignOrders: %v", err)
	}
	byRequest := map[string]string{}
	for _, o := range got {
		byRequest[o.RequestID] = o.ID
	}
	if len(got) != len(want) || len(byRequest) != len(want) {
		t.Fatalf("got %d orders of %d requests, want %d", len(got), len(byRequest), len(want))
	}
	for _, o := range want {
		if byRequest[o.RequestID] != o.ID {
			t.Fatalf("request %s: got order %q, want %q", o.RequestID, byRequest[o.RequestID], o.ID)
		}
	}
}
