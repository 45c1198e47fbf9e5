package model

import (
	"encoding/json"
	"time"
)

// Result is the outcome of a purchase request as shoppers see it.
type Result struct {
	RequestID  string    `json:"request_id"`
	CampaignID string    `json:"campaign_id"`
	UserID     string    `json:"user_id"`
	Status     Status    `json:"status"`
	Reason     string    `json:"reason,omitempty"`
	OrderID    string    `json:"order_id,omitempty"`
	Quantity   int64     `json:"quantity"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// EncodeResult is the wire form used on the results channel.
func EncodeResult(r Result) ([]byte, error) { return json.Marshal(r) }

// DecodeResult parses EncodeResult's output.
func DecodeResult(b []byte) (Result, error) {
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return Result{}, Invalid("result", err.Error())
	}
	if !r.Status.Valid() {
		return Result{}, Invalid("status", "unknown "+string(r.Status))
	}
	return r, nil
}
