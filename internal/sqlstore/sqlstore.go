// Package sqlstore persists campaigns and orders through gorm, on MySQL in
// production and on SQLite (pure Go) in the embedded default. Row structs stay
// here; callers see model types only.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	gomysql "github.com/go-sql-driver/mysql"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/flashsale/flashsale/model"
)

// campaignRow is the campaigns table.
type campaignRow struct {
	ID           string `gorm:"primaryKey;size:64"`
	Name         string `gorm:"size:200;not null"`
	Stock        int64  `gorm:"not null"`
	PerUserLimit int64  `gorm:"not null"`
	Price        int64  `gorm:"not null;default:0"`
	// PaymentWindowMS is the payment window in milliseconds; campaigns
	// stored before it existed get the default.
	PaymentWindowMS int64 `gorm:"column:payment_window_ms;not null;default:600000"`
	StartAt         time.Time
	EndAt           time.Time
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// LedgerEpoch is model.Campaign.Epoch: BumpEpoch moves it, and
	// InsertOrders refuses orders decided under another one.
	LedgerEpoch int64 `gorm:"column:ledger_epoch;not null;default:0"`
	// ChallengeBits is model.Campaign.ChallengeBits; 0 (no challenge) for
	// campaigns stored before it existed.
	ChallengeBits int `gorm:"column:challenge_bits;not null;default:0"`
	// Buckets is model.Campaign.Buckets; 1 (one bucket, as before
	// buckets) for rows created before the column.
	Buckets    int  `gorm:"column:buckets;not null;default:1"`
	Paused     bool `gorm:"not null;default:false"`
	EndedEarly bool `gorm:"column:ended_early;not null;default:false"`
	// DecidedInMySQL and UnitsHeld are model.Campaign's: TakeOver sets
	// them, Decide and ReturnUnits keep UnitsHeld, BumpEpoch clears
	// DecidedInMySQL (decide.go).
	DecidedInMySQL bool  `gorm:"column:decided_in_mysql;not null;default:false"`
	UnitsHeld      int64 `gorm:"column:units_held;not null;default:0"`
}

func (campaignRow) TableName() string { return "campaigns" }

// orderRow is the orders table. Its primary key, the order id, is derived
// from the request id (model.OrderIDOf), so it is what makes persisting a
// redelivered success a no-op; request_id needs no index of its own (only
// reconciliation reads it, a campaign's orders at a time), and databases
// keep their old unique one only while they hold orders whose id is not
// derived (keepRequestIndex). Status has no index of its own:
// nearly every row holds the same value, so it would slow every insert and
// speed up no query (docs/BENCHMARKS.md); databases migrated before keep
// theirs, which is harmless. The lifecycle's two indexes (see orders.go) are
// the sweeper's and a shopper's listing.
type orderRow struct {
	ID         string `gorm:"primaryKey;size:64"`
	RequestID  string `gorm:"size:120;not null"`
	CampaignID string `gorm:"size:64;not null;index:idx_orders_campaign_user,priority:1"`
	// UserID holds any JWT subject (model.MaxUserID bytes; varchar counts
	// characters, so 255 of them always fit). gorm widens an older, narrower
	// column at Open.
	UserID   string `gorm:"size:255;not null;index:idx_orders_campaign_user,priority:2;index:idx_orders_user,priority:1"`
	Quantity int64  `gorm:"not null"`
	Amount   int64  `gorm:"not null;default:0"`
	Status   string `gorm:"size:32;not null;index:idx_orders_due,priority:1"`
	// StockReturned is set once an order's units are back in Redis (or
	// need not come back): the sweeper completes releases it lacks.
	StockReturned bool       `gorm:"not null;default:false;index:idx_orders_due,priority:2"`
	ExpiresAt     *time.Time `gorm:"index:idx_orders_due,priority:3"`
	CreatedAt     time.Time  `gorm:"index:idx_orders_user,priority:2"`
	UpdatedAt     time.Time
}

