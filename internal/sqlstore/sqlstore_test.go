package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm/clause"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// openDBs opens each driver's database: SQLite in memory (the embedded
// mode) and a MySQL database of the test's own (skipped or failed as
// testenv decides when MySQL is not configured).
func openDBs(t testing.TB) map[string]func(testing.TB) *DB {
	t.Helper()
	open := func(driver, dsn string) func(testing.TB) *DB {
		return func(t testing.TB) *DB {
			t.Helper()
			db, err := Open(context.Background(), driver, dsn)
			if err != nil {
				t.Fatalf("open %s: %v", driver, err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return db
		}
	}
	return map[string]func(testing.TB) *DB{
		DriverSQLite: func(t testing.TB) *DB { return open(DriverSQLite, ":memory:")(t) },
		DriverMySQL:  func(t testing.TB) *DB { return open(DriverMySQL, testenv.MySQLDSN(t))(t) },
	}
}

// testExpiry is the payment deadline of testOrders' orders: whole
// milliseconds, as MySQL keeps them.
var testExpiry = time.Date(2030, 1, 2, 3, 4, 5, 6e6, time.UTC)

// testOrders returns orders number from to from+n-1 of a campaign, the
// same for the same numbers. Their request ids are shaped like one
// gateway's (a UUIDv7 tail: a millisecond timestamp, here a hundred
// requests a millisecond, a sub-millisecond fraction, then other digits)
// and their ids are derived from them, as the worker's are.
func testOrders(campaignID string, from, n int) []model.Order {
	const firstMS = 0x0190a5b27c3d // 2024-07-06, in milliseconds since 1970
	out := make([]model.Order, n)
	for i := range out {
		k := from + i
		q := int64(1 + k%3)
		rid := model.FormatRequestID(campaignID, fmt.Sprintf("%012x7%03x%016x", firstMS+k/100, k%100, k))
		out[i] = model.Order{ID: model.OrderIDOf(rid), RequestID: rid,
			CampaignID: campaignID, UserID: fmt.Sprintf("user%d", k), Quantity: q, Amount: 250 * q, Status: model.OrderPendingPayment,
			ExpiresAt: testExpiry}
	}
	return out
}

func mustInsert(t *testing.T, db *DB, orders []model.Order) {
	t.Helper()
	if err := db.InsertOrders(t.Context(), orders, mustEpochs(t, db, orders)); err != nil {
		t.Fatalf("InsertOrders(%d): %v", len(orders), err)
	}
}

// mustEpochs returns the current epoch of each campaign of orders, storing
// the campaigns that are not stored yet (the tests name campaigns freely).
func mustEpochs(t testing.TB, db *DB, orders []model.Order) model.Epochs {
	t.Helper()
	epochs := model.Epochs{}
	for _, o := range orders {
		if _, ok := epochs[o.CampaignID]; ok {
			continue
		}
		c, err := db.Campaign(t.Context(), o.CampaignID)
		if errors.Is(err, model.ErrNotFound) {
			start := time.Now().Add(-time.Hour)
			c, err = db.CreateCampaign(t.Context(), model.Campaign{ID: o.CampaignID, Name: "orders", Stock: model.MaxStock,
				PerUserLimit: 1000, StartAt: start, EndAt: start.Add(24 * time.Hour)})
		}
		if err != nil {
			t.Fatalf("campaign %s: %v", o.CampaignID, err)
		}
		epochs[c.ID] = c.Epoch
	}
	return epochs
}

// TestInsertOrders: rows arrive as given, a redelivered order (its id
// derived from its request id, so the same) is skipped, and batches larger
// than one statement are split — on both drivers.
func TestInsertOrders(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			const c = "c1"
			first := testOrders(c, 0, 10)
			mustInsert(t, db, first)
			mustInsert(t, db, nil)

			// A redelivery of the first five decided again (another amount
			// and expiry, the same ids), mixed with new orders, and an exact
			// replay of the whole first batch.
			again := testOrders(c, 0, 5)
			for i := range again {
				again[i].Amount++
				again[i].ExpiresAt = again[i].ExpiresAt.Add(time.Hour)
			}
			mustInsert(t, db, append(again, testOrders(c, 10, 5)...))
			mustInsert(t, db, first)

			// More rows than one statement takes.
			mustInsert(t, db, testOrders(c, 15, 2*maxOrdersPerInsert+7))

			want := testOrders(c, 0, 15+2*maxOrdersPerInsert+7)
			got, err := db.CampaignOrders(t.Context(), c)
			if err != nil {
				t.Fatalf("CampaignOrders: %v", err)
			}
			if len(got) != len(want) {
				t.Fatalf("got %d orders, want %d", len(got), len(want))
			}
			since := time.Now().Add(-time.Minute)
			for i := range got {
				if got[i].CreatedAt.Before(since) || !got[i].UpdatedAt.Equal(got[i].CreatedAt) {
					t.Fatalf("order %s: got created_at %s, updated_at %s, want both now", got[i].RequestID, got[i].CreatedAt, got[i].UpdatedAt)
				}
				got[i].CreatedAt, got[i].UpdatedAt = time.Time{}, time.Time{}
			}
			slices.SortFunc(want, func(a, b model.Order) int { return cmpString(a.RequestID, b.RequestID) })
			if !slices.Equal(got, want) {
				t.Fatalf("got orders %v…, want %v…", got[:3], want[:3])
			}
			st, err := db.CampaignOrderStats(t.Context(), c)
			var units int64
			for _, o := range want {
				units += o.Quantity
			}
			if err != nil || st.Orders != int64(len(want)) || st.Units != units {
				t.Fatalf("got stats %+v (%v), want %d orders, %d units", st, err, len(want), units)
			}
		})
	}
}

