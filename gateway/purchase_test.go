package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/model"
)

// bodyLimit is small so that the oversized cases stay readable.
const bodyLimit = 100

func bodyContext(body string) *gin.Context {
	gin.SetMode(gin.TestMode)
	c, _ := gin.CreateTestContext(httptest.NewRecorder())
	c.Request = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	c.Request.Body = http.MaxBytesReader(nil, c.Request.Body, bodyLimit)
	return c
}

// referenceQuantity is what the handler did before decodePurchaseBody: the
// generic strict decoder into purchaseRequest.
func referenceQuantity(body string) (int64, error) {
	var req purchaseRequest
	if err := httpapi.DecodeJSON(bodyContext(body), &req); err != nil {
		return 0, err
	}
	if req.Quantity == nil {
		return 1, nil
	}
	return *req.Quantity, nil
}

// sameOutcome fails unless decodePurchaseBody and the reference agree on the
// quantity, or on the error's HTTP answer and field.
func sameOutcome(t *testing.T, body string) {
	t.Helper()
	got, gotErr := decodePurchaseBody(bodyContext(body))
	want, wantErr := referenceQuantity(body)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("body %q: got %d, %v; want %d, %v", body, got, gotErr, want, wantErr)
	}
	if gotErr == nil {
		if got != want {
			t.Fatalf("body %q: got quantity %d, want %d", body, got, want)
		}
		return
	}
	gs, gb := httpapi.Classify(gotErr)
	ws, wb := httpapi.Classify(wantErr)
	if gs != ws || gb != wb {
		t.Fatalf("body %q: got %d %+v, want %d %+v", body, gs, gb, ws, wb)
	}
}

func TestDecodePurchaseBodyMatchesDecodeJSON(t *testing.T) {
	tests := []struct{ name, body string }{
		{"common", `{"quantity":1}`},
		{"two", `{"quantity":2}`},
		{"empty object", `{}`},
		{"eighteen digits", `{"quantity":123456789012345678}`},
		{"nineteen digits", `{"quantity":1234567890123456789}`},
		{"int64 overflow", `{"quantity":9223372036854775808}`},
		{"zero", `{"quantity":0}`},
		{"leading zero", `{"quantity":01}`},
		{"negative", `{"quantity":-3}`},
		{"fraction", `{"quantity":1.5}`},
		{"exponent", `{"quantity":1e2}`},
		{"string", `{"quantity":"1"}`},
		{"null", `{"quantity":null}`},
		{"spaces", ` { "quantity" : 1 } `},
		{"trailing newline", "{\"quantity\":1}\n"},
		{"other case key", `{"Quantity":1}`},
		{"unknown field", `{"quantity":1,"price":0}`},
		{"repeated key", `{"quantity":1,"quantity":2}`},
		{"trailing data", `{"quantity":1}{"quantity":1}`},
		{"truncated", `{"quantity":`},
		{"no digits", `{"quantity":}`},
		{"empty", ``},
		{"array", `[1]`},
		{"just under the buffer", `{"quantity":1,"x":"` + strings.Repeat("a", 40) + `"}`},
		{"over the buffer", `{"quantity":1` + strings.Repeat(" ", 60) + `}`},
		{"over the limit", `{"quantity":1,"x":"` + strings.Repeat("a", 200) + `"}`},
		{"limit in trailing space", `{"quantity":1}` + strings.Repeat(" ", 200)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { sameOutcome(t, tc.body) })
	}
}

