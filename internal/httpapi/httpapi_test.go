package httpapi

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/model"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantCode   string
	}{
		{"invalid", model.Invalid("quantity", "bad"), 400, "invalid_request"},
		{"wrapped invalid", fmt.Errorf("op: %w", model.Invalid("id", "bad")), 400, "invalid_request"},
		{"unauthorized", model.ErrUnauthorized, 401, "unauthorized"},
		{"forbidden", model.ErrForbidden, 403, "forbidden"},
		{"challenge failed", fmt.Errorf("purchase: %w", model.ErrChallengeFailed), 403, "challenge_failed"},
		{"not found", fmt.Errorf("campaign x: %w", model.ErrNotFound), 404, "not_found"},
		{"too large", model.ErrBodyTooLarge, 413, "body_too_large"},
		{"not json", model.ErrUnsupportedMediaType, 415, "unsupported_media_type"},
		{"wrong method", fmt.Errorf("method: %w", model.ErrMethodNotAllowed), 405, "method_not_allowed"},
		{"sale started", model.ErrSaleStarted, 409, "sale_started"},
		{"not started", model.ErrNotStarted, 409, "not_started"},
		{"ended", model.ErrEnded, 409, "ended"},
		{"not loaded", model.ErrNotLoaded, 409, "not_loaded"},
		{"paused", model.ErrPaused, 409, "paused"},
		{"conflict", model.ErrConflict, 409, "conflict"},
		{"not payable", fmt.Errorf("pay order x: %w", model.ErrNotPayable), 409, "order_not_payable"},
		{"not cancellable", model.ErrNotCancellable, 409, "order_not_cancellable"},
		{"not refundable", model.ErrNotRefundable, 409, "order_not_refundable"},
		{"amount mismatch", model.ErrAmountMismatch, 409, "amount_mismatch"},
		{"payment conflict", model.ErrPaymentConflict, 409, "payment_conflict"},
		{"bad signature", model.ErrBadSignature, 401, "bad_signature"},
		{"stale signature", fmt.Errorf("webhook: %w", model.ErrStaleSignature), 401, "stale_signature"},
		{"idempotency key reused", fmt.Errorf("purchase: %w", model.ErrIdempotencyKeyReused), 422, "idempotency_key_reused"},
		{"sold out", model.ErrSoldOut, 410, "sold_out"},
		{"rate limited", &model.RateLimitError{RetryAfterSeconds: 2}, 429, "rate_limited"},
		{"unavailable", fmt.Errorf("publish: %w: boom", model.ErrUnavailable), 503, "unavailable"},
		{"unknown", errors.New("dial tcp 10.0.0.1:3306: secret detail"), 500, "internal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := Classify(tc.err)
			if status != tc.wantStatus || body.Code != tc.wantCode {
				t.Fatalf("got %d %q, want %d %q", status, body.Code, tc.wantStatus, tc.wantCode)
			}
			if status == 500 && strings.Contains(body.Message, "secret") {
				t.Fatalf("internal details leaked: %q", body.Message)
			}
		})
	}
}

func decode(body string) error {
	gin.SetMode(gin.TestMode)
	c, _ := gin.CreateTestContext(httptest.NewRecorder())
	c.Request = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	c.Request.Body = http.MaxBytesReader(nil, c.Request.Body, 64)
	var v struct {
		Quantity *int64 `json:"quantity"`
	}
	return DecodeJSON(c, &v)
}

func TestDecodeJSON(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr error
		field   string
	}{
		{name: "ok", body: `{"quantity":2}`},
		{name: "empty", body: ``, field: ""},
		{name: "syntax", body: `{"quantity":`, field: ""},
		{name: "type", body: `{"quantity":"2"}`, field: "quantity"},
		{name: "unknown field", body: `{"qty":2}`, field: "qty"},
		{name: "trailing", body: `{"quantity":2} 1`, field: ""},
		{name: "overflow", body: `{"quantity":99999999999999999999}`, field: "quantity"},
		{name: "too large", body: `{"quantity":1,"x":"` + strings.Repeat("a", 100) + `"}`, wantErr: model.ErrBodyTooLarge},
		{name: "too large in trailing space", body: `{"quantity":1}` + strings.Repeat(" ", 100), wantErr: model.ErrBodyTooLarge},
		{name: "too large before trailing data", body: `{"quantity":1}` + strings.Repeat(" ", 100) + "GARBAGE", wantErr: model.ErrBodyTooLarge},
		{name: "trailing space", body: "{\"quantity\":2} \t\r\n"},
		{name: "key in another case", body: `{"Quantity":2}`, field: "Quantity"},
		{name: "repeated key", body: `{"quantity":1,"quantity":2}`, field: "quantity"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := decode(tc.body)
			switch {
			case tc.name == "ok" || tc.name == "trailing space":
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
			default:
				var inv *model.InvalidError
				if !errors.As(err, &inv) || inv.Field != tc.field {
					t.Fatalf("got %v, want an InvalidError on %q", err, tc.field)
				}
			}
		})
	}
}

