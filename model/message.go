package model

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// MessageVersion is the version of the PurchaseRequest wire format. Decoders
// refuse other versions so a rolling upgrade fails loudly, not silently.
const MessageVersion = 1

// MaxQuantity bounds one request; the per-user limit usually bounds it more.
const MaxQuantity = 1000

var userIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.@:-]{1,128}$`)

// ValidUserID reports whether id may name a shopper (the JWT subject).
func ValidUserID(id string) bool { return userIDPattern.MatchString(id) }

// PurchaseRequest is the message the gateway enqueues and the worker consumes.
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

// EncodePurchaseRequest returns the versioned wire form of p.
func EncodePurchaseRequest(p PurchaseRequest) ([]byte, error) {
	p.Version = MessageVersion
	return json.Marshal(p)
}

// DecodePurchaseRequest parses and validates a wire message.
func DecodePurchaseRequest(b []byte) (PurchaseRequest, error) {
	var p PurchaseRequest
	if err := json.Unmarshal(b, &p); err != nil {
		return PurchaseRequest{}, Invalid("message", "not JSON: "+err.Error())
	}
	if p.Version != MessageVersion {
		return PurchaseRequest{}, Invalid("v", fmt.Sprintf("unsupported message version %d", p.Version))
	}
	if err := p.Validate(); err != nil {
		return PurchaseRequest{}, err
	}
	return p, nil
}

// A request id is "<campaign id>.<32 hex digits>". Carrying the campaign lets
// any instance find the request's result under the campaign's hash tag without
// a global index; '.' never occurs in a campaign id, so the split is unambiguous.
var requestIDTail = regexp.MustCompile(`^[0-9a-f]{32}$`)

// FormatRequestID joins a campaign id and 32 lowercase hex digits.
func FormatRequestID(campaignID, hex32 string) string { return campaignID + "." + hex32 }

// CampaignOfRequest returns the campaign a request id belongs to.
func CampaignOfRequest(requestID string) (string, bool) {
	i := strings.LastIndexByte(requestID, '.')
	if i < 0 {
		return "", false
	}
	c, tail := requestID[:i], requestID[i+1:]
	if !ValidCampaignID(c) || !requestIDTail.MatchString(tail) {
		return "", false
	}
	return c, true
}