func FuzzDecodePurchaseBody(f *testing.F) {
	for _, s := range []string{`{"quantity":1}`, `{}`, `{"quantity":01}`, `{"quantity":1e400}`, `{"quantity":-1}`, "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) { sameOutcome(t, body) })
}

func TestDecodePurchaseBodyTooLarge(t *testing.T) {
	_, err := decodePurchaseBody(bodyContext(`{"quantity":1,"x":"` + strings.Repeat("a", 200) + `"}`))
	if !errors.Is(err, model.ErrBodyTooLarge) {
		t.Fatalf("got %v, want %v", err, model.ErrBodyTooLarge)
	}
}

// TestWritePurchaseAnswerMatchesGin: the hand-built answer is byte for byte
// gin's c.JSON, headers and status included, and ids that would need
// escaping take gin's renderer. A replay (200) and a new request decided at
// once (202, in MySQL while Redis is out) carry their result.
func TestWritePurchaseAnswerMatchesGin(t *testing.T) {
	ids := []string{
		model.FormatRequestID("spring-sale_1", "0193aa55bb66cc77dd88ee99ff001122"),
		"a.b",
		`odd"id`,
		"<script>",
		"tab\tid",
		"ünï",
	}
	answers := []struct {
		status   int
		existing bool
		result   model.Result // its RequestID is set below
	}{
		{http.StatusAccepted, false, model.Result{}},
		// A replay answers the request as it stands.
		{http.StatusOK, true, model.Result{Status: model.StatusSuccess, OrderID: "0193aa55-bb66-7c77-8d88-ee99ff001122", Quantity: 1}},
		{http.StatusOK, true, model.Result{Status: model.StatusQueued, Quantity: 1}},
		{http.StatusAccepted, false, model.Result{Status: model.StatusSuccess, OrderID: "0193aa55-bb66-7c77-8d88-ee99ff001122", Quantity: 1}},
		{http.StatusAccepted, false, model.Result{Status: model.StatusRejected, Reason: model.ReasonEndedEarly, Quantity: 1}},
	}
	for _, a := range answers {
		status := a.status
		for _, id := range ids {
			resp := purchaseResponse{RequestID: id, Status: model.StatusQueued, PollURL: "/api/v1/purchases/" + id, WSURL: "/api/v1/ws"}
			adm := Admitted{RequestID: id, Existing: a.existing}
			if a.result.Status != "" {
				resp.Status, resp.OrderID, resp.Reason = a.result.Status, a.result.OrderID, a.result.Reason
				adm.Result = a.result
				adm.Result.RequestID = id
			}
			gin.SetMode(gin.TestMode)
			got := httptest.NewRecorder()
			c, _ := gin.CreateTestContext(got)
			writePurchaseAnswer(c, adm)
			want := httptest.NewRecorder()
			wc, _ := gin.CreateTestContext(want)
			wc.JSON(status, resp)
			if got.Code != want.Code || !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) ||
				got.Header().Get("Content-Type") != want.Header().Get("Content-Type") {
				t.Fatalf("id %q: got %d %q %q, want %d %q %q", id, got.Code, got.Header().Get("Content-Type"), got.Body,
					want.Code, want.Header().Get("Content-Type"), want.Body)
			}
		}
	}
}

