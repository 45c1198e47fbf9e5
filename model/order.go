package model

import "time"

// Order is a successful purchase persisted in MySQL. RequestID is unique, so
// persisting the same success twice (after a redelivery) yields one row.
type Order struct {
	ID         string
	RequestID  string
	CampaignID string
	UserID     string
	Quantity   int64
	// Amount is what the buyer pays, in the campaign's minor units: its
	// price times Quantity, fixed when the order is created.
	Amount    int64
	Status    OrderStatus
	CreatedAt time.Time
	UpdatedAt time.Time
	// ExpiresAt ends the payment window: an order still pending then
	// expires. Zero on orders stored before payment windows existed.
	ExpiresAt time.Time
	// Returned is set once a final order's units are back on sale in
	// Redis (or need not come back: a refund after the sale closed).
	Returned bool
}

// MaxOrderID is the longest order id ValidOrderID accepts.
const MaxOrderID = 64

// ValidOrderID reports whether id may name an order: the worker's ids are
// UUIDs, and anything outside `^[A-Za-z0-9_-]{1,64}$` is not worth a query.
func ValidOrderID(id string) bool { return allInSet(id, 1, MaxOrderID, campaignLow, campaignHigh) }

// ValidPaymentID reports whether id may be a provider's payment id:
// `^[A-Za-z0-9_.@:-]{1,128}$`.
func ValidPaymentID(id string) bool { return allInSet(id, 1, MaxPaymentID, paymentLow, paymentHigh) }
