package model

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/flashsale/flashsale/internal/wire"
)

// MessageVersion is the version of the PurchaseRequest wire format. Decoders
// refuse other versions so a rolling upgrade fails loudly, not silently.
const MessageVersion = 1

// MaxQuantity bounds one request; the per-user limit usually bounds it more.
const MaxQuantity = 1000

// MaxUserID is the longest user id, in bytes, CheckUserID accepts: the JWT
// subject of any identity provider (Auth0's "auth0|5f7c…", Google's
// digits), stored whole wherever a user id is kept.
const MaxUserID = 255

// ValidUserID reports whether id may name a shopper (the JWT subject).
func ValidUserID(id string) bool { return CheckUserID(id) == "" }

// CheckUserID returns why id may not name a shopper, or "" when it may: it
// must be 1 to MaxUserID bytes of printable UTF-8 (unicode.IsPrint: letters,
// marks, numbers, punctuation, symbols and the ASCII space; no control,
// format or invalid bytes, which could forge log lines or hide in a
// listing). Every separator is allowed: the stores carry any such id
// (internal/store).
func CheckUserID(id string) string {
	switch {
	case id == "":
		return "empty"
	case len(id) > MaxUserID:
		return fmt.Sprintf("longer than %d bytes", MaxUserID)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x20 || c > 0x7e {
			return checkUnicode(id[i:])
		}
	}
	return "" // printable ASCII, as nearly every subject is, without decoding
}

// checkUnicode is CheckUserID's check of the rest of an id that left ASCII.
func checkUnicode(s string) string {
	if !utf8.ValidString(s) {
		return "not valid UTF-8"
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Sprintf("holds the unprintable character %U", r)
		}
	}
	return ""
}

// PurchaseRequest is the message the gateway enqueues and the worker consumes.
//
// Its wire form is the JSON of this struct (encoding/json's, byte for byte);
// EncodePurchaseRequest and DecodePurchaseRequest leave the common case to
// internal/wire's hand-written codec and everything else to encoding/json.
type PurchaseRequest struct {
	Version    int       `json:"v"`
	RequestID  string    `json:"request_id"`
	CampaignID string    `json:"campaign_id"`
	UserID     string    `json:"user_id"`
	Quantity   int64     `json:"quantity"`
	AdmittedAt time.Time `json:"admitted_at"`
}

// Validate checks the fields a worker relies on.
func (p PurchaseRequest) Validate() error {
	switch {
	case !ValidCampaignID(p.CampaignID):
		return Invalid("campaign_id", "malformed")
	case !ValidUserID(p.UserID):
		return Invalid("user_id", "malformed")
	case p.Quantity < 1 || p.Quantity > MaxQuantity:
		return Invalid("quantity", fmt.Sprintf("must be between 1 and %d", MaxQuantity))
	}
	c, ok := CampaignOfRequest(p.RequestID)
	if !ok || c != p.CampaignID {
		return Invalid("request_id", "malformed")
	}
	return nil
}

// EncodePurchaseRequest returns the versioned wire form of p: exactly what
// json.Marshal writes, so any version of the worker reads it.
func EncodePurchaseRequest(p PurchaseRequest) ([]byte, error) {
	p.Version = MessageVersion
	if b, ok := wire.EncodePurchaseRequest(wire.PurchaseRequest(p)); ok {
		return b, nil
	}
	return json.Marshal(p) // a string to escape (never a valid request), or a year json refuses
}

// DecodePurchaseRequest parses and validates a wire message.
func DecodePurchaseRequest(b []byte) (PurchaseRequest, error) {
	w, ok := wire.DecodePurchaseRequest(b)
	p := PurchaseRequest(w)
	if !ok {
		var err error
		if p, err = decodePurchaseRequestJSON(b); err != nil {
			return PurchaseRequest{}, err
		}
	}
	if p.Version != MessageVersion {
		return PurchaseRequest{}, Invalid("v", fmt.Sprintf("unsupported message version %d", p.Version))
	}
	if err := p.Validate(); err != nil {
		return PurchaseRequest{}, err
	}
	return p, nil
}

// decodePurchaseRequestJSON is the encoding/json path: the fallback for
// anything wire does not read, and the tests' reference.
func decodePurchaseRequestJSON(b []byte) (PurchaseRequest, error) {
	var p PurchaseRequest
	if err := json.Unmarshal(b, &p); err != nil {
		return PurchaseRequest{}, Invalid("message", "not JSON: "+err.Error())
	}
	return p, nil
}

// A request id is "<tag>.<32 hex digits>", the tag being the campaign id
// or its bucket's tag (BucketTag). Carrying it lets any instance find the
// request's result under its hash tag without a global index; '.' never
// occurs in a tag, so the split is unambiguous.
const requestIDTailLen = 32

// FormatRequestID joins a tag (a campaign id or a bucket's tag) and 32
// lowercase hex digits.
func FormatRequestID(tag, hex32 string) string { return tag + "." + hex32 }

// CampaignOfRequest returns the campaign a request id belongs to. The tail
// must be exactly 32 lowercase hex digits.
func CampaignOfRequest(requestID string) (string, bool) {
	tag, ok := TagOfRequest(requestID)
	if !ok {
		return "", false
	}
	c, _, _ := SplitTag(tag)
	return c, true
}

// AdmissionSkew is what a rule that reads a request's admission from its
// id (AdmittedAt) allows for it: the UUIDv7's millisecond is the gateway's
// clock, taken before its batch's admit.lua call, while Redis's clock
// judges. A gateway whose clock runs this much behind Redis's (or whose
// batch waited this long) would have a request judged lost up to this
// much early.
const AdmissionSkew = time.Second

// AdmittedAt returns when the gateway admitted a request: the millisecond
// of the UUIDv7 in its id's tail (its first 48 bits), by the gateway's
// clock. ok is false for anything but a request id.
func AdmittedAt(requestID string) (at time.Time, ok bool) {
	if _, ok := TagOfRequest(requestID); !ok {
		return time.Time{}, false
	}
	var b [8]byte // TagOfRequest checked the digits
	_, _ = hex.Decode(b[2:], []byte(requestID[len(requestID)-requestIDTailLen:][:12]))
	return time.UnixMilli(int64(binary.BigEndian.Uint64(b[:]))), true
}
