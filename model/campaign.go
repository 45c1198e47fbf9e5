package model

import "time"

// Campaign limits accepted by Validate.
const (
	MaxStock      = 10_000_000
	MaxCampaignID = 64
)

// Campaign is one flash sale: a fixed stock sold in a time window with a
// per-user limit.
type Campaign struct {
	ID           string
	Name         string
	Stock        int64
	PerUserLimit int64
	// Price is one unit's price in minor units (cents); 0 is free.
	Price int64
	// PaymentWindow is how long a buyer has to pay before the order
	// expires and its units go back on sale (WithDefaults fills it in).
	PaymentWindow time.Duration
	StartAt       time.Time
	EndAt         time.Time
	CreatedAt     time.Time
	// Epoch counts the campaign's loads into Redis (0: never loaded). Each
	// load starts a new one, and an order decided under an older one is
	// refused (ErrLedgerMoved): the fence between the ledger and Redis.
	Epoch int64
	// Paused holds the sale: the gateway refuses purchases and workers
	// hold the campaign's messages until it resumes.
	Paused bool
}

// ValidCampaignID reports whether id may name a campaign. Campaign ids end up
// inside Redis hash tags and request ids, so the alphabet is deliberately small.
// It accepts exactly `^[A-Za-z0-9_-]{1,64}$`.
func ValidCampaignID(id string) bool {
	return allInSet(id, 1, MaxCampaignID, campaignLow, campaignHigh)
}

// Validate checks every field an admin supplies.
func (c Campaign) Validate() error {
	switch {
	case !ValidCampaignID(c.ID):
		return Invalid("id", "must match [A-Za-z0-9_-]{1,64}")
	case c.Name == "" || len(c.Name) > 200:
		return Invalid("name", "must be 1 to 200 bytes")
	case c.Stock < 1 || c.Stock > MaxStock:
		return Invalid("stock", "must be between 1 and 10000000")
	case c.PerUserLimit < 1:
		return Invalid("per_user_limit", "must be at least 1")
	case c.Price < 0 || c.Price > MaxPrice:
		return Invalid("price", "must be between 0 and 1000000000000")
	case c.PaymentWindow != 0 && (c.PaymentWindow < MinPaymentWindow || c.PaymentWindow > MaxPaymentWindow):
		return Invalid("payment_window", "must be between 1s and 24h (0 means 10m)")
	case c.PaymentWindow%time.Millisecond != 0:
		return Invalid("payment_window", "must be whole milliseconds")
	case c.StartAt.IsZero():
		return Invalid("start_at", "is required")
	case c.EndAt.IsZero():
		return Invalid("end_at", "is required")
	case !c.EndAt.After(c.StartAt):
		return Invalid("end_at", "must be after start_at")
	}
	return nil
}

// Window reports whether the sale is open at now.
func (c Campaign) Window(now time.Time) error {
	if now.Before(c.StartAt) {
		return ErrNotStarted
	}
	if !now.Before(c.EndAt) {
		return ErrEnded
	}
	return nil
}