// TestInsertOrdersFailsOnBadRow: only duplicates are ignored; a value the
// column cannot hold fails the batch instead of being truncated.
func TestInsertOrdersFailsOnBadRow(t *testing.T) {
	db := openDBs(t)[DriverMySQL](t)
	bad := testOrders("c1", 0, 2)
	bad[1].UserID = string(make([]byte, 300)) // user_id is 255 wide
	if err := db.InsertOrders(t.Context(), bad, mustEpochs(t, db, bad)); err == nil {
		t.Fatalf("got nil, want an error for a 300-byte user id")
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// BenchmarkInsertOrders compares InsertOrders ("sql": prepared statements
// at these sizes, fenced by the ledger epoch) with the same prepared
// statement unfenced (what it did before the epoch: no transaction, no
// locking read), with the statement sent as text (what it did before
// statements were cached) and with gorm's CreateInBatches (what it
// replaced), on real MariaDB, per batch of new orders. With -count, the
// implementations run interleaved, which is what makes their ratio
// readable on a shared machine.
func BenchmarkInsertOrders(b *testing.B) {
	for _, size := range []int{128, 512} {
		for _, impl := range []string{"sql", "unfenced", "text", "gorm"} {
			b.Run(fmt.Sprintf("%s/batch=%d", impl, size), func(b *testing.B) {
				db := openDBs(b)[DriverMySQL](b)
				if impl == "text" {
					_ = db.inserts.close()
				}
				epochs := mustEpochs(b, db, testOrders("bench", 0, 1))
				n := 0
				for b.Loop() {
					orders := testOrders("bench", n, size)
					n += size
					var err error
					switch impl {
					case "gorm":
						err = db.gormInsertOrders(b.Context(), orders)
					case "unfenced":
						err = db.unfencedInsertOrders(b.Context(), orders)
					default:
						err = db.InsertOrders(b.Context(), orders, epochs)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "rows/s")
			})
		}
	}
}

// unfencedInsertOrders is InsertOrders as it was before the ledger epoch:
// each statement on its own, outside a transaction. The reference of the
// fence's cost in BenchmarkInsertOrders.
func (db *DB) unfencedInsertOrders(ctx context.Context, orders []model.Order) error {
	at := now()
	for start := 0; start < len(orders); start += maxOrdersPerInsert {
		chunk := orders[start:min(start+maxOrdersPerInsert, len(orders))]
		db.inserts.prepare(ctx, db.pool, len(chunk))
		db.inserts.mu.RLock()
		st := db.inserts.byRows[len(chunk)]
		var err error
		if st != nil {
			_, err = st.ExecContext(ctx, orderArgs(chunk, at)...)
		}
		db.inserts.mu.RUnlock()
		if st == nil {
			_, err = db.pool.ExecContext(ctx, insertOrdersSQL(db.driver, len(chunk)), orderArgs(chunk, at)...)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// gormInsertOrders is InsertOrders as it was, through gorm: the reference
// of BenchmarkInsertOrders.
func (db *DB) gormInsertOrders(ctx context.Context, orders []model.Order) error {
	rows := make([]orderRow, len(orders))
	for i, o := range orders {
		rows[i] = orderRow{ID: o.ID, RequestID: o.RequestID, CampaignID: o.CampaignID, UserID: o.UserID,
			Quantity: o.Quantity, Status: string(o.Status)}
	}
	return db.gdb.WithContext(ctx).Clauses(clause.OnConflict{DoNothing: true}).CreateInBatches(rows, 1000).Error
}

// BenchmarkInsertIndexes measures what the orders table's indexes cost the
// prepared 512-row INSERT: scratch tables with the same columns and the
// primary key only, without the (campaign, user) index, with the three the
// table had before the order lifecycle, with its sweeper's index, with all
// five (the table's set while order ids were drawn), and with all but the
// unique request id (the table's set since they are derived), in the
// benchmark's own database.
func BenchmarkInsertIndexes(b *testing.B) {
	const columns = "`id` varchar(64) NOT NULL, `request_id` varchar(120) NOT NULL, `campaign_id` varchar(64) NOT NULL, " +
		"`user_id` varchar(128) NOT NULL, `quantity` bigint NOT NULL, `amount` bigint NOT NULL DEFAULT 0, " +
		"`status` varchar(32) NOT NULL, `stock_returned` tinyint(1) NOT NULL DEFAULT 0, `expires_at` datetime(3), " +
		"`created_at` datetime(3), `updated_at` datetime(3), PRIMARY KEY (`id`)"
	for _, v := range []struct{ name, indexes string }{
		{"primary_key_only", ""},
		{"plus_request_id", ", UNIQUE KEY (`request_id`)"},
		{"all_three", ", UNIQUE KEY (`request_id`), KEY (`campaign_id`, `user_id`)"},
		{"plus_due", ", UNIQUE KEY (`request_id`), KEY (`campaign_id`, `user_id`), KEY (`status`, `stock_returned`, `expires_at`)"},
		{"all_five", ", UNIQUE KEY (`request_id`), KEY (`campaign_id`, `user_id`), KEY (`status`, `stock_returned`, `expires_at`), KEY (`user_id`, `created_at`)"},
		{"all_but_request_id", ", KEY (`campaign_id`, `user_id`), KEY (`status`, `stock_returned`, `expires_at`), KEY (`user_id`, `created_at`)"},
	} {
		b.Run(v.name, func(b *testing.B) {
			db := openDBs(b)[DriverMySQL](b)
			table := "bench_" + v.name
			if _, err := db.pool.ExecContext(b.Context(), "CREATE TABLE `"+table+"` ("+columns+v.indexes+")"); err != nil {
				b.Fatal(err)
			}
			const size = 512
			stmt, err := db.pool.PrepareContext(b.Context(),
				strings.Replace(insertOrdersSQL(DriverMySQL, size), "`orders`", "`"+table+"`", 1))
			if err != nil {
				b.Fatal(err)
			}
			defer stmt.Close()
			n := 0
			for b.Loop() {
				orders := testOrders("bench", n, size)
				n += size
				if _, err := stmt.ExecContext(b.Context(), orderArgs(orders, now())...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
