// Package httpapi is the HTTP plumbing the gateway and notifier share: the one
// mapping from errors to status codes and stable error codes, authentication
// middleware and request metrics.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/wire"
	"github.com/flashsale/flashsale/model"
)

// nosniff is the one value of every answer's X-Content-Type-Options,
// shared: net/http only reads a header's values.
var nosniff = []string{"nosniff"}

// NoSniff tells browsers to take every answer as its Content-Type says, so
// a JSON answer echoing user input is never run as a script or a page.
func NoSniff(c *gin.Context) {
	c.Writer.Header()["X-Content-Type-Options"] = nosniff
}

// ErrorBody is every error response's JSON.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// sentinel is one entry of the error mapping.
type sentinel struct {
	err    error
	status int
	code   string
	// body is ErrorBody{code, err.Error()} rendered once: the body of every
	// error that matches, since only the sentinel's own message is shown.
	body []byte
}

// mapping is checked in order; the first sentinel that matches wins. It is
// built once and never changed.
var mapping = renderBodies([]sentinel{
	{err: model.ErrUnauthorized, status: http.StatusUnauthorized, code: "unauthorized"},
	{err: model.ErrForbidden, status: http.StatusForbidden, code: "forbidden"},
	{err: model.ErrChallengeFailed, status: http.StatusForbidden, code: "challenge_failed"},
	{err: model.ErrRiskRefused, status: http.StatusForbidden, code: "risk_refused"},
	{err: model.ErrNotFound, status: http.StatusNotFound, code: "not_found"},
	{err: model.ErrBodyTooLarge, status: http.StatusRequestEntityTooLarge, code: "body_too_large"},
	{err: model.ErrUnsupportedMediaType, status: http.StatusUnsupportedMediaType, code: "unsupported_media_type"},
	{err: model.ErrMethodNotAllowed, status: http.StatusMethodNotAllowed, code: "method_not_allowed"},
	{err: model.ErrSaleStarted, status: http.StatusConflict, code: "sale_started"},
	{err: model.ErrNotStarted, status: http.StatusConflict, code: "not_started"},
	{err: model.ErrEnded, status: http.StatusConflict, code: "ended"},
	{err: model.ErrNotLoaded, status: http.StatusConflict, code: "not_loaded"},
	{err: model.ErrPaused, status: http.StatusConflict, code: "paused"},
	{err: model.ErrLimitExceeded, status: http.StatusConflict, code: "limit_exceeded"},
	{err: model.ErrConflict, status: http.StatusConflict, code: "conflict"},
	{err: model.ErrNotPayable, status: http.StatusConflict, code: "order_not_payable"},
	{err: model.ErrNotCancellable, status: http.StatusConflict, code: "order_not_cancellable"},
	{err: model.ErrNotRefundable, status: http.StatusConflict, code: "order_not_refundable"},
	{err: model.ErrAmountMismatch, status: http.StatusConflict, code: "amount_mismatch"},
	{err: model.ErrPaymentConflict, status: http.StatusConflict, code: "payment_conflict"},
	{err: model.ErrBadSignature, status: http.StatusUnauthorized, code: "bad_signature"},
	{err: model.ErrStaleSignature, status: http.StatusUnauthorized, code: "stale_signature"},
	{err: model.ErrIdempotencyKeyReused, status: http.StatusUnprocessableEntity, code: "idempotency_key_reused"},
	{err: model.ErrSoldOut, status: http.StatusGone, code: "sold_out"},
	{err: model.ErrRateLimited, status: http.StatusTooManyRequests, code: "rate_limited"},
	{err: model.ErrTooManyStreams, status: http.StatusTooManyRequests, code: "too_many_subscriptions"},
	{err: model.ErrTooManyConns, status: http.StatusTooManyRequests, code: "too_many_connections"},
	{err: model.ErrUnavailable, status: http.StatusServiceUnavailable, code: "unavailable"},
})

// internalError is what every unknown error looks like to the client.
var internalError = renderBodies([]sentinel{{status: http.StatusInternalServerError, code: "internal"}})[0]

