package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	jwtlib "github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/testenv"
)

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
		{"preload unknown campaign", "POST", "/admin/v1/campaigns/nope-x/preload", testAdminToken, nil, nil, 404, "not_found"},
		{"preload bad force", "POST", "/admin/v1/campaigns/" + open + "/preload?force=maybe", testAdminToken, nil, nil, 400, "invalid_request"},
		{"pause unknown campaign", "POST", "/admin/v1/campaigns/nope-x/pause", testAdminToken, nil, nil, 404, "not_found"},
		{"resume unknown campaign", "POST", "/admin/v1/campaigns/nope-x/resume", testAdminToken, nil, nil, 404, "not_found"},
		{"pause without token", "POST", "/admin/v1/campaigns/" + open + "/pause", "", nil, nil, 401, "unauthorized"},
		{"stats unknown campaign", "GET", "/admin/v1/campaigns/nope-x/stats", testAdminToken, nil, nil, 404, "not_found"},
		{"public unknown campaign", "GET", "/api/v1/campaigns/nope-x", "", nil, nil, 404, "not_found"},
		{"unknown route", "GET", "/api/v1/nothing", "", nil, nil, 404, "not_found"},
	}
	before := c.stats(open)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			}
			code := c.do(tc.method, tc.path, tc.bearer, tc.body, tc.header, &got)
			if code != tc.wantCode || got.Code != tc.want {
				t.Fatalf("got %d %q (%s), want %d %q", code, got.Code, got.Message, tc.wantCode, tc.want)
			}
		})
	}
	after := c.stats(open)
	if after.Remaining != before.Remaining || after.Admitted != before.Admitted || after.OrdersInDB != 0 || after.Remaining != 10 {
		t.Fatalf("bad input changed state: before %+v, after %+v", before, after)
	}
	// Resetting a started sale would hand its stock out twice.
	if code := c.do("POST", "/admin/v1/campaigns/"+open+"/preload", testAdminToken, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("same preload again: got %d, want 200 (idempotent)", code)
	}
}
