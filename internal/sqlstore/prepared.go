package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"slices"
	"sync"
)

// Prepared INSERTs of the order batch sizes a worker repeats.
//
// A multi-row INSERT sent as text (interpolated arguments) is parsed by the
// server every time, and at a worker's batch sizes that parse is a large
// part of MariaDB's work (docs/BENCHMARKS.md). A prepared statement is
// parsed once per connection and runs with the binary protocol, still one
// round trip. A statement has a fixed row count, so one is kept per size;
// under load a worker's batches are nearly all its full size, so a few sizes
// carry nearly every row. The cache keeps the largest sizes it has seen (a
// larger one evicts the smallest), so it holds the full size however many
// odd sizes come first, and it settles: a size only enters by being larger
// than one it replaces.
const (
	// minPreparedRows: below this, parsing is cheap and the sizes many.
	minPreparedRows = 32
	// maxPreparedSizes bounds the statements per connection on the server
	// (MariaDB's max_prepared_stmt_count is shared by all its clients).
	maxPreparedSizes = 8
)

// insertStmts is the cache. Executions hold the read lock, so a statement
// is only closed (evicted, or at Close) when none runs on it.
type insertStmts struct {
	mu     sync.RWMutex
	byRows map[int]*sql.Stmt
	// off is set at close, and after maxPrepareFailures failed PREPAREs
	// (say the server's statement limit is reached): from then on every
	// insert is sent as text.
	off      bool
	failures int
}

const maxPrepareFailures = 3

// prepare makes sure the INSERT of n orders has a statement, if the cache
// takes that size. It runs before the insert's transaction begins:
// preparing takes a connection of the pool, and an insert that waited for
// one while holding its transaction's could wait for the last of them.
func (c *insertStmts) prepare(ctx context.Context, pool *sql.DB, n int) {
	if n < minPreparedRows {
		return
	}
	c.mu.RLock()
	ok := c.byRows[n] != nil
	c.mu.RUnlock()
	if ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off || c.byRows[n] != nil {
		return
	}
	evict := 0
	if len(c.byRows) >= maxPreparedSizes {
		evict = slices.Min(slices.Collect(maps.Keys(c.byRows)))
		if n < evict {
			return
		}
	}
	st, err := pool.PrepareContext(ctx, insertOrdersSQL(DriverMySQL, n))
	if err != nil {
		c.failures++
		c.off = c.failures >= maxPrepareFailures
		return
	}
	if c.byRows == nil {
		c.byRows = make(map[int]*sql.Stmt, maxPreparedSizes)
	}
	if evict != 0 {
		_ = c.byRows[evict].Close() // a text INSERT works if this fails
		delete(c.byRows, evict)
	}
	c.byRows[n] = st
}

// exec runs the prepared INSERT of n orders with args in tx. prepared is
// false when n has no statement (the cache did not take the size, or
// evicted it since prepare); the caller then sends the text form.
// tx.StmtContext reuses the statement on tx's connection once it is
// prepared there, and otherwise prepares it there once.
func (c *insertStmts) exec(ctx context.Context, tx *sql.Tx, n int, args []any) (prepared bool, err error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	st := c.byRows[n]
	if st == nil {
		return false, nil
	}
	_, err = tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	return true, err
}

// close closes every statement; inserts after it are sent as text.
func (c *insertStmts) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off = true
	var errs []error
	for _, st := range c.byRows {
		errs = append(errs, st.Close())
	}
	c.byRows = nil
	return errors.Join(errs...)
}

// cachedSizes returns the row counts that have a statement, for tests.
func (c *insertStmts) cachedSizes() []int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return slices.Sorted(maps.Keys(c.byRows))
}