// FuzzDecodeJSON: the purchase body decoder never panics and only ever
// returns client errors.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"quantity":1}`, `{"quantity":-1}`, `{"quantity":1e400}`, `[]`, `{"quantity":null}`, "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		err := decode(body)
		if err == nil {
			return
		}
		status, _ := Classify(err)
		if status != 400 && status != 413 {
			t.Fatalf("body %q: got status %d (%v), want 400 or 413", body, status, err)
		}
	})
}

// TestAbortRendersAsGin: Abort's pre-rendered bodies are byte for byte what
// gin's JSON renderer writes for Classify's answer, with the same status and
// headers, for every sentinel, bare and wrapped.
func TestAbortRendersAsGin(t *testing.T) {
	gin.SetMode(gin.TestMode)
	errs := []error{
		model.Invalid("quantity", "bad"),
		fmt.Errorf("op: %w", model.Invalid("", "empty body")),
		&model.RateLimitError{RetryAfterSeconds: 3},
		fmt.Errorf("admit: %w", &model.RateLimitError{}),
		errors.New("dial tcp 10.0.0.1:3306: secret detail"),
		fmt.Errorf("two: %w", errors.Join(model.ErrSoldOut, model.ErrNotFound)),
	}
	for _, m := range mapping {
		errs = append(errs, m.err, fmt.Errorf("wrapped: %w", m.err))
	}
	for _, err := range errs {
		t.Run(err.Error(), func(t *testing.T) {
			got := httptest.NewRecorder()
			c, _ := gin.CreateTestContext(got)
			Abort(c, slog.New(slog.DiscardHandler), err)

			want := httptest.NewRecorder()
			wc, _ := gin.CreateTestContext(want)
			status, body := Classify(err)
			var rl *model.RateLimitError
			if errors.As(err, &rl) && rl.RetryAfterSeconds > 0 {
				wc.Header("Retry-After", strconv.Itoa(rl.RetryAfterSeconds))
			}
			if status == http.StatusServiceUnavailable { // a dependency is out: try again in a second
				wc.Header("Retry-After", "1")
			}
			wc.AbortWithStatusJSON(status, body)

			if got.Code != want.Code || got.Body.String() != want.Body.String() || !c.IsAborted() {
				t.Fatalf("got %d %s (aborted %v), want %d %s", got.Code, got.Body, c.IsAborted(), want.Code, want.Body)
			}
			for _, h := range []string{"Content-Type", "Retry-After"} {
				if g, w := got.Header().Get(h), want.Header().Get(h); g != w {
					t.Fatalf("%s: got %q, want %q", h, g, w)
				}
			}
		})
	}
}

// BenchmarkAbort: a sold-out refusal through a gin engine, with Abort and
// with gin's JSON renderer (what Abort did before).
func BenchmarkAbort(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name  string
		abort func(*gin.Context)
	}{
		{"prerendered", func(c *gin.Context) { Abort(c, log, model.ErrSoldOut) }},
		{"gin_json", func(c *gin.Context) {
			status, body := Classify(model.ErrSoldOut)
			c.AbortWithStatusJSON(status, body)
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := gin.New()
			e.POST("/api/v1/campaigns/:id/purchases", tc.abort)
			req := httptest.NewRequest(http.MethodPost, "/api/v1/campaigns/x/purchases", nil)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				w.Body.Reset()
				e.ServeHTTP(w, req)
			}
		})
	}
}

