package gateway

import (
	"bytes"
	"io"

	"github.com/gin-gonic/gin"

	"flashsale/internal/httpapi"
	"flashsale/model"
)

// The purchase endpoint is the one hot route: every shopper of a sale calls
// it, so its body and its answer skip encoding/json's reflection in the
// common case. Anything but the common case goes through the generic code,
// so the accepted inputs, the errors and the bytes written stay exactly those
// of httpapi.DecodeJSON and gin's JSON renderer (tested and fuzzed in
// body_test.go).

// purchaseBodyPrefix is how every client we know writes the body.
const purchaseBodyPrefix = `{"quantity":`

// maxFastDigits keeps the fast path clear of int64 overflow.
const maxFastDigits = 18

// decodePurchaseBody returns the quantity of a purchase body; an absent
// quantity is 1. Errors are httpapi.DecodeJSON's.
func decodePurchaseBody(c *gin.Context) (int64, error) {
	// Bodies are tiny; a read that fills buf falls back to the decoder with
	// what was read put back in front of the rest.
	var buf [64]byte
	n, err := io.ReadFull(c.Request.Body, buf[:])
	var rest io.Reader
	switch err {
	case io.EOF, io.ErrUnexpectedEOF: // the whole body is in buf[:n]
		if q, ok := fastQuantity(buf[:n]); ok {
			return q, nil
		}
		rest = bytes.NewReader(bytes.Clone(buf[:n]))
	default: // full buffer, or a read error (MaxBytesReader repeats it)
		rest = io.MultiReader(bytes.NewReader(bytes.Clone(buf[:n])), c.Request.Body)
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

// fastQuantity parses exactly {"quantity":<digits>} (no leading zero, no
// whitespace, at most maxFastDigits digits) and {}; ok is false for anything
// else, which the generic decoder then judges.
func fastQuantity(b []byte) (q int64, ok bool) {
	if string(b) == "{}" {
		return 1, true
	}
	if len(b) < len(purchaseBodyPrefix)+2 || string(b[:len(purchaseBodyPrefix)]) != purchaseBodyPrefix || b[len(b)-1] != '}' {
		return 0, false
	}
	digits := b[len(purchaseBodyPrefix) : len(b)-1]
	if len(digits) > maxFastDigits || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	for _, d := range digits {
		if d < '0' || d > '9' {
			return 0, false
		}
		q = q*10 + int64(d-'0')
	}
	return q, true
}

// writePurchaseAnswer writes the answer to an admitted purchase: the bytes
// c.JSON(status, purchaseResponse{…}) would write, built without reflection
// when the request id needs no JSON escaping (ours never do; a value from
// elsewhere takes the generic path).
func writePurchaseAnswer(c *gin.Context, status int, resp purchaseResponse) {
	if !model.JSONSafe(resp.RequestID) || !model.JSONSafe(string(resp.Status)) ||
		resp.PollURL != pollPath+resp.RequestID || resp.WSURL != wsPath {
		c.JSON(status, resp)
		return
	}
	b := make([]byte, 0, 96+2*len(resp.RequestID))
	b = append(b, `{"request_id":"`...)
	b = append(b, resp.RequestID...)
	b = append(b, `","status":"`...)
	b = append(b, resp.Status...)
	b = append(b, `","poll_url":"`+pollPath...)
	b = append(b, resp.RequestID...)
	b = append(b, `","ws_url":"`+wsPath+`"}`...)
	httpapi.WriteJSON(c, status, b)
}

// Paths the purchase answer points to (served by the notifier).
const (
	pollPath = "/api/v1/purchases/"
	wsPath   = "/api/v1/ws"
)
