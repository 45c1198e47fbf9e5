package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// providerUsers are shoppers as identity providers name them (the JWT
// subject): Auth0's and Google's forms, one a prefix of another, non-ASCII,
// the stored formats' separators, and the longest id, 255 bytes.
var providerUsers = []string{
	"auth0|5f7c8ec7b4a1d2006b1f0e3a",
	"google-oauth2|1234",
	"google-oauth2|12",
	"Zoë|日本語",
	`a|b|c|d|e "q" {t} \`,
	strings.Repeat("é", 127) + "a",
}

// TestProviderSubjectsEndToEnd: each provider user buys through the whole
// path (gateway, queue message, worker, MySQL order, result pushed over
// WebSocket and polled), retries with the same Idempotency-Key, pays, and
// is held to their own per-user limit; the order names them whole.
func TestProviderSubjectsEndToEnd(t *testing.T) {
	c := startSystem(t, realConfig(t, "redisstream"))
	campaign := testenv.Name(t, "subj-")
	c.openCampaignOf(campaignBody{ID: campaign, Name: "providers", Stock: 20, PerUserLimit: 1, Price: 100,
		StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)})
	for _, user := range providerUsers {
		code, p := c.buyWithKey(campaign, user, "first-try")
		if code != http.StatusAccepted {
			t.Fatalf("purchase by %q: got %d %q, want 202", user, code, p.Code)
		}
		c.mustRetrySame(campaign, user, "first-try", p.RequestID)
		r, err := c.wsResult(user, p.RequestID, 20*time.Second)
		if err != nil || r.Status != "success" || r.RequestID != p.RequestID {
			t.Fatalf("pushed result of %q: got %+v, %v; want success", user, r, err)
		}
		if code, polled := c.poll(user, p.RequestID); code != http.StatusOK || polled != r {
			t.Fatalf("polled result of %q: got %d %+v, want %+v", user, code, polled, r)
		}
		tok := c.token(user)
		var o orderBody
		// The INSERT lands a moment after the result.
		testenv.Eventually(t, 20*time.Second, "the order stored", func() (bool, string) {
			return c.do("GET", "/api/v1/orders/"+r.OrderID, tok, nil, nil, &o) == http.StatusOK, "not found"
		})
		if o.ID != r.OrderID || o.UserID != user || o.RequestID != p.RequestID {
			t.Fatalf("order of %q: got %+v, want %s of request %s", user, o, r.OrderID, p.RequestID)
		}
		var page orderPageBody
		if code := c.do("GET", "/api/v1/orders", tok, nil, nil, &page); code != http.StatusOK || len(page.Orders) != 1 || page.Orders[0].ID != o.ID {
			t.Fatalf("orders of %q: got %d %+v, want %s alone", user, code, page, o.ID)
		}
		var co checkoutBody
		if code := c.do("POST", "/api/v1/orders/"+o.ID+"/pay", tok, nil, nil, &co); code != http.StatusOK || co.Status != "paid" {
			t.Fatalf("pay order of %q: got %d %+v", user, code, co)
		}
	}
	// Each one's limit is their own: a second unit is over it.
	for _, user := range providerUsers {
		code, p := c.buyWithKey(campaign, user, "second-try")
		if code != http.StatusAccepted {
			t.Fatalf("second purchase by %q: got %d %q, want 202", user, code, p.Code)
		}
		if r := c.waitFinal(user, p.RequestID, 20*time.Second); r.Status != "limit_exceeded" {
			t.Fatalf("second purchase by %q: got %+v, want limit_exceeded", user, r)
		}
	}
	n := int64(len(providerUsers))
	if st := c.settle(campaign, 20*time.Second); st.Sold != n || st.OrdersInDB != n || st.Remaining != 20-n {
		t.Fatalf("stats: got %+v, want %d sold and in MySQL", st, n)
	}
}