func renderBodies(ss []sentinel) []sentinel {
	for i := range ss {
		msg := "internal error"
		if ss[i].err != nil {
			msg = ss[i].err.Error()
		}
		b, err := json.Marshal(ErrorBody{Code: ss[i].code, Message: msg})
		if err != nil {
			panic(err) // two plain strings always marshal
		}
		ss[i].body = b
	}
	return ss
}

// Classify returns the HTTP status and body for err. Unknown errors are 500
// "internal" with a generic message: details stay in the log.
func Classify(err error) (int, ErrorBody) {
	s, inv := classify(err)
	if inv != nil {
		return http.StatusBadRequest, ErrorBody{Code: "invalid_request", Message: inv.Error(), Field: inv.Field}
	}
	if ae := (*model.AuthError)(nil); errors.As(err, &ae) {
		return s.status, ErrorBody{Code: s.code, Message: ae.Error()}
	}
	msg := "internal error"
	if s.err != nil {
		msg = s.err.Error()
	}
	return s.status, ErrorBody{Code: s.code, Message: msg}
}

// classify finds err's entry, or its *model.InvalidError (whose body names
// the field and so cannot be rendered in advance).
func classify(err error) (*sentinel, *model.InvalidError) {
	// Most refusals are a bare sentinel (sold out above all): a comparison
	// finds them without unwrapping. A sentinel wraps nothing, so this gives
	// what the errors.Is walk below would.
	for i := range mapping {
		if err == mapping[i].err {
			return &mapping[i], nil
		}
	}
	var inv *model.InvalidError
	if errors.As(err, &inv) {
		return nil, inv
	}
	for i := range mapping {
		if errors.Is(err, mapping[i].err) {
			return &mapping[i], nil
		}
	}
	return &internalError, nil
}

// jsonContentType is what gin's JSON renderer sends, shared by every
// response the way gin's renderers share theirs (header values are replaced,
// never changed in place).
var jsonContentType = []string{"application/json; charset=utf-8"}

// WriteJSON writes body, JSON encoded already, as c.JSON would write it:
// same status, Content-Type and bytes, without rendering or allocating.
func WriteJSON(c *gin.Context, status int, body []byte) {
	h := c.Writer.Header()
	if len(h["Content-Type"]) == 0 {
		h["Content-Type"] = jsonContentType
	}
	c.Status(status)
	_, _ = c.Writer.Write(body)
}

// Abort writes err as the response and stops the handler chain. Server errors
// are logged once here, with the request's route.
func Abort(c *gin.Context, log *slog.Logger, err error) {
	s, inv := classify(err)
	if inv != nil {
		c.AbortWithStatusJSON(http.StatusBadRequest, ErrorBody{Code: "invalid_request", Message: inv.Error(), Field: inv.Field})
		return
	}
	if ae := (*model.AuthError)(nil); s.status == http.StatusUnauthorized && errors.As(err, &ae) {
		// The reason is the shopper's to fix (or their identity
		// provider's), so it is said; other 401s stay the bare sentinel's.
		c.AbortWithStatusJSON(s.status, ErrorBody{Code: s.code, Message: ae.Error()})
		return
	}
	var rl *model.RateLimitError
	if s.status == http.StatusTooManyRequests && errors.As(err, &rl) && rl.RetryAfterSeconds > 0 {
		c.Header("Retry-After", strconv.Itoa(rl.RetryAfterSeconds))
	}
	switch {
	case s.status == http.StatusServiceUnavailable:
		// Expected while a dependency is out: the shopper is told when to
		// retry, and the outage is logged once where it is seen
		// (store.Guard, the publish breaker), not once per request.
		c.Header("Retry-After", "1")
		log.Debug("request refused: unavailable", "route", c.FullPath(), "err", err)
	case s.status >= 500:
		log.Error("request failed", "route", c.FullPath(), "status", s.status, "err", err)
	}
	// The same bytes gin's JSON renderer would write, without marshalling
	// them again for every refused request.
	WriteJSON(c, s.status, s.body)
	c.Abort()
}

