package sqlstore

import (
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestInsertOrdersPrepared: batches large enough for a prepared statement
// behave as text ones do: a redelivery (the same ids) is skipped, and
// a value the column cannot hold fails the batch.
func TestInsertOrdersPrepared(t *testing.T) {
	db := openDBs(t)[DriverMySQL](t)
	const c = "cp"
	first := testOrders(c, 0, minPreparedRows+8)
	mustInsert(t, db, first)
	if got := db.inserts.cachedSizes(); !slices.Equal(got, []int{len(first)}) {
		t.Fatalf("got prepared sizes %v, want [%d]", got, len(first))
	}
	again := testOrders(c, 8, len(first)) // 8 new, the rest stored already
	for i := range again {
		again[i].Amount++
	}
	mustInsert(t, db, again)
	st, err := db.CampaignOrderStats(t.Context(), c)
	if err != nil || st.Orders != int64(len(first)+8) {
		t.Fatalf("got stats %+v (%v), want %d orders", st, err, len(first)+8)
	}

	bad := testOrders(c, 1000, len(first))
	bad[3].UserID = string(make([]byte, 300)) // user_id is 255 wide
	if err := db.InsertOrders(t.Context(), bad, mustEpochs(t, db, bad)); err == nil {
		t.Fatalf("got nil, want an error for a 300-byte user id")
	}
	if st, _ := db.CampaignOrderStats(t.Context(), c); st.Orders != int64(len(first)+8) {
		t.Fatalf("after the failed batch: got %d orders, want %d", st.Orders, len(first)+8)
	}
}

// TestPreparedSizes: the cache keeps the largest sizes it has seen, and no
// size below minPreparedRows.
func TestPreparedSizes(t *testing.T) {
	db := openDBs(t)[DriverMySQL](t)
	next := 0
	insert := func(n int) {
		t.Helper()
		mustInsert(t, db, testOrders("cs", next, n))
		next += n
	}
	insert(minPreparedRows - 1)
	if got := db.inserts.cachedSizes(); len(got) != 0 {
		t.Fatalf("got prepared sizes %v after %d rows, want none", got, minPreparedRows-1)
	}
	var want []int
	for i := range maxPreparedSizes {
		insert(100 + i)
		want = append(want, 100+i)
	}
	insert(50) // smaller than every cached size: sent as text
	insert(500)
	want = append(want[1:], 500)
	if got := db.inserts.cachedSizes(); !slices.Equal(got, want) {
		t.Fatalf("got prepared sizes %v, want %v", got, want)
	}
	st, err := db.CampaignOrderStats(t.Context(), "cs")
	if err != nil || st.Orders != int64(next) {
		t.Fatalf("got stats %+v (%v), want %d orders", st, err, next)
	}
}

// TestPreparedInsertsConcurrently: many goroutines insert batches of many
// sizes at once, so statements are prepared, used and evicted concurrently
// (run with -race); every row arrives once.
func TestPreparedInsertsConcurrently(t *testing.T) {
	db := openDBs(t)[DriverMySQL](t)
	const goroutines, rounds = 16, 6
	var wg sync.WaitGroup
	total := 0
	epochs := mustEpochs(t, db, testOrders("cc", 0, 1))
	for g := range goroutines {
		for r := range rounds {
			n := minPreparedRows + (g*rounds+r)%(3*maxPreparedSizes)
			from := total
			total += n
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := db.InsertOrders(t.Context(), testOrders("cc", from, n), epochs); err != nil {
					t.Errorf("InsertOrders(%d): %v", n, err)
				}
			}()
		}
	}
	wg.Wait()
	st, err := db.CampaignOrderStats(t.Context(), "cc")
	if err != nil || st.Orders != int64(total) {
		t.Fatalf("got stats %+v (%v), want %d orders", st, err, total)
	}
	if got := db.inserts.cachedSizes(); len(got) > maxPreparedSizes {
		t.Fatalf("got %d prepared sizes, want at most %d", len(got), maxPreparedSizes)
	}
}

// TestPreparedInsertAfterConnectionLoss: when MySQL drops the connections a
// statement was prepared on (a restart, a proxy timeout), the next insert of
// that size prepares it again on a new connection, and every row arrives
// once.
func TestPreparedInsertAfterConnectionLoss(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	db, err := Open(t.Context(), DriverMySQL, dsn)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	const n = minPreparedRows + 8
	mustInsert(t, db, testOrders("cl", 0, n))

	// Kill this database's connections, from a connection of its own.
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	killer, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer killer.Close()
	rows, err := killer.QueryContext(t.Context(),
		"SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()", cfg.DBName)
	if err != nil {
		t.Fatalf("list connections: %v", err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	_ = rows.Close()
	if len(ids) == 0 {
		t.Fatalf("no connection of database %s to kill", cfg.DBName)
	}
	for _, id := range ids {
		if _, err := killer.ExecContext(t.Context(), fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
			t.Fatalf("kill %d: %v", id, err)
		}
	}

	mustInsert(t, db, testOrders("cl", n, n))
	st, err := db.CampaignOrderStats(t.Context(), "cl")
	if err != nil || st.Orders != 2*n {
		t.Fatalf("got stats %+v (%v), want %d orders", st, err, 2*n)
	}
	if got := db.inserts.cachedSizes(); !slices.Equal(got, []int{n}) {
		t.Fatalf("got prepared sizes %v, want [%d]", got, n)
	}
}