func (orderRow) TableName() string { return "orders" }

// DB is flashsale's relational store.
type DB struct {
	gdb    *gorm.DB
	pool   *sql.DB // gorm's pool, for the batched order insert
	driver string
	// inserts holds the prepared order INSERTs (MySQL only: SQLite runs in
	// the process, so there is no text to send and parse).
	inserts insertStmts
	// afterEpochCheck, set by tests only, runs inside InsertOrders'
	// transaction once the epochs are checked: an insert held there holds
	// its locking read.
	afterEpochCheck func()
}

// Driver names accepted by Open.
const (
	DriverMySQL  = "mysql"
	DriverSQLite = "sqlite"
)

// Open connects with driver ("mysql" or "sqlite") and dsn, and migrates the
// schema. For SQLite ":memory:" keeps everything in the process.
func Open(ctx context.Context, driver, dsn string) (*DB, error) {
	var dial gorm.Dialector
	switch driver {
	case DriverMySQL:
		cfg, err := gomysql.ParseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("open mysql database: dsn: %w", err)
		}
		cfg.ParseTime = true // gorm scans DATETIME into time.Time
		cfg.Loc = time.UTC
		// Without I/O timeouts a stalled server blocks a worker forever instead
		// of failing the batch so that it is retried.
		if cfg.Timeout == 0 {
			cfg.Timeout = 3 * time.Second
		}
		if cfg.ReadTimeout == 0 {
			cfg.ReadTimeout = 10 * time.Second
		}
		if cfg.WriteTimeout == 0 {
			cfg.WriteTimeout = 10 * time.Second
		}
		// The driver writes the arguments into the statement itself (it
		// escapes them, and refuses the character sets where that is
		// unsafe), so a statement with arguments is one round trip instead
		// of prepare, execute and close (docs/BENCHMARKS.md).
		cfg.InterpolateParams = true
		dial = mysql.Open(cfg.FormatDSN())
	case DriverSQLite:
		dial = sqlite.Open(dsn)
	default:
		return nil, fmt.Errorf("open database: unknown driver %q", driver)
	}
	gdb, err := gorm.Open(dial, &gorm.Config{
		TranslateError:         true,
		SkipDefaultTransaction: true,
		Logger:                 logger.Discard,
		NowFunc:                now,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", driver, err)
	}
	sqlDB, err := gdb.DB()
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", driver, err)
	}
	if driver == DriverSQLite {
		// One connection: an in-memory SQLite database lives in its connection,
		// and SQLite serialises writers anyway.
		sqlDB.SetMaxOpenConns(1)
	} else {
		sqlDB.SetMaxOpenConns(32)
		sqlDB.SetMaxIdleConns(16)
		sqlDB.SetConnMaxLifetime(30 * time.Minute)
	}
	db := &DB{gdb: gdb, pool: sqlDB, driver: driver}
	if err := db.Ping(ctx); err != nil {
		_ = sqlDB.Close()
		return nil, err
	}
	if err := db.migrate(ctx); err != nil {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("migrate %s database: %w", driver, err)
	}
	return db, nil
}

// binaryCollation is every MySQL table's collation: ids are exact strings
// (b1 and B1 are two campaigns), as SQLite compares them. MySQL's default
// collations ignore case, and would answer B1 with b1, refuse to create
// B1, and skip B1's orders as duplicates of b1's.
const binaryCollation = "utf8mb4_bin"

// migratedTables are the tables Open migrates.
var migratedTables = []string{"campaigns", "orders", "payments", "decisions"}

