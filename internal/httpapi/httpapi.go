// Package httpapi is the HTTP plumbing the gateway and notifier share: the one
// mapping from errors to status codes and stable error codes, authentication
// middleware and request metrics.
package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"flashsale/internal/auth"
	"flashsale/model"
)

// ErrorBody is every error response's JSON.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// mapping is checked in order; the first sentinel that matches wins.
var mapping = []struct {
	err    error
	status int
	code   string
}{
	{model.ErrUnauthorized, http.StatusUnauthorized, "unauthorized"},
	{model.ErrForbidden, http.StatusForbidden, "forbidden"},
	{model.ErrNotFound, http.StatusNotFound, "not_found"},
	{model.ErrBodyTooLarge, http.StatusRequestEntityTooLarge, "body_too_large"},
	{model.ErrSaleStarted, http.StatusConflict, "sale_started"},
	{model.ErrNotStarted, http.StatusConflict, "not_started"},
	{model.ErrEnded, http.StatusConflict, "ended"},
	{model.ErrNotLoaded, http.StatusConflict, "not_loaded"},
	{model.ErrLimitExceeded, http.StatusConflict, "limit_exceeded"},
	{model.ErrConflict, http.StatusConflict, "conflict"},
	{model.ErrSoldOut, http.StatusGone, "sold_out"},
	{model.ErrRateLimited, http.StatusTooManyRequests, "rate_limited"},
	{model.ErrTooManyStreams, http.StatusTooManyRequests, "too_many_subscriptions"},
	{model.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
}

// Classify returns the HTTP status and body for err. Unknown errors are 500
// "internal" with a generic message: details stay in the log.
func Classify(err error) (int, ErrorBody) {
	var inv *model.InvalidError
	if errors.As(err, &inv) {
		return http.StatusBadRequest, ErrorBody{Code: "invalid_request", Message: inv.Error(), Field: inv.Field}
	}
	for _, m := range mapping {
		if errors.Is(err, m.err) {
			return m.status, ErrorBody{Code: m.code, Message: m.err.Error()}
		}
	}
	return http.StatusInternalServerError, ErrorBody{Code: "internal", Message: "internal error"}
}

// Abort writes err as the response and stops the handler chain. Server errors
// are logged once here, with the request's route.
func Abort(c *gin.Context, log *slog.Logger, err error) {
	status, body := Classify(err)
	var rl *model.RateLimitError
	if errors.As(err, &rl) && rl.RetryAfterSeconds > 0 {
		c.Header("Retry-After", strconv.Itoa(rl.RetryAfterSeconds))
	}
	if status >= 500 {
		log.Error("request failed", "route", c.FullPath(), "status", status, "err", err)
	}
	c.AbortWithStatusJSON(status, body)
}

// Context keys set by the middleware.
const (
	UserIDKey = "flashsale.user_id"
)

// bearer extracts the token of an "Authorization: Bearer" header.
func bearer(c *gin.Context) string {
	h := c.GetHeader("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// Shopper authenticates a shopper JWT and stores the user id in the context.
// allowQuery also accepts ?access_token=, for WebSocket clients in browsers,
// which cannot set headers on the upgrade request.
func Shopper(log *slog.Logger, v *auth.JWT, allowQuery bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		tok := bearer(c)
		if tok == "" && allowQuery {
			tok = c.Query("access_token")
		}
		if tok == "" {
			Abort(c, log, model.ErrUnauthorized)
			return
		}
		user, err := v.Verify(tok)
		if err != nil {
			Abort(c, log, err)
			return
		}
		c.Set(UserIDKey, user)
		c.Next()
	}
}

// Admin checks the admin bearer token in constant time and logs the action.
func Admin(log *slog.Logger, token string) gin.HandlerFunc {
	return func(c *gin.Context) {
		got := bearer(c)
		if got == "" {
			Abort(c, log, model.ErrUnauthorized)
			return
		}
		if !auth.AdminTokenEqual(got, token) {
			Abort(c, log, model.ErrForbidden)
			return
		}
		c.Next()
		log.Info("admin action", "method", c.Request.Method, "route", c.FullPath(), "campaign_id", c.Param("id"), "status", c.Writer.Status())
	}
}

// UserID returns the authenticated shopper of the request.
func UserID(c *gin.Context) string { return c.GetString(UserIDKey) }

// LimitBody caps request bodies; reading past the cap fails the decode, which
// the handlers report as model.ErrBodyTooLarge.
func LimitBody(log *slog.Logger, n int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.Request.ContentLength > n {
			Abort(c, log, model.ErrBodyTooLarge)
			return
		}
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, n)
		c.Next()
	}
}

// DecodeJSON decodes the request body into v strictly: unknown fields,
// trailing data, wrong types and oversized bodies are client errors.
func DecodeJSON(c *gin.Context, v any) error {
	dec := json.NewDecoder(c.Request.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &tooLarge):
			return model.ErrBodyTooLarge
		case errors.As(err, &typeErr):
			return model.Invalid(typeErr.Field, "wrong type, want "+typeErr.Type.String())
		case errors.Is(err, io.EOF):
			return model.Invalid("", "empty body")
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return model.Invalid(strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`), "unknown field")
		}
		return model.Invalid("", "malformed JSON")
	}
	if dec.More() {
		return model.Invalid("", "trailing data after JSON body")
	}
	return nil
}
