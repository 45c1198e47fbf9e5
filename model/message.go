package model

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// MessageVersion is the version of the PurchaseRequest wire format. Decoders
// refuse other versions so a rolling upgrade fails loudly, not silently.
const MessageVersion = 1

// MaxQuantity bounds one request; the per-user limit usually bounds it more.
const MaxQuantity = 1000

// MaxUserID is the longest user id ValidUserID accepts.
const MaxUserID = 128

// ValidUserID reports whether id may name a shopper (the JWT subject). It
// accepts exactly `^[A-Za-z0-9_.@:-]{1,128}$`.
func ValidUserID(id string) bool { return allInSet(id, 1, MaxUserID, userLow, userHigh) }

// PurchaseRequest is the message the gateway enqueues and the worker consumes.
//
// Its wire form is the JSON of this struct (encoding/json's, byte for byte);
// EncodePurchaseRequest and DecodePurchaseRequest write and read the common
// case by hand and defer everything else to encoding/json.
type PurchaseRequest struct {
	Version    int       `json:"v"`
	RequestID  string    `json:"request_id"`
	CampaignID string    `json:"campaign_id"`
	UserID     string    `json:"user_id"`
	Quantity   int64     `json:"quantity"`
	AcceptedAt time.Time `json:"accepted_at"`
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
	if !JSONSafe(p.RequestID) || !JSONSafe(p.CampaignID) || !JSONSafe(p.UserID) {
		return json.Marshal(p) // escapes; never a valid request anyway
	}
	b := make([]byte, 0, 160+len(p.RequestID)+len(p.CampaignID)+len(p.UserID))
	b = append(b, `{"v":`...)
	b = appendInt(b, int64(p.Version))
	b = append(b, `,"request_id":`...)
	b = appendStr(b, p.RequestID)
	b = append(b, `,"campaign_id":`...)
	b = appendStr(b, p.CampaignID)
	b = append(b, `,"user_id":`...)
	b = appendStr(b, p.UserID)
	b = append(b, `,"quantity":`...)
	b = appendInt(b, p.Quantity)
	b = append(b, `,"accepted_at":`...)
	b, err := appendTime(b, p.AcceptedAt)
	if err != nil {
		return json.Marshal(p) // a year outside 0-9999: json's own error
	}
	return append(b, '}'), nil
}

// DecodePurchaseRequest parses and validates a wire message.
func DecodePurchaseRequest(b []byte) (PurchaseRequest, error) {
	p, ok := decodePurchaseRequestLite(b)
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
// anything decodePurchaseRequestLite does not read, and the reference the
// equivalence tests hold it to.
func decodePurchaseRequestJSON(b []byte) (PurchaseRequest, error) {
	var p PurchaseRequest
	if err := json.Unmarshal(b, &p); err != nil {
		return PurchaseRequest{}, Invalid("message", "not JSON: "+err.Error())
	}
	return p, nil
}

// decodePurchaseRequestLite reads what EncodePurchaseRequest writes (keys in
// any order, any subset); ok is false when encoding/json must decide.
func decodePurchaseRequestLite(b []byte) (p PurchaseRequest, ok bool) {
	d := NewLiteDecoder(b)
	ok = d.Members(func(key string) (uint16, bool) {
		var ok bool
		switch key {
		case "v":
			var v int64
			v, ok = d.Int()
			p.Version = int(v)
			return 1 << 0, ok
		case "request_id":
			p.RequestID, ok = d.Str()
			return 1 << 1, ok
		case "campaign_id":
			p.CampaignID, ok = d.Str()
			return 1 << 2, ok
		case "user_id":
			p.UserID, ok = d.Str()
			return 1 << 3, ok
		case "quantity":
			p.Quantity, ok = d.Int()
			return 1 << 4, ok
		case "accepted_at":
			p.AcceptedAt, ok = d.Time()
			return 1 << 5, ok
		}
		return 0, false
	})
	return p, ok
}

// A request id is "<campaign id>.<32 hex digits>". Carrying the campaign lets
// any instance find the request's result under the campaign's hash tag without
// a global index; '.' never occurs in a campaign id, so the split is unambiguous.
const requestIDTailLen = 32

// FormatRequestID joins a campaign id and 32 lowercase hex digits.
func FormatRequestID(campaignID, hex32 string) string { return campaignID + "." + hex32 }

// CampaignOfRequest returns the campaign a request id belongs to. The tail
// must be exactly 32 lowercase hex digits.
func CampaignOfRequest(requestID string) (string, bool) {
	i := strings.LastIndexByte(requestID, '.')
	if i < 0 {
		return "", false
	}
	c, tail := requestID[:i], requestID[i+1:]
	if !ValidCampaignID(c) || !allInSet(tail, requestIDTailLen, requestIDTailLen, hexLow, hexHigh) {
		return "", false
	}
	return c, true
}
