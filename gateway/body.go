package gateway

import (
	"bytes"
	"io"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/wire"
	"github.com/flashsale/flashsale/model"
)

// The purchase endpoint is the one hot route: every shopper of a sale calls
// it, so its body and its answer skip encoding/json's reflection in the
// common case. Anything but the common case goes through the generic code,
// so the accepted inputs, the errors and the bytes written stay exactly those
// of httpapi.DecodeJSON and gin's JSON renderer (tested and fuzzed in
// body_test.go).

// decodePurchaseBody returns the quantity of a purchase body; an absent
// quantity is 1. Errors are httpapi.DecodeJSON's.
func decodePurchaseBody(c *gin.Context) (int64, error) {
	// Bodies are tiny; a read that fills buf falls back to the decoder with
	// what was read put back in front of the rest.
	buf := make([]byte, 64)
	n, err := io.ReadFull(c.Request.Body, buf)
	var rest io.Reader
	switch err {
	case io.EOF, io.ErrUnexpectedEOF: // the whole body is in buf[:n]
		if q, ok := fastQuantity(buf[:n]); ok {
			return q, nil
		}
		rest = bytes.NewReader(buf[:n])
	default: // full buffer, or a read error (MaxBytesReader repeats it)
		rest = io.MultiReader(bytes.NewReader(buf[:n]), c.Request.Body)
	}
	var req purchaseRequest
	if err := httpapi.DecodeJSONFrom(rest, &req); err != nil {
		return 0, err
	}
	if req.Quantity == nil {
		return 1, nil
	}
	return *req.Quantity, nil
}

// fastQuantity reads the body with wire.Decoder: {} or an object whose
// one member is an integer "quantity"; ok is false for anything else, which
// the strict decoder then judges.
func fastQuantity(b []byte) (q int64, ok bool) {
	q = 1
	d := wire.NewDecoder(b)
	ok = d.Members(func(key string) (uint16, bool) {
		if key != "quantity" {
			return 0, false
		}
		var ok bool
		q, ok = d.Int()
		return 1, ok
	})
	return q, ok
}

// writePurchaseAnswer writes the answer to an admitted purchase: the bytes
// c.JSON(status, purchaseResponse{…}) writes, built without reflection when
// the request id needs no JSON escaping (ours never do; a value from
// elsewhere takes gin's renderer).
func writePurchaseAnswer(c *gin.Context, status int, requestID string) {
	if !wire.JSONSafe(requestID) {
		c.JSON(status, purchaseResponse{RequestID: requestID, Status: model.StatusQueued,
			PollURL: pollPath + requestID, WSURL: wsPath})
		return
	}
	b := make([]byte, 0, 96+2*len(requestID))
	b = append(b, `{"request_id":"`...)
	b = append(b, requestID...)
	b = append(b, `","status":"`+model.StatusQueued+`","poll_url":"`+pollPath...)
	b = append(b, requestID...)
	b = append(b, `","ws_url":"`+wsPath+`"}`...)
	httpapi.WriteJSON(c, status, b)
}

// Paths the purchase answer points to (served by the notifier).
const (
	pollPath = "/api/v1/purchases/"
	wsPath   = "/api/v1/ws"
)
