package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	jwtlib "github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/lifecycle"
	"github.com/flashsale/flashsale/internal/sqlstore"
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
	// The test client is a trusted proxy, so rows can come from other
	// client addresses (X-Forwarded-For).
	cfg.HTTP.TrustedProxies = []string{"127.0.0.1"}
	cfg.Redis.KeyRetention = 3 * time.Hour
	c := startSystem(t, cfg)
	open := testenv.Name(t, "bad-")
	c.openCampaign(open, 10, 2)
	future := testenv.Name(t, "future-")
	body := campaignBody{ID: future, Name: "later", Stock: 5, PerUserLimit: 1,
		StartAt: time.Now().Add(time.Hour), EndAt: time.Now().Add(2 * time.Hour)}
	if code := c.do("POST", "/admin/v1/campaigns", testAdminToken, body, nil, nil); code != http.StatusCreated {
		t.Fatalf("create future campaign: got %d", code)
	}
	paused := testenv.Name(t, "paused-")
	c.openCampaign(paused, 10, 2)
	if code := c.do("POST", "/admin/v1/campaigns/"+paused+"/pause", testAdminToken, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("pause: got %d", code)
	}
	unloaded := testenv.Name(t, "unloaded-")
	body = campaignBody{ID: unloaded, Name: "no stock yet", Stock: 5, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
	if code := c.do("POST", "/admin/v1/campaigns", testAdminToken, body, nil, nil); code != http.StatusCreated {
		t.Fatalf("create unloaded campaign: got %d", code)
	}

	gated := testenv.Name(t, "gated-")
	c.openCampaignOf(campaignBody{ID: gated, Name: "gated", Stock: 5, PerUserLimit: 1, ChallengeBits: 20,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)})

	alice := c.token("alice")
	// The order lifecycle's subjects: alice's order pending payment, bob's
	// paid through a provider's webhook.
	priced := testenv.Name(t, "paid-")
	pricedEnd := time.Now().Add(time.Hour)
	c.openCampaignOf(campaignBody{ID: priced, Name: "priced", Stock: 10, PerUserLimit: 2, Price: 250,
		StartAt: time.Now().Add(-time.Second), EndAt: pricedEnd})
	pending, paid := c.buy("alice", priced), c.buy("bob", priced)
	paidReport := webhookBody("pay_bob_1", paid.ID, "succeeded", 250)
	if code, p := c.webhook(testWebhookSecret, time.Now(), paidReport); code != http.StatusOK || p.Status != "succeeded" {
		t.Fatalf("pay bob's order: got %d %+v, want 200 succeeded", code, p)
	}
	bob := c.token("bob")
	// Idempotency-Keys: carol's purchase of 2 decided, then sent again.
	carolKey := map[string]string{"Idempotency-Key": "carol-1"}
	carolFirst := c.buyKeyed("carol", priced, "carol-1", `{"quantity":2}`)
	var replay purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/"+priced+"/purchases", c.token("carol"), `{"quantity":2}`, carolKey, &replay); code != http.StatusOK ||
		replay.RequestID != carolFirst.RequestID || replay.Status != "success" || replay.OrderID != carolFirst.OrderID {
		t.Fatalf("carol's replay: got %d %+v, want 200 %s success with order %s", code, replay, carolFirst.RequestID, carolFirst.OrderID)
	}
	// A sale dave sold out with a keyed purchase.
	soldOut := testenv.Name(t, "soldout-")
	c.openCampaign(soldOut, 2, 2)
	c.buyKeyed("dave", soldOut, "dave-1", `{"quantity":2}`)
	carol, dave := c.token("carol"), c.token("dave")
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
	expAsText, _ := jwtlib.NewWithClaims(jwtlib.SigningMethodHS256, jwtlib.MapClaims{"sub": "alice",
		"exp": strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)}).SignedString([]byte(testJWTSecret))
	critical := jwtlib.NewWithClaims(jwtlib.SigningMethodHS256, jwtlib.RegisteredClaims{Subject: "alice",
		ExpiresAt: jwtlib.NewNumericDate(time.Now().Add(time.Hour))})
	critical.Header["crit"] = []string{"x-unknown"}
	critical.Header["x-unknown"] = true
	withCrit, _ := critical.SignedString([]byte(testJWTSecret))
	// Subjects no user id can be: any a provider issues is one (1 to 255
	// bytes of printable UTF-8, TestProviderSubjectsEndToEnd).
	withSubject := func(sub string) string {
		tok, _ := jwtlib.NewWithClaims(jwtlib.SigningMethodHS256, jwtlib.RegisteredClaims{Subject: sub,
			ExpiresAt: jwtlib.NewNumericDate(time.Now().Add(time.Hour))}).SignedString([]byte(testJWTSecret))
		return tok
	}
	longSub, emptySub, unprintableSub := withSubject("auth0|"+strings.Repeat("é", 125)), withSubject(""), withSubject("a\u202eb")

	// A guesser at 203.0.113.7 has sent as many wrong admin tokens as a
	// minute allows; from then on even the right one is refused there.
	guesser := map[string]string{"X-Forwarded-For": "203.0.113.7"}
	for i := range cfg.Auth.AdminFailuresPerMinute {
		if code := c.do("GET", "/admin/v1/campaigns/"+open+"/stats", fmt.Sprintf("guess-%d", i), nil, guesser, nil); code != http.StatusForbidden {
			t.Fatalf("wrong admin token %d: got %d, want 403", i, code)
		}
	}

	buy := "/api/v1/campaigns/" + open + "/purchases"
	// Ids are exact strings: the same letters in another case name nothing.
	openUpper := strings.ToUpper(open)
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
		{"purchase chunked body one byte over", "POST", buy, alice, chunked(`{"quantity":1}` + strings.Repeat(" ", 4097-14)), nil, 413, "body_too_large"},
		{"purchase chunked body of 1 MB", "POST", buy, alice, chunked(`{"quantity":1}` + strings.Repeat(" ", 1<<20)), nil, 413, "body_too_large"},
		{"purchase chunked trailing data past the limit", "POST", buy, alice, chunked(`{"quantity":1}` + strings.Repeat(" ", 5000) + "GARBAGE"), nil, 413, "body_too_large"},
		{"purchase chunked trailing data", "POST", buy, alice, chunked(`{"quantity":1} GARBAGE`), nil, 400, "invalid_request"},
		{"purchase key in another case", "POST", buy, alice, `{"Quantity":2}`, nil, 400, "invalid_request"},
		{"purchase repeated key", "POST", buy, alice, `{"quantity":1,"quantity":2}`, nil, 400, "invalid_request"},
		{"purchase without content type", "POST", buy, alice, `{"quantity":1}`, map[string]string{"Content-Type": ""}, 415, "unsupported_media_type"},
		{"purchase as text/plain", "POST", buy, alice, `{"quantity":1}`, map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type"},
		{"purchase as a form", "POST", buy, alice, `quantity=1`, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"purchase wrong method", "PUT", buy, alice, `{"quantity":1}`, nil, 405, "method_not_allowed"},
		{"purchase exp as a numeric string", "POST", buy, expAsText, `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase crit header", "POST", buy, withCrit, `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase sub of 256 bytes", "POST", buy, longSub, `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase empty sub", "POST", buy, emptySub, `{"quantity":1}`, nil, 401, "unauthorized"},
		{"purchase unprintable sub", "POST", buy, unprintableSub, `{"quantity":1}`, nil, 401, "unauthorized"},
		{"poll sub of 256 bytes", "GET", "/api/v1/purchases/garbage", longSub, nil, nil, 401, "unauthorized"},
		{"orders empty sub", "GET", "/api/v1/orders", emptySub, nil, nil, 401, "unauthorized"},
		{"purchase bad idempotency key", "POST", buy, alice, `{"quantity":1}`, map[string]string{"Idempotency-Key": "bad key!"}, 400, "invalid_request"},
		{"purchase idempotency key reused with another quantity", "POST", "/api/v1/campaigns/" + priced + "/purchases", carol, `{"quantity":1}`, carolKey, 422, "idempotency_key_reused"},
		{"purchase idempotency key reused with quantity left out", "POST", "/api/v1/campaigns/" + priced + "/purchases", carol, `{}`, carolKey, 422, "idempotency_key_reused"},
		{"purchase idempotency key reused on a sold-out sale", "POST", "/api/v1/campaigns/" + soldOut + "/purchases", dave, `{"quantity":1}`, map[string]string{"Idempotency-Key": "dave-1"}, 422, "idempotency_key_reused"},
		{"purchase unknown campaign", "POST", "/api/v1/campaigns/nope-" + open + "/purchases", alice, `{"quantity":1}`, nil, 404, "not_found"},
		{"purchase campaign id with odd chars", "POST", "/api/v1/campaigns/a%7Bb%7D/purchases", alice, `{"quantity":1}`, nil, 404, "not_found"},
		{"purchase campaign id too long", "POST", "/api/v1/campaigns/" + strings.Repeat("a", 65) + "/purchases", alice, `{"quantity":1}`, nil, 404, "not_found"},
		{"purchase campaign id in another case", "POST", "/api/v1/campaigns/" + openUpper + "/purchases", alice, `{"quantity":1}`, nil, 404, "not_found"},
		{"purchase before start", "POST", "/api/v1/campaigns/" + future + "/purchases", alice, `{"quantity":1}`, nil, 409, "not_started"},
		{"purchase not preloaded", "POST", "/api/v1/campaigns/" + unloaded + "/purchases", alice, `{"quantity":1}`, nil, 409, "not_loaded"},
		{"purchase gated without a challenge", "POST", "/api/v1/campaigns/" + gated + "/purchases", alice, `{"quantity":1}`, nil, 403, "challenge_failed"},
		{"purchase gated with a garbage challenge", "POST", "/api/v1/campaigns/" + gated + "/purchases", alice, `{"quantity":1}`, map[string]string{"Flashsale-Challenge": "20.1.x.y.0"}, 403, "challenge_failed"},
		{"challenge before start", "GET", "/api/v1/campaigns/" + future + "/challenge", alice, nil, nil, 409, "not_started"},
		{"challenge unknown campaign", "GET", "/api/v1/campaigns/nope-" + open + "/challenge", alice, nil, nil, 404, "not_found"},
		{"challenge without token", "GET", "/api/v1/campaigns/" + gated + "/challenge", "", nil, nil, 401, "unauthorized"},
		{"purchase paused", "POST", "/api/v1/campaigns/" + paused + "/purchases", alice, `{"quantity":1}`, nil, 409, "paused"},
		{"poll unknown request", "GET", "/api/v1/purchases/" + open + ".0123456789abcdef0123456789abcdef", alice, nil, nil, 404, "not_found"},
		{"poll request id in another case", "GET", "/api/v1/purchases/" + strings.ToUpper(pending.RequestID[:len(priced)]) + pending.RequestID[len(priced):], alice, nil, nil, 404, "not_found"},
		{"poll malformed request id", "GET", "/api/v1/purchases/garbage", alice, nil, nil, 404, "not_found"},
		{"poll without token", "GET", "/api/v1/purchases/garbage", "", nil, nil, 401, "unauthorized"},
		{"admin without token", "POST", "/admin/v1/campaigns", "", validCampaign, nil, 401, "unauthorized"},
		{"admin wrong token", "POST", "/admin/v1/campaigns", "wrong-token", validCampaign, nil, 403, "forbidden"},
		{"admin shopper token", "POST", "/admin/v1/campaigns", alice, validCampaign, nil, 403, "forbidden"},
		{"admin right token after a minute of wrong ones", "POST", "/admin/v1/campaigns", testAdminToken, validCampaign, guesser, 429, "rate_limited"},
		{"admin wrong method", "DELETE", "/admin/v1/campaigns", testAdminToken, nil, nil, 405, "method_not_allowed"},
		{"create chunked past the limit", "POST", "/admin/v1/campaigns", testAdminToken, chunked(validCampaign + strings.Repeat(" ", 5000)), nil, 413, "body_too_large"},
		{"create key in another case", "POST", "/admin/v1/campaigns", testAdminToken, strings.Replace(validCampaign, `"stock"`, `"Stock"`, 1), nil, 400, "invalid_request"},
		{"create repeated key", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"stock":6`), nil, 400, "invalid_request"},
		{"create as text/plain", "POST", "/admin/v1/campaigns", testAdminToken, validCampaign, map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type"},
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
		{"create challenge bits negative", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"challenge_bits":-1`), nil, 400, "invalid_request"},
		{"create challenge bits above 28", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"challenge_bits":29`), nil, 400, "invalid_request"},
		{"create challenge bits as text", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"challenge_bits":"8"`), nil, 400, "invalid_request"},
		{"create buckets negative", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"buckets":-1`), nil, 400, "invalid_request"},
		{"create buckets above 64", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"buckets":65`), nil, 400, "invalid_request"},
		{"create buckets as text", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"buckets":"4"`), nil, 400, "invalid_request"},
		{"patch challenge bits above 28", "PATCH", "/admin/v1/campaigns/" + open, testAdminToken, `{"challenge_bits":29}`, nil, 400, "invalid_request"},
		{"create window not a duration", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"soon"`), nil, 400, "invalid_request"},
		{"create window as a number", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":600`), nil, 400, "invalid_request"},
		{"create window too short", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"500ms"`), nil, 400, "invalid_request"},
		{"create window too long", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"25h"`), nil, 400, "invalid_request"},
		{"create window negative", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"-10m"`), nil, 400, "invalid_request"},
		{"create window below a millisecond", "POST", "/admin/v1/campaigns", testAdminToken, withField(validCampaign, `"payment_window":"1.0005s"`), nil, 400, "invalid_request"},
		{"preload unknown campaign", "POST", "/admin/v1/campaigns/nope-x/preload", testAdminToken, nil, nil, 404, "not_found"},
		{"preload campaign id in another case", "POST", "/admin/v1/campaigns/" + openUpper + "/preload", testAdminToken, nil, nil, 404, "not_found"},
		{"preload bad force", "POST", "/admin/v1/campaigns/" + open + "/preload?force=maybe", testAdminToken, nil, nil, 400, "invalid_request"},
		{"pause unknown campaign", "POST", "/admin/v1/campaigns/nope-x/pause", testAdminToken, nil, nil, 404, "not_found"},
		{"resume unknown campaign", "POST", "/admin/v1/campaigns/nope-x/resume", testAdminToken, nil, nil, 404, "not_found"},
		{"pause campaign id in another case", "POST", "/admin/v1/campaigns/" + openUpper + "/pause", testAdminToken, nil, nil, 404, "not_found"},
		{"pause without token", "POST", "/admin/v1/campaigns/" + open + "/pause", "", nil, nil, 401, "unauthorized"},
		{"stats unknown campaign", "GET", "/admin/v1/campaigns/nope-x/stats", testAdminToken, nil, nil, 404, "not_found"},
		{"stats campaign id in another case", "GET", "/admin/v1/campaigns/" + openUpper + "/stats", testAdminToken, nil, nil, 404, "not_found"},
		{"public campaign id in another case", "GET", "/api/v1/campaigns/" + openUpper, "", nil, nil, 404, "not_found"},
		{"public unknown campaign", "GET", "/api/v1/campaigns/nope-x", "", nil, nil, 404, "not_found"},
		{"unknown route", "GET", "/api/v1/nothing", "", nil, nil, 404, "not_found"},
		{"orders without token", "GET", "/api/v1/orders", "", nil, nil, 401, "unauthorized"},
		{"orders bad limit", "GET", "/api/v1/orders?limit=ten", alice, nil, nil, 400, "invalid_request"},
		{"orders limit too large", "GET", "/api/v1/orders?limit=101", alice, nil, nil, 400, "invalid_request"},
		{"orders bad cursor", "GET", "/api/v1/orders?cursor=not-a-cursor", alice, nil, nil, 400, "invalid_request"},
		{"order of someone else", "GET", "/api/v1/orders/" + pending.ID, bob, nil, nil, 404, "not_found"},
		{"order unknown", "GET", "/api/v1/orders/no-such-order", alice, nil, nil, 404, "not_found"},
		{"order id in another case", "GET", "/api/v1/orders/" + strings.ToUpper(pending.ID), alice, nil, nil, 404, "not_found"},
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
		{"webhook as text/plain", "POST", gateway.WebhookPath, "", pendingReport,
			map[string]string{gateway.SignatureHeader: lifecycle.SignWebhook(testWebhookSecret, time.Now(), []byte(pendingReport)), "Content-Type": "text/plain"}, 415, "unsupported_media_type"},
		{"webhook key in another case", "POST", gateway.WebhookPath, "", strings.Replace(pendingReport, `"amount"`, `"Amount"`, 1),
			signed(testWebhookSecret, time.Now(), strings.Replace(pendingReport, `"amount"`, `"Amount"`, 1)), 400, "invalid_request"},
		{"webhook repeated key", "POST", gateway.WebhookPath, "", withField(pendingReport, `"amount":1`),
			signed(testWebhookSecret, time.Now(), withField(pendingReport, `"amount":1`)), 400, "invalid_request"},
		{"refund an unpaid order", "POST", "/admin/v1/orders/" + pending.ID + "/refund", testAdminToken, nil, nil, 409, "order_not_refundable"},
		{"refund unknown order", "POST", "/admin/v1/orders/no-such-order/refund", testAdminToken, nil, nil, 404, "not_found"},
		{"refund without token", "POST", "/admin/v1/orders/" + paid.ID + "/refund", "", nil, nil, 401, "unauthorized"},
		{"refund shopper token", "POST", "/admin/v1/orders/" + paid.ID + "/refund", bob, nil, nil, 403, "forbidden"},
		{"campaign orders bad status", "GET", "/admin/v1/campaigns/" + priced + "/orders?status=lost", testAdminToken, nil, nil, 400, "invalid_request"},
		{"payments bad status", "GET", "/admin/v1/payments?status=maybe", testAdminToken, nil, nil, 400, "invalid_request"},
		{"payments without token", "GET", "/admin/v1/payments", "", nil, nil, 401, "unauthorized"},
		{"campaigns bad state", "GET", "/admin/v1/campaigns?state=live", testAdminToken, nil, nil, 400, "invalid_request"},
		{"campaigns bad limit", "GET", "/admin/v1/campaigns?limit=0x10", testAdminToken, nil, nil, 400, "invalid_request"},
		{"campaigns limit too large", "GET", "/admin/v1/campaigns?limit=101", testAdminToken, nil, nil, 400, "invalid_request"},
		{"campaigns bad cursor", "GET", "/admin/v1/campaigns?cursor=not-a-cursor", testAdminToken, nil, nil, 400, "invalid_request"},
		{"campaigns without token", "GET", "/admin/v1/campaigns", "", nil, nil, 401, "unauthorized"},
		{"campaigns shopper token", "GET", "/admin/v1/campaigns", alice, nil, nil, 403, "forbidden"},
		{"get unknown campaign", "GET", "/admin/v1/campaigns/nope-x", testAdminToken, nil, nil, 404, "not_found"},
		{"get campaign id in another case", "GET", "/admin/v1/campaigns/" + openUpper, testAdminToken, nil, nil, 404, "not_found"},
		{"patch unknown campaign", "PATCH", "/admin/v1/campaigns/nope-x", testAdminToken, `{"name":"n"}`, nil, 404, "not_found"},
		{"patch empty", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{}`, nil, 400, "invalid_request"},
		{"patch stock", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{"stock":50}`, nil, 400, "invalid_request"},
		{"patch price", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{"price":1}`, nil, 400, "invalid_request"},
		{"patch empty name", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{"name":""}`, nil, 400, "invalid_request"},
		{"patch zero limit", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{"per_user_limit":0}`, nil, 400, "invalid_request"},
		{"patch end before start", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{"end_at":"2001-01-01T00:00:00Z"}`, nil, 400, "invalid_request"},
		{"patch window not a duration", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{"payment_window":"soon"}`, nil, 400, "invalid_request"},
		{"patch window zero", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{"payment_window":"0s"}`, nil, 400, "invalid_request"},
		{"patch repeated key", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{"name":"a","name":"b"}`, nil, 400, "invalid_request"},
		{"patch as text/plain", "PATCH", "/admin/v1/campaigns/" + future, testAdminToken, `{"name":"n"}`, map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type"},
		{"patch limit after the start", "PATCH", "/admin/v1/campaigns/" + open, testAdminToken, `{"per_user_limit":1}`, nil, 409, "sale_started"},
		{"patch window after the start", "PATCH", "/admin/v1/campaigns/" + open, testAdminToken, `{"end_at":"2031-01-01T00:00:00Z"}`, nil, 409, "sale_started"},
		{"patch without token", "PATCH", "/admin/v1/campaigns/" + open, "", `{"name":"n"}`, nil, 401, "unauthorized"},
		{"end unknown campaign", "POST", "/admin/v1/campaigns/nope-x/end", testAdminToken, nil, nil, 404, "not_found"},
		{"end before the start", "POST", "/admin/v1/campaigns/" + future + "/end", testAdminToken, nil, nil, 409, "not_started"},
		{"end shopper token", "POST", "/admin/v1/campaigns/" + open + "/end", alice, nil, nil, 403, "forbidden"},
		{"delete unknown campaign", "DELETE", "/admin/v1/campaigns/nope-x", testAdminToken, nil, nil, 404, "not_found"},
		{"delete a started sale", "DELETE", "/admin/v1/campaigns/" + open, testAdminToken, nil, nil, 409, "sale_started"},
		{"delete without token", "DELETE", "/admin/v1/campaigns/" + future, "", nil, nil, 401, "unauthorized"},
		{"public list wrong method", "POST", "/api/v1/campaigns", "", `{}`, nil, 405, "method_not_allowed"},
	}
	// The invalid field a refusal names, where the row is about one.
	wantField := map[string]string{
		"create negative price": "price", "create huge price": "price", "create price as text": "price",
		"create window not a duration": "payment_window", "create window as a number": "payment_window",
		"create window too short": "payment_window", "create window too long": "payment_window",
		"create window negative": "payment_window", "create window below a millisecond": "payment_window",
		"orders bad limit": "limit", "orders limit too large": "limit", "orders bad cursor": "cursor",
		"webhook unknown status": "status", "campaign orders bad status": "status", "payments bad status": "status",
		"purchase key in another case": "Quantity", "purchase repeated key": "quantity",
		"create key in another case": "Stock", "create repeated key": "stock",
		"webhook key in another case": "Amount", "webhook repeated key": "amount",
		"campaigns bad state": "state", "campaigns bad limit": "limit", "campaigns limit too large": "limit", "campaigns bad cursor": "cursor",
		"patch stock": "stock", "patch price": "price", "patch empty name": "name", "patch zero limit": "per_user_limit",
		"patch end before start": "end_at", "patch window not a duration": "payment_window", "patch window zero": "payment_window",
		"patch repeated key": "name",
	}
	// The message a refusal must carry, where the row is about why.
	wantMessage := map[string]string{
		"purchase sub of 256 bytes": "unauthorized: token subject (sub) longer than 255 bytes",
		"poll sub of 256 bytes":     "unauthorized: token subject (sub) longer than 255 bytes",
		"purchase empty sub":        "unauthorized: token subject (sub) empty",
		"orders empty sub":          "unauthorized: token subject (sub) empty",
		"purchase unprintable sub":  "unauthorized: token subject (sub) holds the unprintable character U+202E",
	}
	// The header a refusal must carry, where the row is about one ("" = any
	// value).
	wantHeader := map[string][2]string{
		"purchase wrong method":                          {"Allow", "POST"},
		"admin wrong method":                             {"Allow", "GET, POST"},
		"admin right token after a minute of wrong ones": {"Retry-After", ""},
	}
	before, pricedBefore, soldOutBefore := c.stats(open), c.stats(priced), c.stats(soldOut)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got struct {
				Code    string `json:"code"`
				Message string `json:"message"`
				Field   string `json:"field"`
			}
			code, header := c.send(tc.method, tc.path, tc.bearer, tc.body, tc.header, &got)
			if code != tc.wantCode || got.Code != tc.want {
				t.Fatalf("got %d %q (%s), want %d %q", code, got.Code, got.Message, tc.wantCode, tc.want)
			}
			if f, ok := wantField[tc.name]; ok && got.Field != f {
				t.Fatalf("got field %q (%s), want %q", got.Field, got.Message, f)
			}
			if m, ok := wantMessage[tc.name]; ok && got.Message != m {
				t.Fatalf("got message %q, want %q", got.Message, m)
			}
			if h, ok := wantHeader[tc.name]; ok && (header.Get(h[0]) == "" || (h[1] != "" && header.Get(h[0]) != h[1])) {
				t.Fatalf("got %s %q, want %q", h[0], header.Get(h[0]), h[1])
			}
		})
	}
	for id, want := range map[string]struct {
		name  string
		limit int64
	}{future: {"later", 1}, open: {"Test " + open, 2}} {
		var got struct {
			Name         string `json:"name"`
			PerUserLimit int64  `json:"per_user_limit"`
			EndedEarly   bool   `json:"ended_early"`
		}
		if code := c.do("GET", "/admin/v1/campaigns/"+id, testAdminToken, nil, nil, &got); code != http.StatusOK ||
			got.Name != want.name || got.PerUserLimit != want.limit || got.EndedEarly {
			t.Errorf("campaign %s after bad input: got %d %+v, want %+v, not ended", id, code, got, want)
		}
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
	if got := c.stats(soldOut); !reflect.DeepEqual(got, soldOutBefore) {
		t.Fatalf("a reused key changed the sold-out sale: before %+v, after %+v", soldOutBefore, got)
	}
	// The keys still name their first requests.
	if code := c.do("POST", "/api/v1/campaigns/"+priced+"/purchases", carol, `{"quantity":2}`, carolKey, &replay); code != http.StatusOK || replay.RequestID != carolFirst.RequestID {
		t.Fatalf("carol's replay after the rows: got %d %+v, want 200 %s", code, replay, carolFirst.RequestID)
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
	if keys, err := testenv.Redis(t).Keys(t.Context(), "fs:{"+openUpper+"}*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("Redis keys of %s: got %v, %v; want none", openUpper, keys, err)
	}
	db, err := sqlstore.Open(t.Context(), cfg.Database.Driver, cfg.Database.DSN)
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	defer db.Close()
	if got, err := db.Campaign(t.Context(), open); err != nil || got.Paused {
		t.Errorf("campaign %s: got paused %v, %v; want not paused by a request for %s", open, got.Paused, err, openUpper)
	}
	// Another case is another campaign, created, read and sold on its own.
	c.openCampaignOf(campaignBody{ID: openUpper, Name: "upper", Stock: 3, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)})
	for id, name := range map[string]string{open: "Test " + open, openUpper: "upper"} {
		var pc struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		}
		if code := c.do("GET", "/api/v1/campaigns/"+id, "", nil, nil, &pc); code != http.StatusOK || pc.ID != id || pc.Name != name {
			t.Errorf("GET campaign %s: got %d %+v, want 200 %s %q", id, code, pc, id, name)
		}
	}
	if o := c.buy("alice", openUpper); o.CampaignID != openUpper {
		t.Errorf("order in %s: got campaign %q", openUpper, o.CampaignID)
	}
	if st := c.settle(openUpper, 20*time.Second); st.Sold != 1 || st.OrdersInDB != 1 {
		t.Errorf("stats of %s: got %+v, want its one order", openUpper, st)
	}
	if st := c.stats(open); st.Sold != 0 || st.OrdersInDB != 0 || st.Remaining != 10 {
		t.Errorf("stats of %s after a sale in %s: got %+v, want untouched", open, openUpper, st)
	}
	// The sale's keys expire redis.key_retention after its end and payment
	// window (the default, 10m), not before.
	rdb := testenv.Redis(t)
	keys, err := rdb.Keys(t.Context(), "fs:{"+priced+"}*").Result()
	if err != nil || len(keys) < 5 {
		t.Fatalf("keys of %s: got %v, %v", priced, keys, err)
	}
	expires := pricedEnd.Add(10*time.Minute + cfg.Redis.KeyRetention)
	for _, k := range keys {
		ttl, err := rdb.TTL(t.Context(), k).Result()
		// Up to 1.5 s over: the expiry is rounded up to a whole second, and
		// TTL rounds what is left to the nearest one.
		if left := time.Until(expires); err != nil || ttl < left-time.Minute || ttl > left+1500*time.Millisecond {
			t.Errorf("key %s: TTL %v, %v; want %v", k, ttl, err, left)
		}
	}
	// Resetting a started sale would hand its stock out twice.
	if code := c.do("POST", "/admin/v1/campaigns/"+open+"/preload", testAdminToken, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("same preload again: got %d, want 200 (idempotent)", code)
	}
}