// TestCheckBody: a declared length above the cap is refused before the
// handler; a body of unknown length is cut at the cap while it is read; a
// declared length within the cap reaches the handler whole; a body that is
// not application/json is refused before the handler, a request without a
// body needs no type.
func TestCheckBody(t *testing.T) {
	gin.SetMode(gin.TestMode)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const limit = 32
	tests := []struct {
		name        string
		body        string
		chunked     bool
		contentType []string // nil = application/json
		wantStatus  int
		wantCode    string
	}{
		{name: "declared within", body: `{"quantity":1}`, wantStatus: http.StatusOK},
		{name: "declared exactly the cap", body: `{"quantity":1,"x":"` + strings.Repeat("a", limit-21) + `"}`, wantStatus: http.StatusOK},
		{name: "declared above", body: `{"quantity":1,"x":"` + strings.Repeat("a", limit) + `"}`, wantStatus: http.StatusRequestEntityTooLarge, wantCode: "body_too_large"},
		{name: "chunked within", body: `{"quantity":1}`, chunked: true, wantStatus: http.StatusOK},
		{name: "chunked above", body: `{"quantity":1,"x":"` + strings.Repeat("a", limit) + `"}`, chunked: true, wantStatus: http.StatusRequestEntityTooLarge, wantCode: "body_too_large"},
		{name: "chunked above in trailing space", body: `{"quantity":1}` + strings.Repeat(" ", limit), chunked: true, wantStatus: http.StatusRequestEntityTooLarge, wantCode: "body_too_large"},
		{name: "json with charset", body: `{"quantity":1}`, contentType: []string{"application/json; charset=utf-8"}, wantStatus: http.StatusOK},
		{name: "json in capitals", body: `{"quantity":1}`, contentType: []string{"Application/JSON"}, wantStatus: http.StatusOK},
		{name: "no content type", body: `{"quantity":1}`, contentType: []string{}, wantStatus: http.StatusUnsupportedMediaType, wantCode: "unsupported_media_type"},
		{name: "text/plain", body: `{"quantity":1}`, contentType: []string{"text/plain"}, wantStatus: http.StatusUnsupportedMediaType, wantCode: "unsupported_media_type"},
		{name: "form", body: `quantity=1`, contentType: []string{"application/x-www-form-urlencoded"}, wantStatus: http.StatusUnsupportedMediaType, wantCode: "unsupported_media_type"},
		{name: "json suffix", body: `{"quantity":1}`, contentType: []string{"application/problem+json"}, wantStatus: http.StatusUnsupportedMediaType, wantCode: "unsupported_media_type"},
		{name: "two content types", body: `{"quantity":1}`, contentType: []string{"application/json", "text/plain"}, wantStatus: http.StatusUnsupportedMediaType, wantCode: "unsupported_media_type"},
		{name: "malformed content type", body: `{"quantity":1}`, contentType: []string{"application/json; charset"}, wantStatus: http.StatusUnsupportedMediaType, wantCode: "unsupported_media_type"},
		{name: "chunked text/plain", body: `{"quantity":1}`, chunked: true, contentType: []string{"text/plain"}, wantStatus: http.StatusUnsupportedMediaType, wantCode: "unsupported_media_type"},
		{name: "no body, no type", body: "", contentType: []string{}, wantStatus: http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := gin.New()
			e.Use(CheckBody(log, limit))
			e.POST("/", func(c *gin.Context) {
				var v struct {
					Quantity *int64 `json:"quantity"`
					X        string `json:"x"`
				}
				if c.Request.ContentLength != 0 {
					if err := DecodeJSON(c, &v); err != nil {
						Abort(c, log, err)
						return
					}
				}
				c.Status(http.StatusOK)
			})
			req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
			req.Header["Content-Type"] = tc.contentType
			if tc.contentType == nil {
				req.Header.Set("Content-Type", "application/json")
			}
			if tc.chunked {
				req.ContentLength = -1
			}
			got := httptest.NewRecorder()
			e.ServeHTTP(got, req)
			if got.Code != tc.wantStatus {
				t.Fatalf("got status %d (%s), want %d", got.Code, got.Body, tc.wantStatus)
			}
			if tc.wantCode != "" && !strings.Contains(got.Body.String(), `"code":"`+tc.wantCode+`"`) {
				t.Fatalf("got body %s, want code %q", got.Body, tc.wantCode)
			}
		})
	}
}
