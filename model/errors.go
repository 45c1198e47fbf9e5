package model

import (
	"errors"
	"fmt"
)

// Sentinel errors shared by every role. The HTTP layer maps each one to a
// status and a stable code in exactly one place (internal/httpapi).
var (
	ErrNotFound       = errors.New("not found")
	ErrConflict       = errors.New("conflict")
	ErrSaleStarted    = errors.New("sale already started")
	ErrNotStarted     = errors.New("sale not started")
	ErrEnded          = errors.New("sale ended")
	ErrSoldOut        = errors.New("sold out")
	ErrLimitExceeded  = errors.New("per-user limit exceeded")
	ErrRateLimited    = errors.New("rate limited")
	ErrUnavailable    = hold("temporarily unavailable")
	ErrUnauthorized   = errors.New("unauthorized")
	ErrForbidden      = errors.New("forbidden")
	ErrNotLoaded      = hold("campaign stock not preloaded")
	ErrBodyTooLarge   = errors.New("request body too large")
	ErrTooManyStreams = errors.New("too many subscriptions")
	ErrTooManyConns   = errors.New("too many connections")

	// ErrIdempotencyKeyReused: an Idempotency-Key sent again with another
	// body; the earlier request stands and nothing changes.
	ErrIdempotencyKeyReused = errors.New("idempotency key already used for another request body")

	// Requests the API cannot take in that form: a body that is not JSON,
	// a method the route does not have.
	ErrUnsupportedMediaType = errors.New("request body must be application/json")
	ErrMethodNotAllowed     = errors.New("method not allowed")

	// The order lifecycle's refusals: the order is not in a state the
	// action starts from.
	ErrNotPayable     = errors.New("order is not payable")
	ErrNotCancellable = errors.New("order is not cancellable")
	ErrNotRefundable  = errors.New("order is not refundable")

	// Payment webhooks' refusals.
	ErrBadSignature    = errors.New("missing or invalid webhook signature")
	ErrStaleSignature  = errors.New("webhook timestamp outside the tolerance")
	ErrAmountMismatch  = errors.New("payment amount does not match the order")
	ErrPaymentConflict = errors.New("payment id already recorded with other details")

	// The ledger's: a paused sale refuses purchases (workers hold its
	// messages), and an order decided under an epoch the campaign has left
	// is refused, because Redis was rebuilt from MySQL since and the
	// request must be decided again there.
	ErrPaused      = hold("sale paused")
	ErrLedgerMoved = hold("campaign reloaded since the decision")

	// ErrMaybeNotEnqueued wraps an admission's Redis error after which the
	// admission may have been stored: the call was sent, and its reply was
	// lost (a timeout, a broken connection, a master killed mid-call). Its
	// requests are answered 503 and no message carries them, so a stored
	// one is not enqueued: the not-enqueued sweep ends it. It always comes
	// with ErrUnavailable.
	ErrMaybeNotEnqueued = errors.New("admission may be stored, not enqueued")
)

// ErrHeld is what ErrNotLoaded, ErrPaused, ErrUnavailable and
// ErrLedgerMoved also are (errors.Is): a decision that must wait, not a
// failure. Nothing is wrong with the requests; deciding them now, or giving
// up on them, would be wrong (a rebuild would wipe the result, a paused sale
// would sell, a replica's delay would reject), so a worker holds their batch
// until the cause passes, however long that takes.
var ErrHeld = errors.New("held")

// holdError is a sentinel that is also ErrHeld.
type holdError struct{ msg string }

func hold(msg string) error { return &holdError{msg: msg} }

func (e *holdError) Error() string { return e.msg }

// Is lets errors.Is(err, ErrHeld) match.
func (e *holdError) Is(target error) bool { return target == ErrHeld }

// InvalidError reports one invalid input field. It is always a client error.
type InvalidError struct {
	Field  string
	Reason string
}

func (e *InvalidError) Error() string {
	if e.Field == "" {
		return "invalid request: " + e.Reason
	}
	return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason)
}

// Invalid returns an *InvalidError for field.
func Invalid(field, reason string) error { return &InvalidError{Field: field, Reason: reason} }

// AuthError is ErrUnauthorized with a reason the client may be told: what
// is wrong with an otherwise valid token's subject, which the shopper's
// identity provider, not an attacker, chose.
type AuthError struct {
	Reason string
}

func (e *AuthError) Error() string { return ErrUnauthorized.Error() + ": " + e.Reason }

// Unwrap lets errors.Is(err, ErrUnauthorized) match.
func (e *AuthError) Unwrap() error { return ErrUnauthorized }

// RateLimitError is ErrRateLimited with the time the client should wait.
type RateLimitError struct {
	RetryAfterSeconds int
}

func (e *RateLimitError) Error() string { return ErrRateLimited.Error() }

// Unwrap lets errors.Is(err, ErrRateLimited) match.
func (e *RateLimitError) Unwrap() error { return ErrRateLimited }

// ErrChallengeFailed: a purchase of a gated campaign carried no valid,
// unexpired, unspent solution of its challenge.
var ErrChallengeFailed = errors.New("challenge failed")

// ErrRiskRefused: the shop's risk check (gateway.Risk) refused the
// purchase.
var ErrRiskRefused = errors.New("refused by the risk check")
