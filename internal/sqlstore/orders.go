package sqlstore

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/flashsale/flashsale/model"
)

// The order lifecycle's storage: conditional transitions, the sweeper's
// queries, listings and payments.
//
// Two indexes serve it (orderRow's tags): idx_orders_due (status,
// stock_returned, expires_at) finds due pending orders and releases not yet
// applied without reading settled orders; idx_orders_user (user_id,
// created_at) lists a shopper's orders without reading anyone else's. Both
// cost the worker's INSERT something: BenchmarkInsertIndexes (plus_due,
// all_five) measures how much.

// paymentRow is the payments table: one row per provider payment id, so a
// webhook delivered twice is recorded once.
type paymentRow struct {
	ID        string    `gorm:"primaryKey;size:128"`
	OrderID   string    `gorm:"size:64;not null;index"`
	Amount    int64     `gorm:"not null"`
	Status    string    `gorm:"size:32;not null;index:idx_payments_status,priority:1"`
	CreatedAt time.Time `gorm:"index:idx_payments_status,priority:2"`
}

func (paymentRow) TableName() string { return "payments" }

func (r paymentRow) toModel() model.Payment {
	return model.Payment{ID: r.ID, OrderID: r.OrderID, Amount: r.Amount, Status: model.PaymentStatus(r.Status),
		CreatedAt: r.CreatedAt.UTC()}
}

func (r orderRow) toModel() model.Order {
	o := model.Order{ID: r.ID, RequestID: r.RequestID, CampaignID: r.CampaignID, UserID: r.UserID,
		Quantity: r.Quantity, Amount: r.Amount, Status: model.OrderStatus(r.Status), Returned: r.StockReturned,
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC()}
	if r.ExpiresAt != nil {
		o.ExpiresAt = r.ExpiresAt.UTC()
	}
	return o
}

// finalStatuses are the states whose orders give their units back.
var finalStatuses = []string{string(model.OrderCancelled), string(model.OrderExpired), string(model.OrderRefunded)}

// TransitionOrder moves an order from one state to another with one
// conditional UPDATE, and reports whether this call moved it. The database
// decides: of two callers racing from the same state (a payment and the
// expiry), on any number of instances, exactly one gets true. A move the
// lifecycle does not allow is an error.
func (db *DB) TransitionOrder(ctx context.Context, orderID string, from, to model.OrderStatus, now time.Time) (bool, error) {
	if !from.CanTransition(to) {
		return false, fmt.Errorf("order %s: %w", orderID, model.Invalid("status", fmt.Sprintf("%s cannot become %s", from, to)))
	}
	res, err := db.pool.ExecContext(ctx, "UPDATE `orders` SET `status` = ?, `updated_at` = ? WHERE `id` = ? AND `status` = ?",
		string(to), now.UTC(), orderID, string(from))
	if err != nil {
		return false, fmt.Errorf("order %s %s -> %s: %w", orderID, from, to, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("order %s %s -> %s: %w", orderID, from, to, err)
	}
	return n == 1, nil
}

// Order returns an order or model.ErrNotFound.
func (db *DB) Order(ctx context.Context, orderID string) (model.Order, error) {
	var row orderRow
	err := db.gdb.WithContext(ctx).Where("id = ?", orderID).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return model.Order{}, fmt.Errorf("order %s: %w", orderID, model.ErrNotFound)
	}
	if err != nil {
		return model.Order{}, fmt.Errorf("order %s: %w", orderID, err)
	}
	return row.toModel(), nil
}

// UserOrders lists a shopper's orders newest first, limit at a time.
// cursor is "" for the first page, then the next cursor of the page before;
// next is "" after the last page.
func (db *DB) UserOrders(ctx context.Context, userID, cursor string, limit int) (orders []model.Order, next string, err error) {
	rows, next, err := page(db.gdb.WithContext(ctx).Where("user_id = ?", userID), cursor, limit, orderRow.key)
	if err != nil {
		return nil, "", fmt.Errorf("orders of user %s: %w", userID, err)
	}
	return toModels(rows), next, nil
}

// CampaignOrderPage lists a campaign's orders newest first, limit at a
// time, only those in status unless it is "". Cursors work as in
// UserOrders.
func (db *DB) CampaignOrderPage(ctx context.Context, campaignID string, status model.OrderStatus, cursor string, limit int) (orders []model.Order, next string, err error) {
	q := db.gdb.WithContext(ctx).Where("campaign_id = ?", campaignID)
	if status != "" {
		q = q.Where("status = ?", string(status))
	}
	rows, next, err := page(q, cursor, limit, orderRow.key)
	if err != nil {
		return nil, "", fmt.Errorf("orders of campaign %s: %w", campaignID, err)
	}
	return toModels(rows), next, nil
}

// maxPage bounds one page of a listing.
const maxPage = 1000

// page reads one page of q's rows, newest first: those after cursor in
// (created_at, id) descending order. Keyed by the pair, rows sharing a
// created_at (a worker's batch) are neither repeated nor skipped between
// pages. key returns a row's pair.
func page[R any](q *gorm.DB, cursor string, limit int, key func(R) (time.Time, string)) ([]R, string, error) {
	limit = min(max(limit, 1), maxPage)
	if cursor != "" {
		at, id, err := decodeCursor(cursor)
		if err != nil {
			return nil, "", err
		}
		q = q.Where("(created_at < ? OR (created_at = ? AND id < ?))", at, at, id)
	}
	// One row more than asked tells whether a next page exists.
	var rows []R
	if err := q.Order("created_at DESC").Order("id DESC").Limit(limit + 1).Find(&rows).Error; err != nil {
		return nil, "", err
	}
	if len(rows) <= limit {
		return rows, "", nil
	}
	rows = rows[:limit]
	return rows, encodeCursor(key(rows[limit-1])), nil
}

