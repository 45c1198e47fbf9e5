package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

	"github.com/flashsale/flashsale/internal/openapi"
	"github.com/flashsale/flashsale/internal/testenv"
)

// apiChecker validates every exchange of a test client against the
// OpenAPI document: the response's status, headers and body always, and
// the request too when the server accepted it (2xx), since what the server
// takes the document must allow. It records which operations answered
// with which statuses.
type apiChecker struct {
	t     *testing.T
	base  http.RoundTripper
	v     validator.Validator
	model *v3.Document
	ops   []documentedOp

	mu   sync.Mutex
	seen map[string][]int // route -> statuses answered
}

func newAPIChecker(t *testing.T, base http.RoundTripper) *apiChecker {
	t.Helper()
	doc, err := libopenapi.NewDocument(openapi.Document())
	if err != nil {
		t.Fatalf("parse the document: %v", err)
	}
	m, err := doc.BuildV3Model()
	if err != nil {
		t.Fatalf("build the document's model: %v", err)
	}
	return &apiChecker{t: t, base: base, v: validator.NewValidatorFromV3Model(&m.Model), model: &m.Model,
		ops: documentedOps(t), seen: map[string][]int{}}
}

// RoundTrip sends req and checks the exchange; the caller gets the response
// as the server sent it.
func (a *apiChecker) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.Body != nil {
		var err error
		if reqBody, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		_ = req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(reqBody))
	}
	resp, err := a.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	respBody, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	a.check(req, reqBody, resp, respBody)
	return resp, nil
}

// check validates one exchange; the bodies are given apart because the
// validator reads them.
func (a *apiChecker) check(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) {
	a.t.Helper()
	name := fmt.Sprintf("%s %s → %d", req.Method, req.URL.RequestURI(), resp.StatusCode)
	route, ok := a.route(req.Method, req.URL.Path)
	if !ok {
		a.t.Errorf("%s: no operation of the OpenAPI document matches", name)
		return
	}
	a.mu.Lock()
	a.seen[route] = append(a.seen[route], resp.StatusCode)
	a.mu.Unlock()

	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(reqBody))
	w := *resp
	w.Body = io.NopCloser(bytes.NewReader(respBody))
	if ok, errs := a.v.ValidateHttpResponse(r, &w); !ok {
		a.report(name+": response "+string(respBody), errs)
	}
	if resp.StatusCode/100 == 2 || resp.StatusCode == http.StatusSwitchingProtocols {
		r.Body = io.NopCloser(bytes.NewReader(reqBody))
		if ok, errs := a.v.ValidateHttpRequestSync(r); !ok {
			a.report(name+": request "+string(reqBody), errs)
		}
	}
}

func (a *apiChecker) report(what string, errs []*errors.ValidationError) {
	a.t.Helper()
	for _, e := range errs {
		a.t.Errorf("%s: %s (%s)", what, e.Message, e.Reason)
		for _, s := range e.SchemaValidationErrors {
			a.t.Errorf("    %s at %s", s.Reason, s.FieldPath)
		}
	}
}

// route returns the documented route (gin's form) that method and path
// name.
func (a *apiChecker) route(method, path string) (string, bool) {
	for _, op := range a.ops {
		if op.method == method && routeMatches(op.path, path) {
			return op.route(), true
		}
	}
	return "", false
}

// routeMatches reports whether path is one of route's (gin's form: a
// :param segment matches any segment but an empty one).
func routeMatches(route, path string) bool {
	want, got := strings.Split(route, "/"), strings.Split(path, "/")
	if len(want) != len(got) {
		return false
	}
	for i := range want {
		if want[i] != got[i] && (!strings.HasPrefix(want[i], ":") || got[i] == "") {
			return false
		}
	}
	return true
}

// frame validates one WebSocket frame against the document's schema name.
func (a *apiChecker) frame(name string, data []byte) {
	a.t.Helper()
	proxy := a.model.Components.Schemas.GetOrZero(name)
	if proxy == nil {
		a.t.Errorf("the document has no schema %s", name)
		return
	}
	if ok, errs := schema_validation.NewSchemaValidator().ValidateSchemaBytes(proxy.Schema(), data); !ok {
		a.report(fmt.Sprintf("WebSocket frame %s", data), errs)
	}
}

