package model

import (
	"encoding/json"
	"time"

	"github.com/flashsale/flashsale/internal/wire"
)

// Result is the outcome of a purchase request as shoppers see it.
//
// Its wire form on the results channel is the JSON of this struct
// (encoding/json's, byte for byte); EncodeResult and DecodeResult leave the
// common case to internal/wire's hand-written codec and everything else to
// encoding/json.
type Result struct {
	RequestID  string    `json:"request_id"`
	CampaignID string    `json:"campaign_id"`
	UserID     string    `json:"user_id"`
	Status     Status    `json:"status"`
	Reason     string    `json:"reason,omitempty"`
	OrderID    string    `json:"order_id,omitempty"`
	Quantity   int64     `json:"quantity"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Seq is a queued request's place in its campaign's admission order
	// (1, 2, …; see QueueProgress), 0 when unknown or final. Never sent.
	Seq int64 `json:"-"`
}

// EncodeResult is the wire form used on the results channel: exactly what
// json.Marshal writes.
func EncodeResult(r Result) ([]byte, error) { return AppendResult(nil, r) }

// AppendResult appends EncodeResult's bytes for r to dst, so that many
// results can share one buffer (a results message carries a batch's). On an
// error dst is returned as it was.
func AppendResult(dst []byte, r Result) ([]byte, error) {
	w := wire.Result{RequestID: r.RequestID, CampaignID: r.CampaignID, UserID: r.UserID, Status: string(r.Status),
		Reason: r.Reason, OrderID: r.OrderID, Quantity: r.Quantity, FinishedAt: r.FinishedAt}
	if b, ok := wire.AppendResult(dst, w); ok {
		return b, nil
	}
	j, err := json.Marshal(r) // a string to escape, or a year json refuses
	if err != nil {
		return dst, err
	}
	return append(dst, j...), nil
}

// DecodeResult parses EncodeResult's output.
func DecodeResult(b []byte) (Result, error) {
	w, ok := wire.DecodeResult(b)
	r := Result{RequestID: w.RequestID, CampaignID: w.CampaignID, UserID: w.UserID, Status: Status(w.Status),
		Reason: w.Reason, OrderID: w.OrderID, Quantity: w.Quantity, FinishedAt: w.FinishedAt}
	if !ok {
		var err error
		if r, err = decodeResultJSON(b); err != nil {
			return Result{}, err
		}
	}
	if !r.Status.Valid() {
		return Result{}, Invalid("status", "unknown "+string(r.Status))
	}
	return r, nil
}

// decodeResultJSON is the encoding/json path: the fallback for anything wire
// does not read, and the tests' reference.
func decodeResultJSON(b []byte) (Result, error) {
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return Result{}, Invalid("result", err.Error())
	}
	return r, nil
}
