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

// exec runs the prepared INSERT of n orders with args. prepared is false
// when n has no statement and gets none; the caller then sends the text form.
func (c *insertStmts) exec(ctx context.Context, pool *sql.DB, n int, args []any) (prepared bool, err error) {
	if n < minPreparedRows {
		return false, nil
	}
	for range 2 {
		c.mu.RLock()
		if st := c.byRows[n]; st != nil {
			_, err := st.ExecContext(ctx, args...)
			c.mu.RUnlock()
			return true, err
		}
		c.mu.RUnlock()
		if !c.add(ctx, pool, n) {
			return false, nil
		}
	}
	return false, nil // evicted between add and use: rare, and text works
}

// add prepares the INSERT of n orders if the cache takes that size, and
// reports whether it holds one now.
func (c *insertStmts) add(ctx context.Context, pool *sql.DB, n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off {
		return false
	}
	if c.byRows[n] != nil {
		return true
	}
	evict := 0
	if len(c.byRows) >= maxPreparedSizes {
		evict = slices.Min(slices.Collect(maps.Keys(c.byRows)))
		if n < evict {
			return false
		}
	}
	st, err := pool.PrepareContext(ctx, insertOrdersSQL(DriverMySQL, n))
	if err != nil {
		c.failures++
		c.off = c.failures >= maxPrepareFailures
		return false
	}
	if c.byRows == nil {
		c.byRows = make(map[int]*sql.Stmt, maxPreparedSizes)
	}
	if evict != 0 {
		_ = c.byRows[evict].Close() // a text INSERT works if this fails
		delete(c.byRows, evict)
	}
	c.byRows[n] = st
	return true
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