// migrate creates or updates the schema. On MySQL new tables are created
// with binaryCollation, and tables created before with another collation
// (by an earlier version, or on a server whose default differs) are
// converted once; the conversion copies the table, so it is best done by
// the first process started after an upgrade, before a sale.
func (db *DB) migrate(ctx context.Context) error {
	gdb := db.gdb.WithContext(ctx)
	if db.driver == DriverMySQL {
		gdb = gdb.Set("gorm:table_options", "CHARACTER SET utf8mb4 COLLATE "+binaryCollation)
	}
	keep, err := db.keepRequestIndex(ctx)
	if err != nil {
		return err
	}
	var orders any = &orderRow{}
	if keep {
		orders = &legacyOrderRow{}
	}
	if err := gdb.AutoMigrate(&campaignRow{}, orders, &paymentRow{}, &decisionRow{}, &idempotencyKeyRow{}); err != nil {
		return err
	}
	if !keep {
		if err := db.dropRequestIndex(ctx); err != nil {
			return err
		}
	}
	if db.driver != DriverMySQL {
		return nil
	}
	for _, table := range migratedTables {
		// The table's default counts too: it is what columns added later get.
		var others int64
		err := db.pool.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "+
			"AND TABLE_NAME = ? AND COLLATION_NAME IS NOT NULL AND COLLATION_NAME <> ?) + (SELECT COUNT(*) FROM information_schema.TABLES "+
			"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND TABLE_COLLATION <> ?)",
			table, binaryCollation, table, binaryCollation).Scan(&others)
		if err != nil {
			return fmt.Errorf("collation of %s: %w", table, err)
		}
		if others == 0 {
			continue
		}
		if _, err := db.pool.ExecContext(ctx, "ALTER TABLE `"+table+"` CONVERT TO CHARACTER SET utf8mb4 COLLATE "+binaryCollation); err != nil {
			return fmt.Errorf("convert %s to %s: %w", table, binaryCollation, err)
		}
	}
	return nil
}

// legacyRequestIndex is the unique index on orders.request_id that made a
// redelivered success's INSERT a no-op while order ids were drawn at
// random (UUIDv7) rather than derived from the request id.
const legacyRequestIndex = "idx_orders_request_id"

// legacyOrderRow is orderRow with legacyRequestIndex, what Open migrates
// while the database keeps the index: gorm's MySQL migrator drops a
// single-column unique index that the model does not declare.
type legacyOrderRow struct {
	orderRow
	RequestID string `gorm:"size:120;not null;uniqueIndex:idx_orders_request_id"`
}

// keepRequestIndex reports whether the orders table has
// legacyRequestIndex and must keep it: while any stored order's id is not
// its request's derived one, the index is what would refuse that request
// stored again under its derived id (were it decided again, its stored
// result lost). Once every id is derived, the primary key refuses
// whatever the index would, and the index goes. Existing orders keep
// their ids, which shoppers hold. A new database never has the index; a
// migrated one scans its orders at every Open until the index goes,
// stopping at the first drawn id.
func (db *DB) keepRequestIndex(ctx context.Context) (bool, error) {
	if !db.gdb.WithContext(ctx).Migrator().HasIndex(&orderRow{}, legacyRequestIndex) {
		return false, nil
	}
	return db.hasDrawnOrderID(ctx)
}

// dropRequestIndex drops legacyRequestIndex if it is there.
func (db *DB) dropRequestIndex(ctx context.Context) error {
	m := db.gdb.WithContext(ctx).Migrator()
	if !m.HasIndex(&orderRow{}, legacyRequestIndex) {
		return nil
	}
	// Another process starting at the same time may drop it first.
	if err := m.DropIndex(&orderRow{}, legacyRequestIndex); err != nil && m.HasIndex(&orderRow{}, legacyRequestIndex) {
		return fmt.Errorf("drop %s: %w", legacyRequestIndex, err)
	}
	return nil
}