// uncovered lists the documented operations that never answered with
// success.
func (a *apiChecker) uncovered() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, op := range a.ops {
		if op.devOnly {
			continue // TestDevTokenRoute
		}
		if !slices.ContainsFunc(a.seen[op.route()], func(s int) bool { return s/100 == 2 || s == http.StatusSwitchingProtocols }) {
			out = append(out, op.route())
		}
	}
	return out
}

// TestOpenAPIResponses runs the README's walk-through and more against a
// real server — every documented operation, successes and the refusals
// each can give — through a client whose every exchange is validated
// against the OpenAPI document (apiChecker), then fails for any operation
// that never answered with success.
func TestOpenAPIResponses(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	api := newAPIChecker(t, c.http.Transport)
	c.http.Transport = api
	adm := c.admin
	expect := func(what string, got, want int) {
		t.Helper()
		if got != want {
			t.Errorf("%s: got %d, want %d", what, got, want)
		}
	}

	// Operations.
	expect("healthz", c.do("GET", "/healthz", "", nil, nil, nil), 200)
	expect("readyz", c.do("GET", "/readyz", "", nil, nil, nil), 200)
	expect("metrics", c.do("GET", "/metrics", "", nil, nil, nil), 200)
	var served json.RawMessage
	expect("openapi.json", c.do("GET", openapi.Path, "", nil, nil, &served), 200)
	expect("shopper page", c.do("GET", "/", "", nil, nil, nil), 200)
	expect("browser client", c.do("GET", "/web/flashsale.js", "", nil, nil, nil), 200)
	expect("style sheet", c.do("GET", "/web/style.css", "", nil, nil, nil), 200)
	expect("unknown asset", c.do("GET", "/web/none.js", "", nil, nil, nil), 404)
	expect("admin console", c.do("GET", "/admin/", "", nil, nil, nil), 200)
	expect("admin console's script", c.do("GET", "/admin/console.js", "", nil, nil, nil), 200)
	expect("server time", c.do("GET", "/api/v1/time", "", nil, nil, nil), 200)
	expect("dev token, not in development mode", c.do("GET", "/api/v1/dev/token", "", nil, nil, nil), 404)
	if !bytes.Equal(served, bytes.TrimSpace(openapi.Document())) {
		t.Errorf("GET %s does not answer the embedded document", openapi.Path)
	}

	// Campaigns: a, running; b, upcoming; soldOut, one unit.
	a, b, soldOut := testenv.Name(t, "oa-"), testenv.Name(t, "oa-"), testenv.Name(t, "oa-")
	now := time.Now()
	running := campaignBody{ID: a, Name: "OpenAPI running", Stock: 5, PerUserLimit: 2, Price: 1999, PaymentWindow: "10m",
		StartAt: now.Add(-time.Second), EndAt: now.Add(time.Hour)}
	expect("create", c.do("POST", "/admin/v1/campaigns", adm, running, nil, nil), 201)
	expect("create upcoming", c.do("POST", "/admin/v1/campaigns", adm, campaignBody{ID: b, Name: "OpenAPI upcoming",
		Stock: 5, PerUserLimit: 1, StartAt: now.Add(time.Hour), EndAt: now.Add(2 * time.Hour)}, nil, nil), 201)
	expect("create again", c.do("POST", "/admin/v1/campaigns", adm, running, nil, nil), 409)
	expect("create invalid", c.do("POST", "/admin/v1/campaigns", adm, campaignBody{ID: "x", Name: "x", Stock: 0,
		PerUserLimit: 1, StartAt: now, EndAt: now.Add(time.Hour)}, nil, nil), 400)
	expect("create unknown field", c.do("POST", "/admin/v1/campaigns", adm, `{"idd":"x"}`, nil, nil), 400)
	expect("create as text", c.do("POST", "/admin/v1/campaigns", adm, `{}`, map[string]string{"Content-Type": "text/plain"}, nil), 415)
	expect("create too large", c.do("POST", "/admin/v1/campaigns", adm, strings.Repeat(" ", int(cfg.HTTP.MaxBodyBytes)+1), nil, nil), 413)
	expect("no admin token", c.do("GET", "/admin/v1/campaigns", "", nil, nil, nil), 401)
	expect("wrong admin token", c.do("GET", "/admin/v1/campaigns", "wrong", nil, nil, nil), 403)
	expect("list", c.do("GET", "/admin/v1/campaigns?limit=1", adm, nil, nil, nil), 200)
	expect("list running", c.do("GET", "/admin/v1/campaigns?state=running", adm, nil, nil, nil), 200)
	expect("list bad state", c.do("GET", "/admin/v1/campaigns?state=nope", adm, nil, nil, nil), 400)
	expect("get", c.do("GET", "/admin/v1/campaigns/"+a, adm, nil, nil, nil), 200)
	expect("get unknown", c.do("GET", "/admin/v1/campaigns/"+a+"-none", adm, nil, nil, nil), 404)
	expect("patch upcoming", c.do("PATCH", "/admin/v1/campaigns/"+b, adm, `{"name":"OpenAPI b","per_user_limit":2,"payment_window":"5m"}`, nil, nil), 200)
	expect("patch started", c.do("PATCH", "/admin/v1/campaigns/"+a, adm, `{"per_user_limit":3}`, nil, nil), 409)
	expect("preload", c.do("POST", "/admin/v1/campaigns/"+a+"/preload", adm, nil, nil, nil), 200)
	expect("preload forced", c.do("POST", "/admin/v1/campaigns/"+a+"/preload?force=true", adm, nil, nil, nil), 200)
	expect("preload bad force", c.do("POST", "/admin/v1/campaigns/"+a+"/preload?force=maybe", adm, nil, nil, nil), 400)
	expect("public list", c.do("GET", "/api/v1/campaigns", "", nil, nil, nil), 200)
	expect("public get", c.do("GET", "/api/v1/campaigns/"+a, "", nil, nil, nil), 200)
	expect("public get not preloaded", c.do("GET", "/api/v1/campaigns/"+b, "", nil, nil, nil), 200)
	expect("public get unknown", c.do("GET", "/api/v1/campaigns/"+a+"-none", "", nil, nil, nil), 404)

	// A purchase, its replays and refusals.
	alice := c.token("alice")
	key := map[string]string{"Idempotency-Key": "oa-1"}
	purchases := "/api/v1/campaigns/" + a + "/purchases"
	var p purchaseBody
	expect("purchase", c.do("POST", purchases, alice, `{"quantity":1}`, key, &p), 202)
	expect("replay", c.do("POST", purchases, alice, `{"quantity":1}`, key, nil), 200)
	expect("replay, another body", c.do("POST", purchases, alice, `{"quantity":2}`, key, nil), 422)
	expect("purchase without a token", c.do("POST", purchases, "", `{"quantity":1}`, nil, nil), 401)
	expect("purchase of 0", c.do("POST", purchases, alice, `{"quantity":0}`, nil, nil), 400)
	expect("purchase, unknown campaign", c.do("POST", "/api/v1/campaigns/"+a+"-none/purchases", alice, `{}`, nil, nil), 404)
	expect("purchase before the start", c.do("POST", "/api/v1/campaigns/"+b+"/purchases", alice, `{}`, nil, nil), 409)
	expect("challenge", c.do("GET", "/api/v1/campaigns/"+a+"/challenge", alice, nil, nil, nil), 200)
	expect("challenge before the start", c.do("GET", "/api/v1/campaigns/"+b+"/challenge", alice, nil, nil, nil), 409)
	expect("challenge, unknown campaign", c.do("GET", "/api/v1/campaigns/"+a+"-none/challenge", alice, nil, nil, nil), 404)

	// Its result, polled and pushed.
	var r resultBody
	testenv.Eventually(t, 30*time.Second, "a final result", func() (bool, string) {
		var code int
		if code, r = c.poll("alice", p.RequestID); code != 200 {
			t.Fatalf("poll: got %d, want 200", code)
		}
		return r.Status != "" && r.Status != "queued", fmt.Sprintf("%+v", r)
	})
	if r.Status != "success" {
		t.Fatalf("purchase: got %s, want success", r.Status)
	}
	expect("poll unknown", c.do("GET", "/api/v1/purchases/"+a+".0123456789abcdef0123456789abcdef", alice, nil, nil, nil), 404)
	expect("poll someone else's", c.do("GET", "/api/v1/purchases/"+p.RequestID, c.token("bob"), nil, nil, nil), 404)
	checkWebSocket(t, c, api, "alice", p.RequestID)
	expect("ws without a handshake", c.do("GET", "/api/v1/ws", alice, nil, nil, nil), 400)
	expect("ws without a token", c.do("GET", "/api/v1/ws", "", nil, nil, nil), 401)

	// Orders: the worker's INSERT lands a moment after the result.
	order := "/api/v1/orders/" + r.OrderID
	testenv.Eventually(t, 30*time.Second, "order "+r.OrderID+" readable", func() (bool, string) {
		code := c.do("GET", order, alice, nil, nil, nil)
		return code == 200, fmt.Sprintf("got %d", code)
	})
	expect("my orders", c.do("GET", "/api/v1/orders?limit=10", alice, nil, nil, nil), 200)
	expect("my orders, bad limit", c.do("GET", "/api/v1/orders?limit=x", alice, nil, nil, nil), 400)
	expect("order unknown", c.do("GET", "/api/v1/orders/none", alice, nil, nil, nil), 404)
	expect("pay", c.do("POST", order+"/pay", alice, nil, nil, nil), 200)
	expect("pay again", c.do("POST", order+"/pay", alice, nil, nil, nil), 409)
	bobs := c.buy("bob", a)
	bob := c.token("bob")
	expect("cancel", c.do("POST", "/api/v1/orders/"+bobs.ID+"/cancel", bob, nil, nil, nil), 200)
	expect("cancel again", c.do("POST", "/api/v1/orders/"+bobs.ID+"/cancel", bob, nil, nil, nil), 200)
	expect("pay cancelled", c.do("POST", "/api/v1/orders/"+bobs.ID+"/pay", bob, nil, nil, nil), 409)

	// The provider's webhook: a late payment, and refusals.
	code, _ := c.webhook(testWebhookSecret, time.Now(), webhookBody("oa-pay-1", bobs.ID, "succeeded", bobs.Amount))
	expect("late payment", code, 200)
	code, _ = c.webhook("another-secret-0123456789abcdef0123456789", time.Now(), webhookBody("oa-pay-2", bobs.ID, "succeeded", bobs.Amount))
	expect("forged webhook", code, 401)
	code, _ = c.webhook(testWebhookSecret, time.Now(), webhookBody("oa-pay-3", "none", "succeeded", 1))
	expect("webhook, unknown order", code, 404)
	code, _ = c.webhook(testWebhookSecret, time.Now(), webhookBody("oa-pay-4", bobs.ID, "succeeded", bobs.Amount+1))
	expect("webhook, wrong amount", code, 409)
	code, _ = c.webhook(testWebhookSecret, time.Now(), `{"payment_id":"oa-pay-5"}`)
	expect("webhook, incomplete", code, 400)

	// The admin's side of orders and payments.
	expect("campaign orders", c.do("GET", "/admin/v1/campaigns/"+a+"/orders?status=paid", adm, nil, nil, nil), 200)
	expect("campaign orders, bad status", c.do("GET", "/admin/v1/campaigns/"+a+"/orders?status=nope", adm, nil, nil, nil), 400)
	expect("payments", c.do("GET", "/admin/v1/payments", adm, nil, nil, nil), 200)
	expect("late payments", c.do("GET", "/admin/v1/payments?status=refund_required", adm, nil, nil, nil), 200)
	expect("refund", c.do("POST", "/admin/v1/orders/"+r.OrderID+"/refund", adm, nil, nil, nil), 200)
	expect("refund cancelled", c.do("POST", "/admin/v1/orders/"+bobs.ID+"/refund", adm, nil, nil, nil), 409)
	expect("refund unknown", c.do("POST", "/admin/v1/orders/none/refund", adm, nil, nil, nil), 404)
	expect("stats", c.do("GET", "/admin/v1/campaigns/"+a+"/stats", adm, nil, nil, nil), 200)
	expect("stats unknown", c.do("GET", "/admin/v1/campaigns/"+a+"-none/stats", adm, nil, nil, nil), 404)
	expect("stats stream unknown", c.do("GET", "/admin/v1/campaigns/"+a+"-none/stream", adm, nil, nil, nil), 404)
	checkFirstEvent(t, api, c.base+"/admin/v1/campaigns/"+a+"/stream", adm)

	// Pause, end, delete.
	expect("pause", c.do("POST", "/admin/v1/campaigns/"+a+"/pause", adm, nil, nil, nil), 200)
	expect("purchase while paused", c.do("POST", purchases, c.token("carol"), `{}`, nil, nil), 409)
	expect("resume", c.do("POST", "/admin/v1/campaigns/"+a+"/resume", adm, nil, nil, nil), 200)
	expect("end", c.do("POST", "/admin/v1/campaigns/"+a+"/end", adm, nil, nil, nil), 200)
	expect("end before the start", c.do("POST", "/admin/v1/campaigns/"+b+"/end", adm, nil, nil, nil), 409)
	expect("purchase after the end", c.do("POST", purchases, c.token("carol"), `{}`, nil, nil), 409)
	expect("delete started", c.do("DELETE", "/admin/v1/campaigns/"+a, adm, nil, nil, nil), 409)
	expect("delete", c.do("DELETE", "/admin/v1/campaigns/"+b, adm, nil, nil, nil), 204)
	expect("get deleted", c.do("GET", "/admin/v1/campaigns/"+b, adm, nil, nil, nil), 404)

	// Sold out: once the worker has sold the one unit, the gateway refuses
	// from its flag.
	c.openCampaign(soldOut, 1, 1)
	c.buy("dave", soldOut)
	late := 0
	testenv.Eventually(t, time.Minute, "a 410 sold_out", func() (bool, string) {
		late++
		code := c.do("POST", "/api/v1/campaigns/"+soldOut+"/purchases", c.token(fmt.Sprintf("late-%d", late)), `{}`, nil, nil)
		return code == http.StatusGone, fmt.Sprintf("got %d", code)
	})

	// Wrong admin tokens until the client IP is throttled, the right one
	// included: last, since it lasts the minute.
	for range cfg.Auth.AdminFailuresPerMinute {
		c.do("GET", "/admin/v1/payments", "wrong", nil, nil, nil)
	}
	expect("throttled admin", c.do("GET", "/admin/v1/payments", adm, nil, nil, nil), 429)

	for _, route := range api.uncovered() {
		t.Errorf("%s: never answered with success here; exercise it", route)
	}
}

