package wire

import (
	"slices"
	"time"
)

// PurchaseRequest has model.PurchaseRequest's fields, names, types and order,
// so that each converts to the other; its wire form is that type's JSON.
type PurchaseRequest struct {
	Version    int
	RequestID  string
	CampaignID string
	UserID     string
	Quantity   int64
	AdmittedAt time.Time
}

// EncodePurchaseRequest writes p as json.Marshal writes model.PurchaseRequest;
// ok is false when encoding/json must (a string it escapes, a year outside
// 0-9999).
func EncodePurchaseRequest(p PurchaseRequest) (b []byte, ok bool) {
	if !JSONSafe(p.RequestID) || !JSONSafe(p.CampaignID) || !JSONSafe(p.UserID) {
		return nil, false
	}
	b = make([]byte, 0, 160+len(p.RequestID)+len(p.CampaignID)+len(p.UserID))
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
	b = append(b, `,"admitted_at":`...)
	b, err := appendTime(b, p.AdmittedAt)
	if err != nil {
		return nil, false
	}
	return append(b, '}'), true
}

// DecodePurchaseRequest reads what EncodePurchaseRequest writes (keys in any
// order, any subset); ok is false when encoding/json must decide.
func DecodePurchaseRequest(b []byte) (p PurchaseRequest, ok bool) {
	d := NewDecoder(b)
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
		case "admitted_at":
			p.AdmittedAt, ok = d.Time()
			return 1 << 5, ok
		}
		return 0, false
	})
	return p, ok
}

// Result has model.Result's fields, with the status as a plain string; its
// wire form is model.Result's JSON.
type Result struct {
	RequestID  string
	CampaignID string
	UserID     string
	Status     string
	Reason     string // omitted when empty
	OrderID    string // omitted when empty
	Quantity   int64
	FinishedAt time.Time // omitted when zero
}

// AppendResult appends r to dst as json.Marshal writes model.Result; ok is
// false, and dst is returned as it was, when encoding/json must (a string it
// escapes, a year outside 0-9999).
func AppendResult(dst []byte, r Result) (b []byte, ok bool) {
	if !JSONSafe(r.RequestID) || !JSONSafe(r.CampaignID) || !JSONSafe(r.UserID) ||
		!JSONSafe(r.Status) || !JSONSafe(r.Reason) || !JSONSafe(r.OrderID) {
		return dst, false
	}
	b = slices.Grow(dst, 128+len(r.RequestID)+len(r.CampaignID)+len(r.UserID)+len(r.Reason)+len(r.OrderID))
	b = append(b, `{"request_id":`...)
	b = appendStr(b, r.RequestID)
	b = append(b, `,"campaign_id":`...)
	b = appendStr(b, r.CampaignID)
	b = append(b, `,"user_id":`...)
	b = appendStr(b, r.UserID)
	b = append(b, `,"status":`...)
	b = appendStr(b, r.Status)
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
		var err error
		if b, err = appendTime(b, r.FinishedAt); err != nil {
			return dst, false
		}
	}
	return append(b, '}'), true
}

// DecodeResult reads what AppendResult writes; ok is false when
// encoding/json must decide.
func DecodeResult(b []byte) (r Result, ok bool) {
	d := NewDecoder(b)
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
			r.Status, ok = d.Str()
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
