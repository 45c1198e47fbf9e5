package model

import (
	"encoding/json"
	"slices"
	"time"
)

// Result is the outcome of a purchase request as shoppers see it.
//
// Its wire form on the results channel is the JSON of this struct
// (encoding/json's, byte for byte); EncodeResult and DecodeResult write and
// read the common case by hand and defer everything else to encoding/json.
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

// EncodeResult is the wire form used on the results channel: exactly what
// json.Marshal writes.
func EncodeResult(r Result) ([]byte, error) { return AppendResult(nil, r) }

// AppendResult appends EncodeResult's bytes for r to dst, so that many
// results can share one buffer (a results message carries a batch's).
func AppendResult(dst []byte, r Result) ([]byte, error) {
	if !JSONSafe(r.RequestID) || !JSONSafe(r.CampaignID) || !JSONSafe(r.UserID) ||
		!JSONSafe(string(r.Status)) || !JSONSafe(r.Reason) || !JSONSafe(r.OrderID) {
		return appendMarshal(dst, r)
	}
	start := len(dst)
	b := slices.Grow(dst, 128+len(r.RequestID)+len(r.CampaignID)+len(r.UserID)+len(r.Reason)+len(r.OrderID))
	b = append(b, `{"request_id":`...)
	b = appendStr(b, r.RequestID)
	b = append(b, `,"campaign_id":`...)
	b = appendStr(b, r.CampaignID)
	b = append(b, `,"user_id":`...)
	b = appendStr(b, r.UserID)
	b = append(b, `,"status":`...)
	b = appendStr(b, string(r.Status))
	if r.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendStr(b, r.Reason)
	}
	if r.OrderID != "" {
		b = append(b, `,"order_id":`...)
		b = appendStr(b, r.OrderID)
	}
	b = append(b, `,"quantity":`...)
	b = appendInt(b, r.Quantity)
	if !r.FinishedAt.IsZero() {
		b = append(b, `,"finished_at":`...)
		withTime, err := appendTime(b, r.FinishedAt)
		if err != nil {
			return appendMarshal(b[:start], r) // a year outside 0-9999: json's own error
		}
		b = withTime
	}
	return append(b, '}'), nil
}

// appendMarshal appends json.Marshal's encoding of r to dst.
func appendMarshal(dst []byte, r Result) ([]byte, error) {
	j, err := json.Marshal(r)
	if err != nil {
		return dst, err
	}
	return append(dst, j...), nil
}

// DecodeResult parses EncodeResult's output.
func DecodeResult(b []byte) (Result, error) {
	r, ok := decodeResultLite(b)
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

// decodeResultJSON is the encoding/json path: the fallback, and the
// reference the equivalence tests hold decodeResultLite to.
func decodeResultJSON(b []byte) (Result, error) {
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return Result{}, Invalid("result", err.Error())
	}
	return r, nil
}

// decodeResultLite reads what EncodeResult writes; ok is false when
// encoding/json must decide.
func decodeResultLite(b []byte) (r Result, ok bool) {
	d := NewLiteDecoder(b)
	ok = d.Members(func(key string) (uint16, bool) {
		var ok bool
		switch key {
		case "request_id":
			r.RequestID, ok = d.Str()
			return 1 << 0, ok
		case "campaign_id":
			r.CampaignID, ok = d.Str()
			return 1 << 1, ok
		case "user_id":
			r.UserID, ok = d.Str()
			return 1 << 2, ok
		case "status":
			var s string
			s, ok = d.Str()
			r.Status = Status(s)
			return 1 << 3, ok
		case "reason":
			r.Reason, ok = d.Str()
			return 1 << 4, ok
		case "order_id":
			r.OrderID, ok = d.Str()
			return 1 << 5, ok
		case "quantity":
			r.Quantity, ok = d.Int()
			return 1 << 6, ok
		case "finished_at":
			r.FinishedAt, ok = d.Time()
			return 1 << 7, ok
		}
		return 0, false
	})
	return r, ok
}
