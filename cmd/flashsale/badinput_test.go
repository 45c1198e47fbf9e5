package main

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	jwtlib "github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/lifecycle"
	"github.com/flashsale/flashsale/internal/testenv"
)

// withField adds a field to a JSON object.
func withField(object, field string) string {
	return strings.Replace(object, "{", "{"+field+",", 1)
}

// TestBadInput: every malformed or unauthorised request gets its exact
// status and stable code, and changes nothing.
func TestBadInput(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	open := testenv.UniqueName("bad-")
	c.openCampaign(open, 10, 2)
	future := testenv.UniqueName("future-")
	body := campaignBody{ID: future, Name: "later", Stock: 5, PerUserLimit: 1,
		StartAt: time.Now().Add(time.Hour), EndAt: time.Now().Add(2 * time.Hour)}
	if code := c.do("POST", "/admin/v1/campaigns", testAdminToken, body, nil, nil); code != http.StatusCreated {
		t.Fatalf("create future campaign: got %d", code)
	}
	paused := testenv.UniqueName("paused-")
	c.openCampaign(paused, 10, 2)
	if code := c.do("POST", "/admin/v1/campaigns/"+paused+"/pause", testAdminToken, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("pause: got %d", code)
	}
	unloaded := testenv.UniqueName("unloaded-")
	body = campaignBody{ID: unloaded, Name: "no stock yet", Stock: 5, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
	if code := c.do("POST", "/admin/v1/campaigns", testAdminToken, body, nil, nil); code != http.StatusCreated {
		t.Fatalf("create unloaded campaign: got %d", code)
	}

	alice := c.token("alice")
	// The order lifecycle's subjects: alice's order pending payment, bob's
	// paid through a provider's webhook.
	priced := testenv.UniqueName("paid-")
	c.openCampaignOf(campaignBody{ID: priced, Name: "priced", Stock: 10, PerUserLimit: 2, Price: 250,
		StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)})
	pending, paid := c.buy("alice", priced), c.buy("bob", priced)
	paidReport := webhookBody("pay_bob_1", paid.ID, "succeeded", 250)
	if code, p := c.webhook(testWebhookSecret, time.Now(), paidReport); code != http.StatusOK || p.Status != "succeeded" {
		t.Fatalf("pay bob's order: got %d %+v, want 200 succeeded", code, p)
	}
	bob := c.token("bob")
	signed := func(secret string, at time.Time, body string) map[string]string {
		return map[string]string{gateway.SignatureHeader: lifecycle.SignWebhook(secret, at, []byte(body))}
	}
	pendingReport := webhookBody("pay_alice_1", pending.ID, "succeeded", 250)
	expired, _ := jwtlib.NewWithClaims(jwtlib.SigningMethodHS256, jwtlib.RegisteredClaims{Subject: "alice",
		ExpiresAt: jwtlib.NewNumericDate(time.Now().Add(-time.Hour))}).SignedString([]byte(testJWTSecret))
	forged, _ := jwtlib.NewWithClaims(jwtlib.SigningMethodHS256, jwtlib.RegisteredClaims{Subject: "alice",
		ExpiresAt: jwtlib.NewNumericDate(time.Now().Add(time.Hour))}).SignedString([]byte("another-secret-another-secret-xx"))
	none, _ := jwtlib.NewWithClaims(jwtlib.SigningMethodNone, jwtlib.RegisteredClaims{Subject: "alice",
		ExpiresAt: jwtlib.NewNumericDate(time.Now().Add(time.Hour))}).SignedString(jwtlib.UnsafeAllowNoneSignatureType)
	noExp, _ := jwtlib.NewWithClaims(jwtlib.SigningMethodHS256, jwtlib.RegisteredClaims{Subject: "alice"}).SignedString([]byte(testJWTSecret))

	buy := "/api/v1/campaigns/" + open + "/purchases"
	validCampaign := `{"id":"x1","name":"n","stock":5,"per_user_limit":1,"start_at":"2030-01-01T00:00:00Z","end_at":"2030-01-02T00:00:00Z"}`
	tests := []struct {
		name     string
		method   string
		path     string
		bearer   string
		body     any
		header   map[string]string
		wantCode int
		want     string
	}{
		{"purchase without token", "POST", buy, "", `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase expired token", "POST", buy, expired, `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase forged token", "POST", buy, forged, `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase alg none", "POST", buy, none, `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase token without exp", "POST", buy, noExp, `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase garbage token", "POST", buy, "not.a.jwt", `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase malformed json", "POST", buy, alice, `{"quantity":`, nil, 400, "invalid_request"},
		{"purchase empty body", "POST", buy, alice, nil, nil, 400, "invalid_request"},
		{"purchase wrong type", "POST", buy, alice, `{"quantity":"one"}`, nil, 400, "invalid_request"},
		{"purchase unknown field", "POST", buy, alice, `{"quantity":1,"price":0}`, nil, 400, "invalid_request"},
		{"purchase quantity zero", "POST", buy, alice, `{"quantity":0}`, nil, 400, "invalid_request"},
		{"purchase quantity negative", "POST", buy, alice, `{"quantity":-3}`, nil, 400, "invalid_request"},
		{"purchase quantity above limit", "POST", buy, alice, `{"quantity":3}`, nil, 400, "invalid_request"},
		{"purchase quantity 2^63", "POST", buy, alice, `{"quantity":9223372036854775808}`, nil, 400, "invalid_request"},
		{"purchase trailing data", "POST", buy, alice, `{"quantity":1}{"quantity":1}`, nil, 400, "invalid_request"},
		{"purchase oversized body", "POST", buy, alice, `{"quantity":1,"pad":"` + strings.Repeat("x", 8000) + `"}`, nil, 413, "body_too_large"},
		{"purchase bad idempotency key", "POST", buy, alice, `{"quantity":1}`, map[string]string{"Idempotency-Key": "bad key!"}, 400, "invalid_request"},
		{"purchase unknown campaign", "POST", "/api/v1/campaigns/nope-" + open + "/purchases", alice, `{"quantity":1}`, nil, 404, "not_found"},
		{"purchase campaign id with odd chars", "POST", "/api/v1/campaigns/a%7Bb%7D/purchases", alice, `{"quantity":1}`, nil, 404, "not_found"},
		{"purchase campaign id too long", "POST", "/api/v1/campaigns/" + strings.Repeat("a", 65) + "/purchases", alice, `{"quantity":1}`, nil, 404, "not_found"},
		{"purchase before start", "POST", "/api/v1/campaigns/" + future + "/purchases", alice, `{"quantity":1}`, nil, 409, "not_started"},
		{"purchase not preloaded", "POST", "/api/v1/campaigns/" + unloaded + "/purchases", alice, `{"quantity":1}`, nil, 409, "not_loaded"},
		{"purchase paused", "POST", "/api/v1/campaigns/" + paused + "/purchases", alice, `{"quantity":1}`, nil, 409, "paused"},
		{"poll unknown request", "GET", "/api/v1/purchases/" + open + ".0123456789abcdef0123456789abcdef", alice, nil, nil, 404, "not_found"},
		{"poll malformed request id", "GET", "/api/v1/purchases/garbage", alice, nil, nil, 404, "not_found"},
		{"poll without token", "GET", "/api/v1/purchases/garbage", "", nil, nil, 401, "unauthorized"},
		{"admin without token", "POST", "/admin/v1/campaigns", "", validCampaign, nil, 401, "unauthorized"},
		{"admin wrong token", "POST", "/admin/v1/campaigns", "wrong-token", validCampaign, nil, 403, "forbidden"},
		{"admin shopper token", "POST", "/admin/v1/campaigns", alice, validCampaign, nil, 403, "forbidden"},
		{"create duplicate id", "POST", "/admin/v1/campaigns", testAdminToken, `{"id":"` + open + `","name":"n","stock":5,"per_user_limit":1,"start_at":"2030-01-01T00:00:00Z","end_at":"2030-01-02T00:00:00Z"}`, nil, 409, "conflict"},
		{"create bad id", "POST", "/admin/v1/campaigns", testAdminToken, strings.Replace(validCampaign, `"x1"`, `"a b"`, 1), nil, 400, "invalid_request"},
		{"create zero stock", "POST", "/admin/v1/campaigns", testAdminToken, strings.Replace(validCampaign, `"stock":5`, `"stock":0`, 1), nil, 400, "invalid_request"},
		{"create huge stock", "POST", "/admin/v1/campaigns", testAdminToken, strings.Replace(validCampaign, `"stock":5`, `"stock":10000001`, 1), nil, 400, "invalid_request"},
		{"create zero limit", "POST", "/admin/v1/campaigns", testAdminToken, strings.Replace(validCampaign, `"per_user_limit":1`, `"per_user_limit":0`, 1), nil, 400, "invalid_request"},
		{"create end before start", "POST", "/admin/v1/campaigns", testAdminToken, strings.Replace(validCampaign, "2030-01-02", "2029-01-02", 1), nil, 400, "invalid_request"},
		{"create bad time", "POST", "/admin/v1/campaigns", testAdminToken, strings.Replace(validCampaign, "2030-01-01T00:00:00Z", "tomorrow", 1), nil, 400, "invalid_request"},
		{"create negative price", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"price":-1`), nil, 400, "invalid_request"},
		{"create huge price", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"price":1000000000001`), nil, 400, "invalid_request"},
		{"create price as text", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"price":"5"`), nil, 400, "invalid_request"},
		{"create window not a duration", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"soon"`), nil, 400, "invalid_request"},
		{"create window as a number", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":600`), nil, 400, "invalid_request"},
		{"create window too short", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"500ms"`), nil, 400, "invalid_request"},
		{"create window too long", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"25h"`), nil, 400, "invalid_request"},
		{"create window negative", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"-10m"`), nil, 400, "invalid_request"},
		{"create window below a millisecond", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"1.0005s"`), nil, 400, "invalid_request"},
		{"preload unknown campaign", "POST", "/admin/v1/campaigns/nope-x/preload", testAdminToken, nil, nil, 404, "not_found"},
		{"preload bad force", "POST", "/admin/v1/campaigns/" + open + "/preload?force=maybe", testAdminToken, nil, nil, 400, "invalid_request"},
		{"pause unknown campaign", "POST", "/admin/v1/campaigns/nope-x/pause", testAdminToken, nil, nil, 404, "not_found"},
		{"resume unknown campaign", "POST", "/admin/v1/campaigns/nope-x/resume", testAdminToken, nil, nil, 404, "not_found"},
		{"pause without token", "POST", "/admin/v1/campaigns/" + open + "/pause", "", nil, nil, 401, "unauthorized"},
		{"stats unknown campaign", "GET", "/admin/v1/campaigns/nope-x/stats", testAdminToken, nil, nil, 404, "not_found"},
		{"public unknown campaign", "GET", "/api/v1/campaigns/nope-x", "", nil, nil, 404, "not_found"},
		{"unknown route", "GET", "/api/v1/nothing", "", nil, nil, 404, "not_found"},
		{"orders without token", "GET", "/api/v1/orders", "", nil, nil, 401, "unauthorized"},
		{"orders bad limit", "GET", "/api/v1/orders?limit=ten", alice, nil, nil, 400, "invalid_request"},
		{"orders limit too large", "GET", "/api/v1/orders?limit=101", alice, nil, nil, 400, "invalid_request"},
		{"orders bad cursor", "GET", "/api/v1/orders?cursor=not-a-cursor", alice, nil, nil, 400, "invalid_request"},
		{"order of someone else", "GET", "/api/v1/orders/" + pending.ID, bob, nil, nil, 404, "not_found"},
		{"order unknown", "GET", "/api/v1/orders/no-such-order", alice, nil, nil, 404, "not_found"},
		{"order id with odd chars", "GET", "/api/v1/orders/a%7Bb%7D", alice, nil, nil, 404, "not_found"},
		{"cancel someone else's order", "POST", "/api/v1/orders/" + pending.ID + "/cancel", bob, nil, nil, 404, "not_found"},
		{"cancel without token", "POST", "/api/v1/orders/" + pending.ID + "/cancel", "", nil, nil, 401, "unauthorized"},
		{"cancel a paid order", "POST", "/api/v1/orders/" + paid.ID + "/cancel", bob, nil, nil, 409, "order_not_cancellable"},
		{"pay someone else's order", "POST", "/api/v1/orders/" + pending.ID + "/pay", bob, nil, nil, 404, "not_found"},
		{"pay a paid order", "POST", "/api/v1/orders/" + paid.ID + "/pay", bob, nil, nil, 409, "order_not_payable"},
		{"webhook unsigned", "POST", gateway.WebhookPath, "", pendingReport, nil, 401, "bad_signature"},
		{"webhook forged", "POST", gateway.WebhookPath, "", pendingReport, signed("another-secret-another-secret-xxxx", time.Now(), pendingReport), 401, "bad_signature"},
		{"webhook signature of another body", "POST", gateway.WebhookPath, "", pendingReport, signed(testWebhookSecret, time.Now(), paidReport), 401, "bad_signature"},
		{"webhook garbage signature", "POST", gateway.WebhookPath, "", pendingReport, map[string]string{gateway.SignatureHeader: "t=1,v1=zz"}, 401, "bad_signature"},
		{"webhook expired timestamp", "POST", gateway.WebhookPath, "", pendingReport, signed(testWebhookSecret, time.Now().Add(-10*time.Minute), pendingReport), 401, "stale_signature"},
		{"webhook future timestamp", "POST", gateway.WebhookPath, "", pendingReport, signed(testWebhookSecret, time.Now().Add(10*time.Minute), pendingReport), 401, "stale_signature"},
		{"webhook replayed payment id for another order", "POST", gateway.WebhookPath, "", webhookBody("pay_bob_1", pending.ID, "succeeded", 250),
			signed(testWebhookSecret, time.Now(), webhookBody("pay_bob_1", pending.ID, "succeeded", 250)), 409, "payment_conflict"},
		{"webhook replayed payment id as failed", "POST", gateway.WebhookPath, "", webhookBody("pay_bob_1", paid.ID, "failed", 250),
			signed(testWebhookSecret, time.Now(), webhookBody("pay_bob_1", paid.ID, "failed", 250)), 409, "payment_conflict"},
		{"webhook amount mismatch", "POST", gateway.WebhookPath, "", webhookBody("pay_alice_1", pending.ID, "succeeded", 249),
			signed(testWebhookSecret, time.Now(), webhookBody("pay_alice_1", pending.ID, "succeeded", 249)), 409, "amount_mismatch"},
		{"webhook unknown order", "POST", gateway.WebhookPath, "", webhookBody("pay_x_1", "no-such-order", "succeeded", 250),
			signed(testWebhookSecret, time.Now(), webhookBody("pay_x_1", "no-such-order", "succeeded", 250)), 404, "not_found"},
		{"webhook malformed body", "POST", gateway.WebhookPath, "", `{"payment_id":`, signed(testWebhookSecret, time.Now(), `{"payment_id":`), 400, "invalid_request"},
		{"webhook unknown status", "POST", gateway.WebhookPath, "", webhookBody("pay_alice_1", pending.ID, "pending", 250),
			signed(testWebhookSecret, time.Now(), webhookBody("pay_alice_1", pending.ID, "pending", 250)), 400, "invalid_request"},
		{"webhook oversized body", "POST", gateway.WebhookPath, "", `{"pad":"` + strings.Repeat("x", 8000) + `"}`, nil, 413, "body_too_large"},
		{"refund an unpaid order", "POST", "/admin/v1/orders/" + pending.ID + "/refund", testAdminToken, nil, nil, 409, "order_not_refundable"},
		{"refund unknown order", "POST", "/admin/v1/orders/no-such-order/refund", testAdminToken, nil, nil, 404, "not_found"},
		{"refund without token", "POST", "/admin/v1/orders/" + paid.ID + "/refund", "", nil, nil, 401, "unauthorized"},
		{"refund shopper token", "POST", "/admin/v1/orders/" + paid.ID + "/refund", bob, nil, nil, 403, "forbidden"},
		{"campaign orders bad status", "GET", "/admin/v1/campaigns/" + priced + "/orders?status=lost", testAdminToken, nil, nil, 400, "invalid_request"},
		{"payments bad status", "GET", "/admin/v1/payments?status=maybe", testAdminToken, nil, nil, 400, "invalid_request"},
		{"payments without token", "GET", "/admin/v1/payments", "", nil, nil, 401, "unauthorized"},
	}
	// The invalid field a refusal names, where the row is about one.
	wantField := map[string]string{
		"create negative price": "price", "create huge price": "price", "create price as text": "price",
		"create window not a duration": "payment_window", "create window as a number": "payment_window",
		"create window too short": "payment_window", "create window too long": "payment_window",
		"create window negative": "payment_window", "create window below a millisecond": "payment_window",
		"orders bad limit": "limit", "orders limit too large": "limit", "orders bad cursor": "cursor",
		"webhook unknown status": "status", "campaign orders bad status": "status", "payments bad status": "status",
	}
	before, pricedBefore := c.stats(open), c.stats(priced)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got struct {
				Code    string `json:"code"`
				Message string `json:"message"`
				Field   string `json:"field"`
			}
			code := c.do(tc.method, tc.path, tc.bearer, tc.body, tc.header, &got)
			if code != tc.wantCode || got.Code != tc.want {
				t.Fatalf("got %d %q (%s), want %d %q", code, got.Code, got.Message, tc.wantCode, tc.want)
			}
			if f, ok := wantField[tc.name]; ok && got.Field != f {
				t.Fatalf("got field %q (%s), want %q", got.Field, got.Message, f)
			}
		})
	}
	after := c.stats(open)
	if after.Remaining != before.Remaining || after.Admitted != before.Admitted || after.OrdersInDB != 0 || after.Remaining != 10 {
		t.Fatalf("bad input changed state: before %+v, after %+v", before, after)
	}
	// The same report delivered again is no error and changes nothing.
	if code, p := c.webhook(testWebhookSecret, time.Now(), paidReport); code != http.StatusOK || p.Status != "succeeded" {
		t.Fatalf("webhook delivered again: got %d %+v, want 200 succeeded", code, p)
	}
	if got := c.stats(priced); !reflect.DeepEqual(got, pricedBefore) {
		t.Fatalf("bad order input changed the sale: before %+v, after %+v", pricedBefore, got)
	}
	var o orderBody
	for _, want := range []struct{ id, owner, status string }{{pending.ID, alice, "pending_payment"}, {paid.ID, bob, "paid"}} {
		if code := c.do("GET", "/api/v1/orders/"+want.id, want.owner, nil, nil, &o); code != http.StatusOK || o.Status != want.status {
			t.Errorf("order %s: got %d %s, want %s", want.id, code, o.Status, want.status)
		}
	}
	var payments paymentPageBody
	if code := c.do("GET", "/admin/v1/payments", testAdminToken, nil, nil, &payments); code != http.StatusOK {
		t.Fatalf("payments: got %d", code)
	}
	for _, p := range payments.Payments {
		if p.OrderID == pending.ID || (p.OrderID == paid.ID && p.ID != "pay_bob_1") {
			t.Errorf("bad input recorded a payment: %+v", p)
		}
	}
	// Resetting a started sale would hand its stock out twice.
	if code := c.do("POST", "/admin/v1/campaigns/"+open+"/preload", testAdminToken, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("same preload again: got %d, want 200 (idempotent)", code)
	}
}
