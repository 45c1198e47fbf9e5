package model

// Status is the state of a purchase request. Every accepted request starts
// queued and ends in exactly one final status.
type Status string

// Statuses of a purchase request.
const (
	StatusQueued        Status = "queued"
	StatusSuccess       Status = "success"
	StatusSoldOut       Status = "sold_out"
	StatusLimitExceeded Status = "limit_exceeded"
	StatusRejected      Status = "rejected"
)

// FinalStatuses lists every status a request can end in.
var FinalStatuses = []Status{StatusSuccess, StatusSoldOut, StatusLimitExceeded, StatusRejected}

// Final reports whether s is an end state.
func (s Status) Final() bool {
	switch s {
	case StatusSuccess, StatusSoldOut, StatusLimitExceeded, StatusRejected:
		return true
	}
	return false
}

// Valid reports whether s is a known status.
func (s Status) Valid() bool { return s == StatusQueued || s.Final() }

// Reasons carried by StatusRejected results.
const (
	ReasonInsufficientStock = "insufficient_stock" // fewer units left than asked for, but not zero
	ReasonPoison            = "undeliverable"      // the worker gave up after repeated failures
	ReasonBadMessage        = "bad_message"        // the message could not be decoded
	// ReasonNotEnqueued: the request was admitted but not enqueued: still
	// queued the longest possible queue delay after its admission, and the
	// queue has moved past it, so its message was never stored (its
	// publish's outcome was unknown, or its gateway died before
	// publishing). The not-enqueued sweep gives it this final result.
	ReasonNotEnqueued = "not_enqueued"
	// ReasonEndedEarly: an operator ended the sale while the request was
	// still queued (Campaign.EndedEarly).
	ReasonEndedEarly = "ended_early"
	// ReasonLost: the request's state (its queued marker or result, and
	// with a queue in Redis its message) died with Redis, and the queue has
	// passed it, so nothing will decide it. A reader that finds no result
	// and no order gives it this final result (internal/store lost.lua).
	ReasonLost = "lost"
)

// OrderStatus is the lifecycle state of a persisted order. Orders start
// pending payment; lifecycle.go lists where each state may go.
type OrderStatus string

// Order statuses.
const (
	OrderPendingPayment OrderStatus = "pending_payment"
	OrderPaid           OrderStatus = "paid"
	OrderCancelled      OrderStatus = "cancelled"
	OrderExpired        OrderStatus = "expired"
	OrderRefunded       OrderStatus = "refunded"
)
