package model

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Order is a successful purchase persisted in MySQL. Its ID is
// OrderIDOf(RequestID), the table's primary key, so persisting the same
// success twice (after a redelivery) yields one row.
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

// OrderIDOf returns the order id of a successful request: the same for the
// same request id every time it is decided (after a redelivery, or again
// after a load moved the ledger's epoch), so the order's primary key is
// what deduplicates it. It is a UUID in canonical text form, version 8
// (RFC 9562's custom layout). The first 60 bits are the time bits of the
// request id's tail, which the gateway makes a UUIDv7 (milliseconds, then
// a sub-millisecond fraction that keeps one gateway's ids increasing), so
// orders sort by admission and the database appends to its primary key
// rather than splitting its pages. The other 62 bits are the SHA-256 of
// the whole request id, since the tail alone is not unique across
// campaigns (model only checks its form): two requests share an order id
// only if both agree. An id that is not a request id is hashed whole.
func OrderIDOf(requestID string) string {
	var buf [128]byte // on the stack: every request id fits
	sum := sha256.Sum256(append(buf[:0], requestID...))
	var id [16]byte
	if _, ok := CampaignOfRequest(requestID); ok {
		tail := requestID[len(requestID)-requestIDTailLen:]
		_, _ = hex.Decode(id[:8], []byte(tail[:16])) // CampaignOfRequest checked the digits
	} else {
		copy(id[:8], sum[8:16])
	}
	copy(id[8:], sum[:8])
	id[6] = 0x80 | id[6]&0x0f // version 8
	id[8] = 0x80 | id[8]&0x3f // variant 10, RFC 9562
	var text [36]byte
	hex.Encode(text[0:8], id[0:4])
	hex.Encode(text[9:13], id[4:6])
	hex.Encode(text[14:18], id[6:8])
	hex.Encode(text[19:23], id[8:10])
	hex.Encode(text[24:36], id[10:16])
	text[8], text[13], text[18], text[23] = '-', '-', '-', '-'
	return string(text[:])
}

// ValidOrderID reports whether id may name an order: the worker's ids are
// UUIDs (OrderIDOf; before it, version 7), and anything outside `^[A-Za-z0-9_-]{1,64}$` is not worth a query.
func ValidOrderID(id string) bool { return allInSet(id, 1, MaxOrderID, campaignLow, campaignHigh) }

// ValidPaymentID reports whether id may be a provider's payment id:
// `^[A-Za-z0-9_.@:-]{1,128}$`.
func ValidPaymentID(id string) bool { return allInSet(id, 1, MaxPaymentID, paymentLow, paymentHigh) }