// bearer extracts the token of an "Authorization: Bearer" header.
func bearer(c *gin.Context) string {
	h := c.GetHeader("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// ShopperHandler is a handler that needs an authenticated shopper.
type ShopperHandler func(c *gin.Context, userID string)

// Shopper returns what wraps a handler in shopper authentication: the JWT of
// the Authorization header (with allowQuery also ?access_token=, for
// WebSocket clients in browsers, which cannot set headers on the upgrade
// request) is verified and its user id handed to the handler; a missing or
// bad token is answered here. The id is passed, not stored with c.Set: gin
// allocates its key map on every request, a measurable share of a sold-out
// refusal.
func Shopper(log *slog.Logger, v *auth.JWT, allowQuery bool) func(ShopperHandler) gin.HandlerFunc {
	return func(h ShopperHandler) gin.HandlerFunc {
		return func(c *gin.Context) {
			if user, ok := shopper(c, log, v, allowQuery); ok {
				h(c, user)
			}
		}
	}
}

// shopper authenticates c's shopper; when it can't, it has answered c.
func shopper(c *gin.Context, log *slog.Logger, v *auth.JWT, allowQuery bool) (string, bool) {
	tok := bearer(c)
	if tok == "" && allowQuery {
		tok = c.Query("access_token")
	}
	if tok == "" {
		Abort(c, log, model.ErrUnauthorized)
		return "", false
	}
	user, err := v.Verify(tok)
	if err != nil {
		Abort(c, log, err)
		return "", false
	}
	return user, true
}

// CheckBody checks request bodies before any handler: a declared length
// above n is 413, a body that is not application/json 415 (every body of
// the API is JSON; a form or text body is refused before it is decoded
// leniently or not at all); a body of unknown length (chunked) is cut at n
// while it is read, which the decoders report as model.ErrBodyTooLarge.
func CheckBody(log *slog.Logger, n int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		r := c.Request
		if r.ContentLength > n {
			Abort(c, log, model.ErrBodyTooLarge)
			return
		}
		if r.ContentLength != 0 && !isJSON(r.Header["Content-Type"]) {
			Abort(c, log, model.ErrUnsupportedMediaType)
			return
		}
		// A declared length is enforced by net/http already (the body ends
		// there); only a body of unknown length (chunked) needs the cap.
		if r.ContentLength < 0 {
			r.Body = http.MaxBytesReader(c.Writer, r.Body, n)
		}
		c.Next()
	}
}

// isJSON reports whether a request's Content-Type values are one
// application/json, parameters (charset) allowed.
func isJSON(values []string) bool {
	if len(values) != 1 {
		return false
	}
	if values[0] == "application/json" { // what nearly every client sends
		return true
	}
	mt, _, err := mime.ParseMediaType(values[0])
	return err == nil && mt == "application/json"
}

// DecodeJSON decodes the request body into v strictly: unknown fields,
// repeated keys, keys in another case than the field's, trailing data,
// wrong types and oversized bodies are client errors.
func DecodeJSON(c *gin.Context, v any) error { return DecodeJSONFrom(c.Request.Body, v) }

// DecodeJSONFrom is DecodeJSON on any reader of a request body (one already
// wrapped by CheckBody's http.MaxBytesReader, or what is left of it). The
// body is read to its end first, so that a body of unknown length meets the
// cap wherever its excess lies, trailing space included.
func DecodeJSONFrom(r io.Reader, v any) error {
	b, err := io.ReadAll(r)
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		return model.ErrBodyTooLarge
	} else if err != nil {
		return model.Invalid("", "unreadable body")
	}
	return decodeStrict(b, v)
}

// decodeStrict is DecodeJSON on a body read whole.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			return model.Invalid(typeErr.Field, "wrong type, want "+typeErr.Type.String())
		case errors.Is(err, io.EOF):
			return model.Invalid("", "empty body")
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return model.Invalid(strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`), "unknown field")
		}
		return model.Invalid("", "malformed JSON")
	}
	if len(bytes.TrimLeft(b[dec.InputOffset():], " \t\r\n")) > 0 {
		return model.Invalid("", "trailing data after JSON body")
	}
	if err := wire.CheckKeys(b, reflect.TypeOf(v)); err != nil {
		var ke *wire.KeyError
		if errors.As(err, &ke) {
			return model.Invalid(ke.Key, ke.Reason())
		}
		return model.Invalid("", "malformed JSON") // unreachable: b decoded
	}
	return nil
}