func BenchmarkDecodePurchaseBody(b *testing.B) {
	for _, tc := range []struct {
		name string
		fn   func(*gin.Context) error
	}{
		{"fast", func(c *gin.Context) error { _, err := decodePurchaseBody(c); return err }},
		{"DecodeJSON", func(c *gin.Context) error { var r purchaseRequest; return httpapi.DecodeJSON(c, &r) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			gin.SetMode(gin.TestMode)
			c, _ := gin.CreateTestContext(httptest.NewRecorder())
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			body := strings.NewReader(`{"quantity":1}`)
			b.ReportAllocs()
			for b.Loop() {
				body.Reset(`{"quantity":1}`)
				req.Body = http.MaxBytesReader(nil, nopCloser{body}, 4096)
				c.Request = req
				if err := tc.fn(c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type nopCloser struct{ *strings.Reader }

func (nopCloser) Close() error { return nil }

// TestPurchaseSoldOutSkipsBody: once a cached, open campaign is sold out, a
// purchase without an Idempotency-Key is refused before its body is read;
// one with a key reads on, since its earlier request may have succeeded.
func TestPurchaseSoldOutSkipsBody(t *testing.T) {
	// A cache that outlives the test, however slow the machine.
	svc, st, c := newAdmitService(t, newGatePublisher(false), Options{CampaignCacheTTL: time.Hour})
	all := make([]model.Deduction, c.Stock)
	for i := range all {
		all[i] = model.Deduction{RequestID: model.FormatRequestID(c.ID, fmt.Sprintf("%032x", i)),
			UserID: fmt.Sprintf("u%d", i), Quantity: 1, OrderID: fmt.Sprintf("o%d", i)}
	}
	if r, err := st.Deduct(t.Context(), c.ID, all); err != nil || !r.SoldOutNow {
		t.Fatalf("sell out: got %+v, %v; want the stock sold out", r.SoldOutNow, err)
	}
	reads := 0
	read := func() (int64, string, error) { reads++; return 1, "", nil }
	tests := []struct {
		name      string
		key       string
		wantReads int // in total, after this purchase
	}{
		{name: "first purchase loads the campaign", wantReads: 1},
		{name: "cached and sold out", wantReads: 1},
		{name: "with an Idempotency-Key", key: "k1", wantReads: 2},
		{name: "cached and sold out again", wantReads: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := svc.Purchase(t.Context(), Purchase{UserID: "late", CampaignID: c.ID, IdempotencyKey: tt.key}, read)
			if !errors.Is(err, model.ErrSoldOut) {
				t.Fatalf("got %v, want %v", err, model.ErrSoldOut)
			}
			if reads != tt.wantReads {
				t.Errorf("bodies read: got %d, want %d", reads, tt.wantReads)
			}
		})
	}
}

// TestPurchaseReplay: an Idempotency-Key sent again answers its first
// request as it stands now (queued, then its final result), on every path
// that answers replays: admit.lua while the sale is open, and the paths
// that refuse without it (sold out, queue down, sale over). The same key
// with another body is refused there too, and nothing changes.
func TestPurchaseReplay(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	pub := newGatePublisher(false)
	// A cache and an open breaker that outlive the test, however slow the
	// machine: each phase must take the path it names.
	svc, st, c := newAdmitService(t, pub, Options{CampaignCacheTTL: time.Hour, BreakerOpenFor: time.Hour,
		Now: func() time.Time { return time.Unix(0, now.Load()) }})
	buy := func(user, key string, qty int64) (Admitted, error) {
		return svc.Purchase(t.Context(), Purchase{UserID: user, CampaignID: c.ID, Quantity: qty, IdempotencyKey: key}, nil)
	}
	first, err := buy("u1", "k1", 2)
	if err != nil || first.Existing {
		t.Fatalf("first purchase: got %+v, %v; want a new request", first, err)
	}
	decided := func() {
		d := model.Deduction{RequestID: first.RequestID, UserID: "u1", Quantity: 2, OrderID: "o1"}
		r, err := st.Deduct(t.Context(), c.ID, []model.Deduction{d})
		if err != nil || r.Results[0].Status != model.StatusSuccess {
			t.Fatalf("deduct: got %+v, %v; want success", r, err)
		}
		// As the worker does once the order is stored.
		if err := st.MarkDurable(t.Context(), c.ID, r.Made, r.Epoch); err != nil {
			t.Fatalf("mark durable: %v", err)
		}
	}
	queued := model.Result{RequestID: first.RequestID, CampaignID: c.ID, UserID: "u1", Status: model.StatusQueued, Quantity: 2, Seq: 1} // the campaign's first admission
	success := queued
	success.Status, success.OrderID, success.Seq = model.StatusSuccess, "o1", 0
	phases := []struct {
		name    string
		enter   func()
		want    model.Result
		wantNew error // what a new key gets in this phase; nil: admitted
	}{
		{name: "open, queued", want: queued},
		{name: "open, decided", enter: decided, want: success},
		{
			name:  "sold out",
			enter: func() { svc.applyEvent(model.Event{Type: model.EventSoldOut, CampaignID: c.ID}) },
			want:  success, wantNew: model.ErrSoldOut,
		},
		{
			name: "queue down",
			enter: func() {
				svc.applyEvent(model.Event{Type: model.EventReturned, CampaignID: c.ID})
				pub.mu.Lock()
				pub.fail = true
				pub.mu.Unlock()
				for i := range svc.opts.BreakerFailures {
					if _, err := buy(fmt.Sprintf("other%d", i), "", 1); !errors.Is(err, model.ErrUnavailable) {
						t.Fatalf("failing publish %d: got %v, want %v", i, err, model.ErrUnavailable)
					}
				}
			},
			want: success, wantNew: model.ErrUnavailable,
		},
		{
			name:  "sale over",
			enter: func() { now.Store(c.EndAt.Add(time.Second).UnixNano()) },
			want:  success, wantNew: model.ErrEnded,
		},
	}
	for i, ph := range phases {
		t.Run(ph.name, func(t *testing.T) {
			if ph.enter != nil {
				ph.enter()
			}
			before, err := st.Stats(t.Context(), c.ID)
			if err != nil {
				t.Fatal(err)
			}
			adm, err := buy("u1", "k1", 2)
			if err != nil || !adm.Existing || adm.RequestID != first.RequestID || adm.Result != ph.want {
				t.Errorf("replay: got %+v, %v; want request %s as %+v", adm, err, first.RequestID, ph.want)
			}
			if adm, err := buy("u1", "k1", 1); !errors.Is(err, model.ErrIdempotencyKeyReused) {
				t.Errorf("replay with another quantity: got %+v, %v; want %v", adm, err, model.ErrIdempotencyKeyReused)
			}
			if ph.wantNew != nil {
				if adm, err := buy("u1", fmt.Sprintf("new-%d", i), 1); !errors.Is(err, ph.wantNew) {
					t.Errorf("new key: got %+v, %v; want %v", adm, err, ph.wantNew)
				}
			}
			after, err := st.Stats(t.Context(), c.ID)
			if err != nil || after.Admitted != before.Admitted || after.Queued() != before.Queued() || after.Sold != before.Sold {
				t.Errorf("stats: got %+v (%v), want %+v", after, err, before)
			}
		})
	}
}