// TestBadInputSeparateAdmin: with http.admin_addr set and the default
// WebSocket Origin check, what the public must not see or do gets its
// exact status and code there, and changes nothing.
func TestBadInputSeparateAdmin(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	cfg.HTTP.AdminAddr = "127.0.0.1:0"
	cfg.Notifier.AllowedOrigins = nil // the request's own scheme and host only
	ctx, cancel := context.WithCancel(context.Background())
	sys, err := start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), roleSet{gateway: true, worker: true, notifier: true})
	if err != nil {
		cancel()
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { cancel(); _ = sys.Wait() })
	public := newClient(t, "http://"+sys.Addr(), cfg.Auth)
	admin := newClient(t, "http://"+sys.adminAddr, cfg.Auth)
	campaign := testenv.Name(t, "sep-")
	admin.openCampaign(campaign, 5, 1)
	upgrade := func(origin string) map[string]string {
		return map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
			"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Origin": origin}
	}
	tests := []struct {
		name     string
		at       *client
		method   string
		path     string
		bearer   string
		header   map[string]string
		wantCode int
		want     string // "" = not an error
	}{
		{"metrics on the public listener", public, "GET", "/metrics", "", nil, 404, "not_found"},
		{"readiness on the public listener", public, "GET", "/readyz", "", nil, 404, "not_found"},
		{"admin route on the public listener", public, "GET", "/admin/v1/campaigns/" + campaign + "/stats", testAdminToken, nil, 404, "not_found"},
		{"metrics on the admin listener", admin, "GET", "/metrics", "", nil, 200, ""},
		{"readiness on the admin listener", admin, "GET", "/readyz", "", nil, 200, ""},
		{"health on the public listener", public, "GET", "/healthz", "", nil, 200, ""},
		{"health on the admin listener", admin, "GET", "/healthz", "", nil, 200, ""},
		{"websocket from the https page of the same host", public, "GET", "/api/v1/ws", public.token("alice"), upgrade("https://" + sys.Addr()), 403, "forbidden"},
		{"websocket from another port of the same host", public, "GET", "/api/v1/ws", public.token("alice"), upgrade("http://" + sys.adminAddr), 403, "forbidden"},
	}
	before := admin.stats(campaign)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			}
			var out any
			if tc.want != "" {
				out = &got
			}
			if code := tc.at.do(tc.method, tc.path, tc.bearer, nil, tc.header, out); code != tc.wantCode || got.Code != tc.want {
				t.Fatalf("got %d %q (%s), want %d %q", code, got.Code, got.Message, tc.wantCode, tc.want)
			}
		})
	}
	if after := admin.stats(campaign); !reflect.DeepEqual(after, before) {
		t.Fatalf("bad input changed the sale: before %+v, after %+v", before, after)
	}
}

// buyKeyed posts user's purchase with an Idempotency-Key and waits until it
// is decided, which must be a success, and its order is stored.
func (c *client) buyKeyed(user, campaign, key, body string) resultBody {
	c.t.Helper()
	var p purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(user), body,
		map[string]string{"Idempotency-Key": key}, &p); code != http.StatusAccepted {
		c.t.Fatalf("purchase by %s: got %d %q, want 202", user, code, p.Code)
	}
	var r resultBody
	testenv.Eventually(c.t, 20*time.Second, "the purchase by "+user+" decided and stored", func() (bool, string) {
		var code int
		if code, r = c.poll(user, p.RequestID); code != http.StatusOK || r.Status == "queued" {
			return false, fmt.Sprintf("%d %+v", code, r)
		}
		if r.Status != "success" {
			c.t.Fatalf("purchase by %s: got %s (%s), want success", user, r.Status, r.Reason)
		}
		// The result is final a moment before the worker's INSERT lands.
		return c.do("GET", "/api/v1/orders/"+r.OrderID, c.token(user), nil, nil, nil) == http.StatusOK, "a success, its order not stored yet"
	})
	return r
}
