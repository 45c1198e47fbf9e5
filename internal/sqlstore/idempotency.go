package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Idempotency-Keys of purchases decided in MySQL, while Redis is out and a
// gateway decides its campaigns here (issue 28). While Redis decides, its
// own keys (admit.lua) are the ones that count: the two sets are not
// merged, so a key first used on one side names a new request on the other
// (the per-user limit still holds across both).

// idempotencyKeyRow is the idempotency_keys table: a shopper's key within
// one campaign names the first request that claimed it, and that
// request's quantity, the body a replay must repeat.
type idempotencyKeyRow struct {
	CampaignID string `gorm:"primaryKey;size:64"`
	// UserID holds any JWT subject, as orders.user_id does.
	UserID    string `gorm:"primaryKey;size:255"`
	IdemKey   string `gorm:"column:idem_key;primaryKey;size:64"`
	RequestID string `gorm:"size:120;not null"`
	Quantity  int64  `gorm:"not null"`
	CreatedAt time.Time
}

func (idempotencyKeyRow) TableName() string { return "idempotency_keys" }

// ClaimKey makes requestID the holder of key, the Idempotency-Key userID
// sent in campaignID, unless a request holds it already, and returns the
// holder and its quantity: requestID and quantity when this call claimed
// it. Of concurrent claims of one key exactly one wins, on any number of
// processes: the INSERT ignores only a duplicate of the primary key, and
// the read after it sees whichever INSERT committed.
func (db *DB) ClaimKey(ctx context.Context, campaignID, userID, key string, quantity int64, requestID string) (stored string, storedQty int64, err error) {
	q := "INSERT INTO `idempotency_keys` (`campaign_id`,`user_id`,`idem_key`,`request_id`,`quantity`,`created_at`) VALUES (?,?,?,?,?,?)"
	if db.driver == DriverSQLite {
		q += " ON CONFLICT DO NOTHING"
	} else {
		q += " ON DUPLICATE KEY UPDATE `campaign_id`=`campaign_id`"
	}
	if _, err := db.pool.ExecContext(ctx, q, campaignID, userID, key, requestID, quantity, now()); err != nil {
		return "", 0, fmt.Errorf("claim idempotency key of %s in %s: %w", userID, campaignID, err)
	}
	stored, storedQty, err = db.KeyHolder(ctx, campaignID, userID, key)
	if err != nil {
		return "", 0, fmt.Errorf("claim idempotency key: %w", err)
	}
	return stored, storedQty, nil
}

// KeyHolder returns the request that holds key, the Idempotency-Key userID
// sent in campaignID, and its quantity; model.ErrNotFound when none does.
func (db *DB) KeyHolder(ctx context.Context, campaignID, userID, key string) (requestID string, quantity int64, err error) {
	err = db.pool.QueryRowContext(ctx, "SELECT `request_id`, `quantity` FROM `idempotency_keys` WHERE `campaign_id` = ? AND `user_id` = ? AND `idem_key` = ?",
		campaignID, userID, key).Scan(&requestID, &quantity)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, fmt.Errorf("idempotency key of %s in %s: %w", userID, campaignID, model.ErrNotFound)
	}
	if err != nil {
		return "", 0, fmt.Errorf("idempotency key of %s in %s: %w", userID, campaignID, err)
	}
	return requestID, quantity, nil
}
