package model

import "time"

// The order lifecycle:
//
//	pending_payment ──> paid ──> refunded
//	       │
//	       ├──> cancelled   (by the buyer)
//	       └──> expired     (the payment window passed)
//
// Every move is one conditional update in MySQL (from the state the caller
// read), so when two instances race (a payment and the expiry in the same
// millisecond) exactly one of them wins.

// CanTransition reports whether an order in state s may move to state to.
func (s OrderStatus) CanTransition(to OrderStatus) bool {
	switch s {
	case OrderPendingPayment:
		return to == OrderPaid || to == OrderCancelled || to == OrderExpired
	case OrderPaid:
		return to == OrderRefunded
	}
	return false
}

// Active reports whether an order in state s holds its units: they are not
// on sale while it is pending payment or paid.
func (s OrderStatus) Active() bool { return s == OrderPendingPayment || s == OrderPaid }

// Final reports whether s is an end state. An order that reaches one gives
// its units back to the sale (a refund after the sale closed excepted).
func (s OrderStatus) Final() bool {
	return s == OrderCancelled || s == OrderExpired || s == OrderRefunded
}

// Valid reports whether s is a known order state.
func (s OrderStatus) Valid() bool { return s.Active() || s.Final() }

// Payment windows accepted by Campaign.Validate. One second is short, but
// load tests and demonstrations run whole lifecycles in a few seconds; a day
// bounds how long an unpaid order may hold stock.
const (
	DefaultPaymentWindow = 10 * time.Minute
	MinPaymentWindow     = time.Second
	MaxPaymentWindow     = 24 * time.Hour
)

// MaxPrice bounds Campaign.Price, in minor units: times MaxQuantity it stays
// below 2^53, so an amount survives any JSON reader exactly.
const MaxPrice = 1_000_000_000_000

// WithDefaults returns c with the defaults of the fields an admin may leave
// out: a zero payment window is DefaultPaymentWindow.
func (c Campaign) WithDefaults() Campaign {
	if c.PaymentWindow == 0 {
		c.PaymentWindow = DefaultPaymentWindow
	}
	return c
}

// PaymentStatus is what a payment provider reported for one payment.
type PaymentStatus string

// Payment statuses. A provider reports succeeded or failed;
// PaymentRefundRequired is a success that came too late: its order had
// already expired or been cancelled, so the money must go back.
const (
	PaymentSucceeded      PaymentStatus = "succeeded"
	PaymentFailed         PaymentStatus = "failed"
	PaymentRefundRequired PaymentStatus = "refund_required"
)

// Valid reports whether s is a known payment status.
func (s PaymentStatus) Valid() bool {
	return s == PaymentSucceeded || s == PaymentFailed || s == PaymentRefundRequired
}

// MaxPaymentID bounds a provider's payment id.
const MaxPaymentID = 128

// Payment is one payment attempt as its provider reported it. ID is the
// provider's payment id: recording the same one twice keeps the first.
type Payment struct {
	ID        string
	OrderID   string
	Amount    int64
	Status    PaymentStatus
	CreatedAt time.Time
}

// Checkout is what the payment step needs: what to pay for which order,
// and, with the fake provider, how it ended.
type Checkout struct {
	OrderID  string
	Amount   int64
	Provider string
	// PayBy is the order's ExpiresAt: a payment after it may come too late.
	PayBy time.Time
	// PaymentID is the payment the fake provider made; "" with another
	// provider, whose webhook reports it later.
	PaymentID string
	// Status is the order's state after the step: paid when the fake
	// provider completed it, pending_payment while a real provider's
	// payment is under way.
	Status OrderStatus
}

// Swept counts what one sweep of the order ledger did.
type Swept struct {
	Expired  int // pending orders past their window + grace, expired
	Released int // final orders whose release had not completed
}