func (r orderRow) key() (time.Time, string)   { return r.CreatedAt, r.ID }
func (r paymentRow) key() (time.Time, string) { return r.CreatedAt, r.ID }

// encodeCursor makes the opaque cursor after the row (at, id).
func encodeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixNano(), 10) + "." + id))
}

// decodeCursor reads encodeCursor's form; anything else is a client error.
func decodeCursor(s string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return time.Time{}, "", model.Invalid("cursor", "malformed")
	}
	ns, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return time.Time{}, "", model.Invalid("cursor", "malformed")
	}
	return time.Unix(0, n).UTC(), id, nil
}

// DuePending returns up to limit orders still pending payment whose
// expires_at is at or before before, earliest first: the sweeper's work
// when an expiry message was lost. Orders stored without an expiry are
// never due.
func (db *DB) DuePending(ctx context.Context, before time.Time, limit int) ([]model.Order, error) {
	var rows []orderRow
	// stock_returned is always false on a pending order; saying so lets the
	// query use idx_orders_due's whole prefix.
	err := db.gdb.WithContext(ctx).
		Where("status = ? AND stock_returned = ? AND expires_at <= ?", string(model.OrderPendingPayment), false, before.UTC()).
		Order("expires_at").Limit(min(max(limit, 1), maxPage)).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("due pending orders: %w", err)
	}
	return toModels(rows), nil
}

// Unreturned returns up to limit orders in a final state whose release is
// not marked applied (MarkReturned): a release that did not complete after
// its transition.
func (db *DB) Unreturned(ctx context.Context, limit int) ([]model.Order, error) {
	var rows []orderRow
	err := db.gdb.WithContext(ctx).Where("status IN ? AND stock_returned = ?", finalStatuses, false).
		Limit(min(max(limit, 1), maxPage)).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("unreturned orders: %w", err)
	}
	return toModels(rows), nil
}

func toModels(rows []orderRow) []model.Order {
	out := make([]model.Order, len(rows))
	for i, r := range rows {
		out[i] = r.toModel()
	}
	return out
}

// MarkReturned records that an order's release is applied, so Unreturned
// no longer lists it. It only marks an order in a final state (an active
// order holds its units) and marking twice changes nothing.
func (db *DB) MarkReturned(ctx context.Context, orderID string) error {
	err := db.gdb.WithContext(ctx).Model(&orderRow{}).Where("id = ? AND status IN ?", orderID, finalStatuses).
		Update("stock_returned", true).Error
	if err != nil {
		return fmt.Errorf("mark order %s returned: %w", orderID, err)
	}
	return nil
}

// RecordPayment stores p unless its payment id is stored already, and
// returns the payment that stands with created=true when this call stored
// it. A succeeded payment pays its order in the same transaction: the
// order moves pending_payment -> paid, or, when it is no longer pending
// (expired, cancelled, or paid by another payment), the payment is stored
// as refund_required and the order stays as it is. So the database decides
// between a payment and an expiry racing on any number of instances, and a
// crash leaves both or neither.
func (db *DB) RecordPayment(ctx context.Context, p model.Payment) (stored model.Payment, created bool, err error) {
	if !p.Status.Valid() {
		return model.Payment{}, false, fmt.Errorf("payment %s: %w", p.ID, model.Invalid("status", "unknown "+string(p.Status)))
	}
	at := p.CreatedAt.UTC()
	if at.IsZero() {
		at = now()
	}
	// At the precision MySQL keeps, so that what is returned is what is stored.
	at = at.Truncate(time.Millisecond)
	row := paymentRow{ID: p.ID, OrderID: p.OrderID, Amount: p.Amount, Status: string(p.Status), CreatedAt: at}
	err = db.gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&row)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return tx.Where("id = ?", p.ID).Take(&row).Error
		}
		created = true
		if p.Status != model.PaymentSucceeded {
			return nil
		}
		upd := tx.Model(&orderRow{}).Where("id = ? AND status = ?", p.OrderID, string(model.OrderPendingPayment)).
			Updates(map[string]any{"status": string(model.OrderPaid), "updated_at": row.CreatedAt})
		if upd.Error != nil || upd.RowsAffected == 1 {
			return upd.Error
		}
		row.Status = string(model.PaymentRefundRequired)
		return tx.Model(&paymentRow{}).Where("id = ?", p.ID).Update("status", row.Status).Error
	})
	if err != nil {
		return model.Payment{}, false, fmt.Errorf("record payment %s: %w", p.ID, err)
	}
	return row.toModel(), created, nil
}

// Payments lists payments newest first, limit at a time, only those in
// status unless it is "" (admins list refund_required). Cursors work as in
// UserOrders.
func (db *DB) Payments(ctx context.Context, status model.PaymentStatus, cursor string, limit int) (payments []model.Payment, next string, err error) {
	q := db.gdb.WithContext(ctx).Model(&paymentRow{})
	if status != "" {
		q = q.Where("status = ?", string(status))
	}
	rows, next, err := page(q, cursor, limit, paymentRow.key)
	if err != nil {
		return nil, "", fmt.Errorf("payments: %w", err)
	}
	out := make([]model.Payment, len(rows))
	for i, r := range rows {
		out[i] = r.toModel()
	}
	return out, next, nil
}