// checkWebSocket validates the upgrade's answer and each frame of a
// subscription to rid (already final) and to an unknown id.
func checkWebSocket(t *testing.T, c *client, api *apiChecker, user, rid string) {
	t.Helper()
	u, _ := url.Parse(c.base)
	u.Scheme, u.Path, u.RawQuery = "ws", "/api/v1/ws", "access_token="+url.QueryEscape(c.token(user))
	conn, resp, err := websocket.DefaultDialer.Dial(u.String(), nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	req, _ := http.NewRequest("GET", c.base+"/api/v1/ws?"+u.RawQuery, nil)
	api.check(req, nil, resp, nil)

	subscribe := []byte(`{"type":"subscribe","request_ids":["` + rid + `","` + rid + `0"]}`)
	api.frame("WSSubscribe", subscribe)
	if err := conn.WriteMessage(websocket.TextMessage, subscribe); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	schemas := map[string]string{"error": "WSError", "subscribed": "WSSubscribed", "progress": "WSProgress", "result": "WSResult"}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var types []string
	for !slices.Contains(types, "result") {
		_, data, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("read after %v: %v", types, err)
		}
		var f struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(data, &f)
		name, ok := schemas[f.Type]
		if !ok {
			t.Fatalf("frame of type %q: the document has no schema for it: %s", f.Type, data)
		}
		api.frame(name, data)
		types = append(types, f.Type)
	}
	if want := []string{"error", "subscribed", "result"}; !slices.Equal(types, want) {
		t.Errorf("frames: got %v, want %v", types, want)
	}
}

// checkFirstEvent validates a stats stream's answer as far as its first
// event: the checker's transport would wait for the stream's end.
func checkFirstEvent(t *testing.T, api *apiChecker, url, bearer string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := api.base.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	first, err := bufio.NewReader(resp.Body).ReadBytes('\n')
	if err != nil {
		t.Fatalf("GET %s: first event: %v", url, err)
	}
	api.check(req, nil, resp, first)
}