// hasDrawnOrderID reports whether any stored order's id is not
// model.OrderIDOf its request id, reading the orders in primary-key
// order, a page at a time, until it finds one.
func (db *DB) hasDrawnOrderID(ctx context.Context) (bool, error) {
	const pageSize = 1000
	after := ""
	for {
		rows, err := db.pool.QueryContext(ctx, "SELECT `id`, `request_id` FROM `orders` WHERE `id` > ? ORDER BY `id` LIMIT ?", after, pageSize)
		if err != nil {
			return false, fmt.Errorf("order ids: %w", err)
		}
		n, drawn := 0, false
		for !drawn && rows.Next() {
			var requestID string
			if err := rows.Scan(&after, &requestID); err != nil {
				_ = rows.Close()
				return false, fmt.Errorf("order ids: %w", err)
			}
			n++
			drawn = after != model.OrderIDOf(requestID)
		}
		err = errors.Join(rows.Err(), rows.Close())
		switch {
		case err != nil:
			return false, fmt.Errorf("order ids: %w", err)
		case drawn || n < pageSize:
			return drawn, nil
		}
	}
}

// Close closes the connection pool.
func (db *DB) Close() error {
	sqlDB, err := db.gdb.DB()
	if err != nil {
		return err
	}
	return errors.Join(db.inserts.close(), sqlDB.Close())
}

// Ping checks that the database answers.
func (db *DB) Ping(ctx context.Context) error {
	sqlDB, err := db.gdb.DB()
	if err != nil {
		return fmt.Errorf("database ping: %w", err)
	}
	if err := sqlDB.PingContext(ctx); err != nil {
		return fmt.Errorf("database ping: %w", err)
	}
	return nil
}

// CreateCampaign stores a new campaign, with model.Campaign.WithDefaults; an
// existing id is model.ErrConflict.
func (db *DB) CreateCampaign(ctx context.Context, c model.Campaign) (model.Campaign, error) {
	c = c.WithDefaults()
	row := campaignRow{ID: c.ID, Name: c.Name, Stock: c.Stock, PerUserLimit: c.PerUserLimit,
		Price: c.Price, PaymentWindowMS: c.PaymentWindow.Milliseconds(), ChallengeBits: c.ChallengeBits, Buckets: max(c.Buckets, 1),
		StartAt: c.StartAt.UTC(), EndAt: c.EndAt.UTC()}
	err := db.gdb.WithContext(ctx).Create(&row).Error
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		return model.Campaign{}, fmt.Errorf("create campaign %s: %w", c.ID, model.ErrConflict)
	}
	if err != nil {
		return model.Campaign{}, fmt.Errorf("create campaign %s: %w", c.ID, err)
	}
	return row.toModel(), nil
}

// CampaignIDs returns the ids of the campaigns, at most limit + 1 (one
// more than limit says there are more): the primary key's index alone.
func (db *DB) CampaignIDs(ctx context.Context, limit int) ([]string, error) {
	var ids []string
	if err := db.gdb.WithContext(ctx).Model(&campaignRow{}).Limit(limit+1).Pluck("id", &ids).Error; err != nil {
		return nil, fmt.Errorf("campaign ids: %w", err)
	}
	return ids, nil
}

// Campaign returns a campaign or model.ErrNotFound.
func (db *DB) Campaign(ctx context.Context, id string) (model.Campaign, error) {
	var row campaignRow
	err := db.gdb.WithContext(ctx).Where("id = ?", id).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return model.Campaign{}, fmt.Errorf("campaign %s: %w", id, model.ErrNotFound)
	}
	if err != nil {
		return model.Campaign{}, fmt.Errorf("campaign %s: %w", id, err)
	}
	return row.toModel(), nil
}

func (r campaignRow) toModel() model.Campaign {
	return model.Campaign{ID: r.ID, Name: r.Name, Stock: r.Stock, PerUserLimit: r.PerUserLimit,
		Price: r.Price, PaymentWindow: time.Duration(r.PaymentWindowMS) * time.Millisecond,
		StartAt: r.StartAt.UTC(), EndAt: r.EndAt.UTC(), CreatedAt: r.CreatedAt.UTC(),
		Epoch: model.Epoch(r.LedgerEpoch), Paused: r.Paused, EndedEarly: r.EndedEarly, ChallengeBits: r.ChallengeBits, Buckets: max(r.Buckets, 1),
		DecidedInMySQL: r.DecidedInMySQL, UnitsHeld: r.UnitsHeld}
}

