package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/flashsale/flashsale/model"
)

// Degraded mode (issue 28): while Redis is unreachable, MySQL decides a
// campaign's purchases. Who decides is the campaign row's decided_in_mysql,
// so every process agrees: TakeOver sets it, Decide and ReturnUnits work
// under it, and the next load into Redis (BumpEpoch) clears it. While it is
// set, units_held is the units of the campaign's active orders, changed
// only under the row's lock.

// decisionRow is the decisions table: the refusals MySQL decided, so that a
// request decided again, or polled (Decided), gets the same one. A success
// needs no row: its order is its decision.
type decisionRow struct {
	RequestID  string `gorm:"primaryKey;size:120"`
	CampaignID string `gorm:"size:64;not null;index"`
	UserID     string `gorm:"size:255;not null"`
	Status     string `gorm:"size:32;not null"`
	Reason     string `gorm:"size:64;not null"`
	Quantity   int64  `gorm:"not null"`
	CreatedAt  time.Time
}

func (decisionRow) TableName() string { return "decisions" }

func (r decisionRow) toResult() model.Result {
	return model.Result{RequestID: r.RequestID, CampaignID: r.CampaignID, UserID: r.UserID, Status: model.Status(r.Status),
		Reason: r.Reason, Quantity: r.Quantity}
}

// activeStatuses are the states whose orders hold their units.
var activeStatuses = []string{string(model.OrderPendingPayment), string(model.OrderPaid)}

// maxIDsPerQuery bounds the IN list of one read of Decided and Decide.
const maxIDsPerQuery = 500

// TakeOver makes MySQL the decider of campaign id and returns the campaign
// as it is now; one MySQL decides already is returned unchanged. In one
// transaction, the row locked: the epoch moves on, so that orders Redis
// decided under the old one are refused (model.ErrLedgerMoved) and decided
// again; units_held becomes the units of the campaign's active orders; and
// every final order not marked returned is marked, since its units are
// free in that count and ReturnUnits must not free them again. An unknown
// campaign is model.ErrNotFound.
//
// The count is exact. An insert under the old epoch holds a shared lock on
// the row from its epoch check to its commit, so it committed before the
// lock here was granted (its orders are counted) or it reads the new epoch
// and is refused. On MySQL the active orders are counted with a locking
// read, so none turns final before the commit: every final order the
// marking finds was final, and not counted, when counted.
func (db *DB) TakeOver(ctx context.Context, id string) (model.Campaign, error) {
	var row campaignRow
	err := db.gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if row, err = db.lockCampaign(tx, id); err != nil || row.DecidedInMySQL {
			return err
		}
		q := "SELECT COALESCE(SUM(`quantity`), 0) FROM `orders` WHERE `campaign_id` = ? AND `status` IN ?"
		if db.driver == DriverMySQL {
			q += " LOCK IN SHARE MODE"
		}
		var held int64
		if err := tx.Raw(q, id, activeStatuses).Scan(&held).Error; err != nil {
			return fmt.Errorf("units held: %w", err)
		}
		if err := tx.Exec("UPDATE `orders` SET `stock_returned` = TRUE WHERE `campaign_id` = ? AND `status` IN ? AND `stock_returned` = FALSE",
			id, finalStatuses).Error; err != nil {
			return fmt.Errorf("mark final orders returned: %w", err)
		}
		if err := tx.Exec("UPDATE `campaigns` SET `ledger_epoch` = `ledger_epoch` + 1, `decided_in_mysql` = TRUE, `units_held` = ?, `updated_at` = ? WHERE `id` = ?",
			held, now(), id).Error; err != nil {
			return err
		}
		return tx.Where("id = ?", id).Take(&row).Error
	})
	if err != nil {
		return model.Campaign{}, fmt.Errorf("take over campaign %s: %w", id, err)
	}
	return row.toModel(), nil
}