// now is the time gorm and InsertOrders stamp rows with: UTC, at the
// microsecond precision both databases keep.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// maxOrdersPerInsert bounds one INSERT statement: 10 values a row keep it
// far below MySQL's 65,535 placeholders and SQLite's 32,766 variables.
const maxOrdersPerInsert = 1000

// orderColumns are the orders table's columns in the order insertOrdersSQL
// lists them and orderArgs fills them.
const orderColumns = "(`id`,`request_id`,`campaign_id`,`user_id`,`quantity`,`amount`,`status`,`expires_at`,`created_at`,`updated_at`)"

// InsertOrders stores orders with one multi-row INSERT per
// maxOrdersPerInsert, fenced by the ledger epoch: epochs names, for every
// campaign of orders, the epoch its orders were decided under (what Redis
// said, model.DeductReply.Epoch), and nothing is stored unless each is the
// campaign's epoch in MySQL, model.ErrLedgerMoved otherwise. Orders whose
// id is already stored are skipped: an order's id is model.OrderIDOf its
// request id (the worker's, and what callers must give), so a redelivered
// batch inserts nothing twice. Each order's Amount and ExpiresAt are stored as given (a
// zero ExpiresAt as none); created_at and updated_at are the time of the
// call.
//
// The check and the INSERTs share one transaction, and on MySQL the check
// is a locking read: a load's BumpEpoch waits for the inserts that read the
// old epoch to commit, and every insert after it sees the new one. So the
// orders a load reads after its bump are every order that will ever be
// stored under an earlier epoch.
//
// It is written in SQL rather than through gorm's CreateInBatches because it
// runs for every batch of successes: gorm reflects over every row and field
// to build the same statement.
func (db *DB) InsertOrders(ctx context.Context, orders []model.Order, epochs model.Epochs) error {
	if len(orders) == 0 {
		return nil
	}
	if db.driver == DriverMySQL {
		db.inserts.prepare(ctx, db.pool, min(len(orders), maxOrdersPerInsert))
		db.inserts.prepare(ctx, db.pool, len(orders)%maxOrdersPerInsert)
	}
	tx, err := db.pool.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("insert %d orders: %w", len(orders), err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if err := db.checkEpochs(ctx, tx, orders, epochs); err != nil {
		return fmt.Errorf("insert %d orders: %w", len(orders), err)
	}
	if db.afterEpochCheck != nil {
		db.afterEpochCheck()
	}
	at := now()
	for start := 0; start < len(orders); start += maxOrdersPerInsert {
		chunk := orders[start:min(start+maxOrdersPerInsert, len(orders))]
		args := orderArgs(chunk, at)
		prepared := false
		var err error
		if db.driver == DriverMySQL {
			prepared, err = db.inserts.exec(ctx, tx, len(chunk), args)
		}
		if !prepared {
			_, err = tx.ExecContext(ctx, insertOrdersSQL(db.driver, len(chunk)), args...)
		}
		if err != nil {
			return fmt.Errorf("insert %d orders: %w", len(orders), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("insert %d orders: commit: %w", len(orders), err)
	}
	return nil
}

// checkEpochs reads, inside tx, the epoch of every campaign of orders (on
// MySQL with a shared lock, held to the commit) and compares each with
// epochs.
func (db *DB) checkEpochs(ctx context.Context, tx *sql.Tx, orders []model.Order, epochs model.Epochs) error {
	// A batch is nearly always one campaign's.
	ids := []string{orders[0].CampaignID}
	for _, o := range orders[1:] {
		if o.CampaignID != ids[len(ids)-1] && !slices.Contains(ids, o.CampaignID) {
			ids = append(ids, o.CampaignID)
		}
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		if _, ok := epochs[id]; !ok {
			return fmt.Errorf("orders of campaign %s: no epoch given", id)
		}
		args[i] = id
	}
	q := "SELECT `id`, `ledger_epoch` FROM `campaigns` WHERE `id` IN (?" + strings.Repeat(",?", len(ids)-1) + ")"
	if db.driver == DriverMySQL {
		// SQLite needs no lock: it runs one writer at a time.
		q += " LOCK IN SHARE MODE"
	}
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("campaign epochs: %w", err)
	}
	defer rows.Close()
	found := 0
	for rows.Next() {
		var id string
		var epoch model.Epoch
		if err := rows.Scan(&id, &epoch); err != nil {
			return fmt.Errorf("campaign epochs: %w", err)
		}
		if epoch != epochs[id] {
			return fmt.Errorf("orders of campaign %s decided under epoch %d, now %d: %w", id, epochs[id], epoch, model.ErrLedgerMoved)
		}
		found++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("campaign epochs: %w", err)
	}
	if found != len(ids) {
		return fmt.Errorf("orders of campaigns %v: %w", ids, model.ErrNotFound)
	}
	return nil
}

// insertOrdersSQL is the INSERT of n orders. Only a duplicate is ignored:
// MySQL's ON DUPLICATE KEY UPDATE with a no-op assignment (what gorm writes
// for OnConflict{DoNothing}) and SQLite's ON CONFLICT DO NOTHING skip a row
// whose id exists (or, in a database that keeps legacyRequestIndex, whose
// request_id does), while every other error (a value too long,
// a NULL) still fails the statement, which INSERT IGNORE would turn into a
// warning and a truncated row.
func insertOrdersSQL(driver string, n int) string {
	const row = "(?,?,?,?,?,?,?,?,?,?)"
	var b strings.Builder
	b.Grow(64 + len(orderColumns) + n*(len(row)+1) + 40)
	b.WriteString("INSERT INTO `orders` ")
	b.WriteString(orderColumns)
	b.WriteString(" VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(row)
	}
	if driver == DriverSQLite {
		b.WriteString(" ON CONFLICT DO NOTHING")
	} else {
		b.WriteString(" ON DUPLICATE KEY UPDATE `id`=`id`")
	}
	return b.String()
}

// orderArgs are the values of insertOrdersSQL, row by row.
func orderArgs(orders []model.Order, at time.Time) []any {
	args := make([]any, 0, 10*len(orders))
	for _, o := range orders {
		var expires any // NULL when zero
		if !o.ExpiresAt.IsZero() {
			expires = o.ExpiresAt.UTC()
		}
		args = append(args, o.ID, o.RequestID, o.CampaignID, o.UserID, o.Quantity, o.Amount, string(o.Status), expires, at, at)
	}
	return args
}

// CampaignOrderStats counts a campaign's stored orders.
func (db *DB) CampaignOrderStats(ctx context.Context, campaignID string) (model.OrderStats, error) {
	var out struct {
		Orders int64
		Units  int64
	}
	err := db.gdb.WithContext(ctx).Model(&orderRow{}).Where("campaign_id = ?", campaignID).
		Select("COUNT(*) AS orders, COALESCE(SUM(quantity), 0) AS units").Scan(&out).Error
	if err != nil {
		return model.OrderStats{}, fmt.Errorf("order stats %s: %w", campaignID, err)
	}
	return model.OrderStats{Orders: out.Orders, Units: out.Units}, nil
}

// CampaignOrders lists a campaign's orders (for reconciliation and tests).
func (db *DB) CampaignOrders(ctx context.Context, campaignID string) ([]model.Order, error) {
	var rows []orderRow
	if err := db.gdb.WithContext(ctx).Where("campaign_id = ?", campaignID).Order("request_id").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("orders of %s: %w", campaignID, err)
	}
	return toModels(rows), nil
}