// Decide decides a batch of purchase requests of campaign id while MySQL
// decides it, in order, in one transaction with the campaign's row locked,
// and returns one result per deduction, in the same order. It decides as
// deduct.lua does, with its statuses and reasons: a request decided before
// (or earlier in the batch) gets the result that stands, its order or its
// stored refusal. Of the others, in a sale ended early each is rejected
// (ended_early); otherwise one is sold_out when nothing remains, rejected
// (insufficient_stock) when less remains than it asks for, limit_exceeded
// when its buyer's active orders and successes in the batch would pass the
// per-user limit, and else a success: an order pending payment until now
// plus the payment window, its id the deduction's OrderID, which must be
// model.OrderIDOf its request id (Decided finds it there). Refusals are
// stored in decisions. A campaign MySQL does not decide is
// model.ErrLedgerMoved (Redis decides it: the caller goes back there), a
// paused one not ended early model.ErrPaused; neither writes anything.
func (db *DB) Decide(ctx context.Context, id string, ds []model.Deduction, now time.Time) ([]model.Result, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	for _, d := range ds {
		if d.OrderID != model.OrderIDOf(d.RequestID) {
			return nil, fmt.Errorf("decide %s: request %s: %w", id, d.RequestID, model.Invalid("order_id", "must be the request's derived order id"))
		}
	}
	tx, err := db.pool.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("decide %d requests of %s: %w", len(ds), id, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	results, err := db.decide(ctx, tx, id, ds, now.UTC())
	if err != nil {
		return nil, fmt.Errorf("decide %d requests of %s: %w", len(ds), id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("decide %d requests of %s: commit: %w", len(ds), id, err)
	}
	return results, nil
}

// decide is Decide inside tx.
func (db *DB) decide(ctx context.Context, tx *sql.Tx, id string, ds []model.Deduction, now time.Time) ([]model.Result, error) {
	c, err := db.lockDeciding(ctx, tx, id)
	switch {
	case err != nil:
		return nil, err
	case !c.decided:
		return nil, fmt.Errorf("campaign %s is decided in Redis: %w", id, model.ErrLedgerMoved)
	case c.paused && !c.endedEarly:
		return nil, fmt.Errorf("campaign %s: %w", id, model.ErrPaused)
	}
	requestIDs := make([]string, 0, len(ds))
	seen := make(map[string]bool, len(ds))
	for _, d := range ds {
		if !seen[d.RequestID] {
			seen[d.RequestID] = true
			requestIDs = append(requestIDs, d.RequestID)
		}
	}
	stood := make(map[string]model.Result, len(ds))
	if err := forChunks(requestIDs, func(ids []string) error { return readDecided(ctx, tx, ids, stood) }); err != nil {
		return nil, err
	}
	remaining := c.stock - c.held
	// bought is each buyer's units: their active orders', then this batch's
	// successes too. Neither a sale ended early nor one sold out needs it.
	bought := map[string]int64{}
	if !c.endedEarly && remaining > 0 {
		var users []string
		for _, d := range ds {
			if _, ok := stood[d.RequestID]; !ok {
				if _, ok := bought[d.UserID]; !ok {
					bought[d.UserID] = 0
					users = append(users, d.UserID)
				}
			}
		}
		if err := forChunks(users, func(us []string) error { return readBought(ctx, tx, id, us, bought) }); err != nil {
			return nil, err
		}
	}
	results := make([]model.Result, len(ds))
	var orders []model.Order
	var refusals []model.Result
	var sold int64
	for i, d := range ds {
		if r, ok := stood[d.RequestID]; ok {
			results[i] = r
			continue
		}
		r := model.Result{RequestID: d.RequestID, CampaignID: id, UserID: d.UserID, Quantity: d.Quantity}
		switch {
		case d.Quantity < 1:
			r.Status, r.Reason = model.StatusRejected, model.ReasonBadMessage
		case c.endedEarly:
			r.Status, r.Reason = model.StatusRejected, model.ReasonEndedEarly
		case remaining <= 0:
			r.Status = model.StatusSoldOut
		case d.Quantity > remaining:
			r.Status, r.Reason = model.StatusRejected, model.ReasonInsufficientStock
		case bought[d.UserID]+d.Quantity > c.limit:
			r.Status = model.StatusLimitExceeded
		default:
			r.Status, r.OrderID = model.StatusSuccess, d.OrderID
			remaining -= d.Quantity
			sold += d.Quantity
			bought[d.UserID] += d.Quantity
			orders = append(orders, model.Order{ID: d.OrderID, RequestID: d.RequestID, CampaignID: id, UserID: d.UserID,
				Quantity: d.Quantity, Amount: c.price * d.Quantity, Status: model.OrderPendingPayment,
				ExpiresAt: now.Add(time.Duration(c.paymentWindowMS) * time.Millisecond)})
		}
		if r.Status != model.StatusSuccess {
			refusals = append(refusals, r)
		}
		stood[d.RequestID] = r
		results[i] = r
	}
	if err := db.insertDecided(ctx, tx, orders, refusals, now); err != nil {
		return nil, err
	}
	if sold > 0 {
		if _, err := tx.ExecContext(ctx, "UPDATE `campaigns` SET `units_held` = ? WHERE `id` = ?", c.held+sold, id); err != nil {
			return nil, fmt.Errorf("units held: %w", err)
		}
	}
	return results, nil
}

// deciding is what Decide and ReturnUnits read of a campaign's row.
type deciding struct {
	stock, limit, price, paymentWindowMS, held int64
	paused, endedEarly, decided                bool
}

// lockDeciding reads campaign id's row inside tx as lockCampaign does: on
// MySQL with an exclusive lock held to the commit, which serialises every
// Decide, ReturnUnits, TakeOver and load of the campaign.
func (db *DB) lockDeciding(ctx context.Context, tx *sql.Tx, id string) (deciding, error) {
	q := "SELECT `stock`, `per_user_limit`, `price`, `payment_window_ms`, `units_held`, `paused`, `ended_early`, `decided_in_mysql` " +
		"FROM `campaigns` WHERE `id` = ?"
	if db.driver == DriverMySQL {
		q += " FOR UPDATE"
	}
	var c deciding
	err := tx.QueryRowContext(ctx, q, id).Scan(&c.stock, &c.limit, &c.price, &c.paymentWindowMS, &c.held, &c.paused, &c.endedEarly, &c.decided)
	if errors.Is(err, sql.ErrNoRows) {
		return deciding{}, fmt.Errorf("campaign %s: %w", id, model.ErrNotFound)
	}
	if err != nil {
		return deciding{}, fmt.Errorf("campaign %s: %w", id, err)
	}
	return c, nil
}

// insertDecided stores a batch's new orders and refusals. An order id
// already stored is another request's (Decide found no order of the
// request), so it fails the batch rather than be skipped as a redelivery.
func (db *DB) insertDecided(ctx context.Context, tx *sql.Tx, orders []model.Order, refusals []model.Result, now time.Time) error {
	for start := 0; start < len(orders); start += maxOrdersPerInsert {
		chunk := orders[start:min(start+maxOrdersPerInsert, len(orders))]
		res, err := tx.ExecContext(ctx, insertOrdersSQL(db.driver, len(chunk)), orderArgs(chunk, now)...)
		if err != nil {
			return fmt.Errorf("insert %d orders: %w", len(chunk), err)
		}
		// ON DUPLICATE KEY UPDATE of no change counts 0, as DO NOTHING does.
		if n, err := res.RowsAffected(); err != nil || n != int64(len(chunk)) {
			return fmt.Errorf("insert %d orders: %d inserted (%v): an order id is another request's: %w", len(chunk), n, err, model.ErrConflict)
		}
	}
	const row = "(?,?,?,?,?,?,?)"
	for start := 0; start < len(refusals); start += maxOrdersPerInsert {
		chunk := refusals[start:min(start+maxOrdersPerInsert, len(refusals))]
		args := make([]any, 0, 7*len(chunk))
		for _, r := range chunk {
			args = append(args, r.RequestID, r.CampaignID, r.UserID, string(r.Status), r.Reason, r.Quantity, now)
		}
		q := "INSERT INTO `decisions` (`request_id`,`campaign_id`,`user_id`,`status`,`reason`,`quantity`,`created_at`) VALUES " +
			row + strings.Repeat(","+row, len(chunk)-1)
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("insert %d decisions: %w", len(chunk), err)
		}
	}
	return nil
}

// Decided returns what MySQL holds as decided of requestIDs, by request id:
// a success for each whose order is stored (the order id model.OrderIDOf
// the request id, and the order's request id this one), a refusal for each
// that Decide stored one for. Ids with neither are missing. Readers (a
// poll, the WebSocket recheck) ask it while Redis is down; it reads with
// two queries per maxIDsPerQuery ids.
func (db *DB) Decided(ctx context.Context, requestIDs []string) (map[string]model.Result, error) {
	out := make(map[string]model.Result, len(requestIDs))
	if err := forChunks(requestIDs, func(ids []string) error { return readDecided(ctx, db.pool, ids, out) }); err != nil {
		return nil, fmt.Errorf("decided of %d requests: %w", len(requestIDs), err)
	}
	return out, nil
}

// querier is *sql.DB or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readDecided adds to out what MySQL holds as decided of requestIDs (as
// Decided). The orders are read after the refusals: a request that has both
// was refused here and decided again by Redis after a hand-back, and its
// order holds units.
func readDecided(ctx context.Context, q querier, requestIDs []string, out map[string]model.Result) error {
	if len(requestIDs) == 0 {
		return nil
	}
	args := make([]any, len(requestIDs))
	for i, id := range requestIDs {
		args[i] = id
	}
	rows, err := q.QueryContext(ctx, "SELECT `request_id`, `campaign_id`, `user_id`, `status`, `reason`, `quantity` FROM `decisions` WHERE `request_id` IN "+
		placeholders(len(args)), args...)
	if err != nil {
		return fmt.Errorf("decisions: %w", err)
	}
	err = scanRows(rows, func() error {
		var r model.Result
		if err := rows.Scan(&r.RequestID, &r.CampaignID, &r.UserID, &r.Status, &r.Reason, &r.Quantity); err != nil {
			return err
		}
		out[r.RequestID] = r
		return nil
	})
	if err != nil {
		return fmt.Errorf("decisions: %w", err)
	}
	for i, id := range requestIDs {
		args[i] = model.OrderIDOf(id)
	}
	rows, err = q.QueryContext(ctx, "SELECT `id`, `request_id`, `campaign_id`, `user_id`, `quantity` FROM `orders` WHERE `id` IN "+
		placeholders(len(args)), args...)
	if err != nil {
		return fmt.Errorf("orders: %w", err)
	}
	err = scanRows(rows, func() error {
		r := model.Result{Status: model.StatusSuccess}
		if err := rows.Scan(&r.OrderID, &r.RequestID, &r.CampaignID, &r.UserID, &r.Quantity); err != nil {
			return err
		}
		// An order id is a hash: one stored under another request's id
		// is not this request's success.
		if r.OrderID == model.OrderIDOf(r.RequestID) {
			out[r.RequestID] = r
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("orders: %w", err)
	}
	return nil
}

// readBought adds to bought the units of users' active orders of
// campaign id.
func readBought(ctx context.Context, tx *sql.Tx, id string, users []string, bought map[string]int64) error {
	args := make([]any, 0, 1+len(activeStatuses)+len(users))
	args = append(args, id)
	for _, s := range activeStatuses {
		args = append(args, s)
	}
	for _, u := range users {
		args = append(args, u)
	}
	rows, err := tx.QueryContext(ctx, "SELECT `user_id`, SUM(`quantity`) FROM `orders` WHERE `campaign_id` = ? AND `status` IN "+
		placeholders(len(activeStatuses))+" AND `user_id` IN "+placeholders(len(users))+" GROUP BY `user_id`", args...)
	if err != nil {
		return fmt.Errorf("units bought: %w", err)
	}
	err = scanRows(rows, func() error {
		var user string
		var units int64
		if err := rows.Scan(&user, &units); err != nil {
			return err
		}
		bought[user] += units
		return nil
	})
	if err != nil {
		return fmt.Errorf("units bought: %w", err)
	}
	return nil
}

// ReturnUnits gives a final order's units back to its campaign while MySQL
// decides it, exactly once: in one transaction with the campaign's row
// locked, an order in a final state not marked returned is marked and
// units_held falls by its quantity (returned is true); any other order
// changes nothing. A campaign MySQL does not decide is
// model.ErrLedgerMoved: the caller releases to Redis. An unknown order is
// model.ErrNotFound.
func (db *DB) ReturnUnits(ctx context.Context, orderID string) (returned bool, err error) {
	tx, err := db.pool.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("return units of order %s: %w", orderID, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	returned, err = db.returnUnits(ctx, tx, orderID)
	if err != nil {
		return false, fmt.Errorf("return units of order %s: %w", orderID, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("return units of order %s: commit: %w", orderID, err)
	}
	return returned, nil
}

// returnUnits is ReturnUnits inside tx.
func (db *DB) returnUnits(ctx context.Context, tx *sql.Tx, orderID string) (bool, error) {
	// An order's campaign and quantity never change: they need no lock.
	var campaignID string
	var units int64
	var deciding bool
	err := tx.QueryRowContext(ctx, "SELECT o.`campaign_id`, o.`quantity`, c.`decided_in_mysql` FROM `orders` o "+
		"JOIN `campaigns` c ON c.`id` = o.`campaign_id` WHERE o.`id` = ?", orderID).Scan(&campaignID, &units, &deciding)
	if errors.Is(err, sql.ErrNoRows) {
		return false, model.ErrNotFound
	}
	if err != nil {
		return false, err
	}
	// Redis decides nearly always: a release then takes no lock on the
	// campaign's row, which every insert of the sale reads. A take-over
	// after this read is safe: the order is final already, so TakeOver
	// counts its units free and marks it returned.
	if !deciding {
		return false, fmt.Errorf("campaign %s is decided in Redis: %w", campaignID, model.ErrLedgerMoved)
	}
	c, err := db.lockDeciding(ctx, tx, campaignID)
	if err != nil {
		return false, err
	}
	if !c.decided {
		return false, fmt.Errorf("campaign %s is decided in Redis: %w", campaignID, model.ErrLedgerMoved)
	}
	// The conditional UPDATE reads the order as committed, not as the
	// transaction first saw it, and marks it once.
	args := []any{orderID}
	for _, s := range finalStatuses {
		args = append(args, s)
	}
	res, err := tx.ExecContext(ctx, "UPDATE `orders` SET `stock_returned` = TRUE WHERE `id` = ? AND `status` IN "+
		placeholders(len(finalStatuses))+" AND `stock_returned` = FALSE", args...)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE `campaigns` SET `units_held` = `units_held` - ? WHERE `id` = ?", units, campaignID); err != nil {
		return false, fmt.Errorf("units held: %w", err)
	}
	return true, nil
}

// Refusals returns the results of the requests of campaign id that MySQL
// refused while it decided the campaign, for a load to carry into Redis.
func (db *DB) Refusals(ctx context.Context, id string) ([]model.Result, error) {
	var rows []decisionRow
	if err := db.gdb.WithContext(ctx).Where("campaign_id = ?", id).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("refusals of campaign %s: %w", id, err)
	}
	out := make([]model.Result, len(rows))
	for i, r := range rows {
		out[i] = r.toResult()
	}
	return out, nil
}

// CampaignsDecidedInMySQL lists the campaigns MySQL decides (degraded
// mode): those a process that sees Redis answer hands back.
func (db *DB) CampaignsDecidedInMySQL(ctx context.Context) ([]string, error) {
	var ids []string
	if err := db.gdb.WithContext(ctx).Model(&campaignRow{}).Where("decided_in_mysql = ?", true).Pluck("id", &ids).Error; err != nil {
		return nil, fmt.Errorf("campaigns decided in MySQL: %w", err)
	}
	return ids, nil
}

// forChunks calls fn with ids, maxIDsPerQuery at a time.
func forChunks(ids []string, fn func([]string) error) error {
	for start := 0; start < len(ids); start += maxIDsPerQuery {
		if err := fn(ids[start:min(start+maxIDsPerQuery, len(ids))]); err != nil {
			return err
		}
	}
	return nil
}

// placeholders is "(?,?,…)" of n (≥ 1) arguments.
func placeholders(n int) string { return "(?" + strings.Repeat(",?", n-1) + ")" }

// scanRows calls scan for each of rows, then closes them.
func scanRows(rows *sql.Rows, scan func() error) error {
	defer rows.Close()
	for rows.Next() {
		if err := scan(); err != nil {
			return err
		}
	}
	return rows.Err()
}

// DecidedStats counts campaign id as MySQL holds it while it decides the
// campaign (degraded mode), for the admin's stats while Redis cannot
// answer; decided is false, and st empty, while Redis decides it. Sold is
// units_held; a success is an order (those Redis decided before the
// outage among them) and a refusal a decisions row (Redis's own refusals
// stay in Redis): Admitted is the requests MySQL holds a result of, and
// none of them is queued.
func (db *DB) DecidedStats(ctx context.Context, id string) (st model.Stats, decided bool, err error) {
	c, err := db.Campaign(ctx, id)
	if err != nil || !c.DecidedInMySQL {
		return model.Stats{}, false, err
	}
	os, err := db.CampaignOrderStats(ctx, id)
	if err != nil {
		return model.Stats{}, false, err
	}
	var refusals []struct {
		Status string
		N      int64
	}
	if err := db.gdb.WithContext(ctx).Model(&decisionRow{}).Where("campaign_id = ?", id).
		Select("status, COUNT(*) AS n").Group("status").Scan(&refusals).Error; err != nil {
		return model.Stats{}, false, fmt.Errorf("refusals of campaign %s: %w", id, err)
	}
	st = model.Stats{Loaded: true, Stock: c.Stock, Sold: c.UnitsHeld, Remaining: max(c.Stock-c.UnitsHeld, 0),
		Admitted: os.Orders, FinishedByStatus: map[model.Status]int64{}}
	st.SoldOut = st.Remaining == 0
	if os.Orders > 0 {
		st.FinishedByStatus[model.StatusSuccess] = os.Orders
	}
	for _, r := range refusals {
		st.FinishedByStatus[model.Status(r.Status)] += r.N
		st.Admitted += r.N
	}
	return st, true, nil
}
