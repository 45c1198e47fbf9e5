package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/lifecycle"
	"github.com/flashsale/flashsale/internal/testenv"
)

type orderBody struct {
	ID         string     `json:"id"`
	RequestID  string     `json:"request_id"`
	CampaignID string     `json:"campaign_id"`
	UserID     string     `json:"user_id"`
	Quantity   int64      `json:"quantity"`
	Amount     int64      `json:"amount"`
	Status     string     `json:"status"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	Code       string     `json:"code"`
}

type orderPageBody struct {
	Orders     []orderBody `json:"orders"`
	NextCursor string      `json:"next_cursor"`
}

type checkoutBody struct {
	OrderID   string     `json:"order_id"`
	Amount    int64      `json:"amount"`
	Provider  string     `json:"provider"`
	PayBy     *time.Time `json:"pay_by"`
	PaymentID string     `json:"payment_id"`
	Status    string     `json:"status"`
	Code      string     `json:"code"`
}

type paymentBody struct {
	ID      string `json:"payment_id"`
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
	Status  string `json:"status"`
	Code    string `json:"code"`
}

type paymentPageBody struct {
	Payments   []paymentBody `json:"payments"`
	NextCursor string        `json:"next_cursor"`
}

// buy purchases one unit for user and waits until its order is in MySQL.
func (c *client) buy(user, campaign string) orderBody {
	c.t.Helper()
	tok := c.token(user)
	var p purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", tok, `{"quantity":1}`, nil, &p); code != http.StatusAccepted {
		c.t.Fatalf("purchase by %s: got %d %q, want 202", user, code, p.Code)
	}
	var o orderBody
	testenv.Eventually(c.t, 20*time.Second, "the order of "+user, func() (bool, string) {
		code, r := c.poll(user, p.RequestID)
		switch {
		case code == http.StatusOK && r.Status == "success":
			// The result is final a moment before the worker's INSERT lands.
			return c.do("GET", "/api/v1/orders/"+r.OrderID, tok, nil, nil, &o) == http.StatusOK, "a success, its order not stored yet"
		case code == http.StatusOK && r.Status != "queued":
			c.t.Fatalf("purchase by %s: got %s (%s), want success", user, r.Status, r.Reason)
		}
		return false, fmt.Sprintf("%d %+v", code, r)
	})
	return o
}

// webhook posts a payment report signed with secret at ts.
func (c *client) webhook(secret string, ts time.Time, body string) (int, paymentBody) {
	c.t.Helper()
	var p paymentBody
	code := c.do("POST", gateway.WebhookPath, "", body,
		map[string]string{gateway.SignatureHeader: lifecycle.SignWebhook(secret, ts, []byte(body))}, &p)
	return code, p
}

func webhookBody(paymentID, orderID, status string, amount int64) string {
	return fmt.Sprintf(`{"payment_id":%q,"order_id":%q,"status":%q,"amount":%d}`, paymentID, orderID, status, amount)
}

// TestOrderRoutes walks the order lifecycle through real HTTP: a priced
// campaign, a shopper's orders (read, listed newest first page by page,
// paid with the fake provider, cancelled), a provider's webhook paying one
// and a late one recorded refund_required, and the admin's listings and
// refund, with the units back on sale after a cancel and a refund.
func TestOrderRoutes(t *testing.T) {
	c := startSystem(t, realConfig(t, "memqueue"))
	id := testenv.Name(t, "ord-")
	var created struct {
		Price         int64  `json:"price"`
		PaymentWindow string `json:"payment_window"`
	}
	body := campaignBody{ID: id, Name: "orders", Stock: 5, PerUserLimit: 2, Price: 250, PaymentWindow: "90s",
		StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)}
	if code := c.do("POST", "/admin/v1/campaigns", c.admin, body, nil, &created); code != http.StatusCreated || created.Price != 250 || created.PaymentWindow != "1m30s" {
		t.Fatalf("create: got %d %+v, want 201 with price 250 and payment_window 1m30s", code, created)
	}
	if code := c.do("POST", "/admin/v1/campaigns/"+id+"/preload", c.admin, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("preload: got %d", code)
	}
	var public struct {
		Price         int64  `json:"price"`
		PaymentWindow string `json:"payment_window"`
	}
	if code := c.do("GET", "/api/v1/campaigns/"+id, "", nil, nil, &public); code != http.StatusOK || public.Price != 250 || public.PaymentWindow != "1m30s" {
		t.Fatalf("public campaign: got %d %+v, want price 250 and payment_window 1m30s", code, public)
	}
	alice, bob := c.token("alice"), c.token("bob")

	paid := c.buy("alice", id)
	if paid.Status != "pending_payment" || paid.Amount != 250 || paid.UserID != "alice" || paid.ExpiresAt == nil ||
		paid.ExpiresAt.Sub(paid.CreatedAt) < 89*time.Second || paid.ExpiresAt.Sub(paid.CreatedAt) > 91*time.Second {
		t.Fatalf("new order: got %+v, want pending_payment, 250, alice's, expiring 90s after it was made", paid)
	}
	var o orderBody
	if code := c.do("GET", "/api/v1/orders/"+paid.ID, bob, nil, nil, &o); code != http.StatusNotFound || o.Code != "not_found" {
		t.Fatalf("someone else's order: got %d %q, want 404 not_found", code, o.Code)
	}
	var co checkoutBody
	if code := c.do("POST", "/api/v1/orders/"+paid.ID+"/pay", alice, nil, nil, &co); code != http.StatusOK ||
		co.Status != "paid" || co.Amount != 250 || co.Provider != "fake" || co.PaymentID == "" || co.PayBy == nil {
		t.Fatalf("pay: got %d %+v, want 200 paid 250 through the fake provider", code, co)
	}
	if code := c.do("POST", "/api/v1/orders/"+paid.ID+"/pay", alice, nil, nil, &co); code != http.StatusConflict || co.Code != "order_not_payable" {
		t.Fatalf("pay twice: got %d %q, want 409 order_not_payable", code, co.Code)
	}

	cancelled := c.buy("alice", id)
	for range 2 { // a retried cancel answers the same
		if code := c.do("POST", "/api/v1/orders/"+cancelled.ID+"/cancel", alice, nil, nil, &o); code != http.StatusOK || o.Status != "cancelled" {
			t.Fatalf("cancel: got %d %+v, want 200 cancelled", code, o)
		}
	}
	if st := c.stats(id); st.Remaining != 4 {
		t.Fatalf("after a cancel: got remaining %d, want 4 (the cancelled unit back on sale)", st.Remaining)
	}

	var page orderPageBody
	if code := c.do("GET", "/api/v1/orders?limit=1", alice, nil, nil, &page); code != http.StatusOK ||
		len(page.Orders) != 1 || page.Orders[0].ID != cancelled.ID || page.NextCursor == "" {
		t.Fatalf("first page: got %d %+v, want the newer order and a cursor", code, page)
	}
	cursor := page.NextCursor
	page = orderPageBody{}
	if code := c.do("GET", "/api/v1/orders?limit=1&cursor="+cursor, alice, nil, nil, &page); code != http.StatusOK ||
		len(page.Orders) != 1 || page.Orders[0].ID != paid.ID || page.NextCursor != "" {
		t.Fatalf("second page: got %d %+v, want the older order and no cursor", code, page)
	}
	page = orderPageBody{}
	if code := c.do("GET", "/api/v1/orders", bob, nil, nil, &page); code != http.StatusOK || len(page.Orders) != 0 {
		t.Fatalf("bob's orders: got %d %+v, want none", code, page)
	}

	// A provider's webhook pays carol's order; the same delivery again
	// changes nothing.
	carol := c.buy("carol", id)
	report := webhookBody("pay_carol_1", carol.ID, "succeeded", 250)
	for range 2 {
		if code, p := c.webhook(testWebhookSecret, time.Now(), report); code != http.StatusOK || p.Status != "succeeded" || p.OrderID != carol.ID {
			t.Fatalf("webhook: got %d %+v, want 200 succeeded", code, p)
		}
	}
	// A payment for dan's order after he cancelled it is recorded for a
	// refund; the order stays cancelled.
	dan := c.buy("dan", id)
	if code := c.do("POST", "/api/v1/orders/"+dan.ID+"/cancel", c.token("dan"), nil, nil, &o); code != http.StatusOK {
		t.Fatalf("cancel dan's: got %d", code)
	}
	if code, p := c.webhook(testWebhookSecret, time.Now(), webhookBody("pay_dan_1", dan.ID, "succeeded", 250)); code != http.StatusOK || p.Status != "refund_required" {
		t.Fatalf("late webhook: got %d %+v, want 200 refund_required", code, p)
	}

	page = orderPageBody{}
	if code := c.do("GET", "/admin/v1/campaigns/"+id+"/orders?status=paid", c.admin, nil, nil, &page); code != http.StatusOK ||
		len(page.Orders) != 2 || page.Orders[0].ID != carol.ID || page.Orders[1].ID != paid.ID {
		t.Fatalf("paid orders: got %d %+v, want carol's then alice's", code, page)
	}
	var payments paymentPageBody
	if code := c.do("GET", "/admin/v1/payments?status=refund_required", c.admin, nil, nil, &payments); code != http.StatusOK ||
		len(payments.Payments) != 1 || payments.Payments[0].ID != "pay_dan_1" {
		t.Fatalf("refunds due: got %d %+v, want dan's payment", code, payments)
	}
	if code := c.do("POST", "/admin/v1/orders/"+paid.ID+"/refund", c.admin, nil, nil, &o); code != http.StatusOK || o.Status != "refunded" {
		t.Fatalf("refund: got %d %+v, want 200 refunded", code, o)
	}
	// Sold: alice's refunded, carol's paid; cancelled: alice's second, dan's.
	if st := c.stats(id); st.Remaining != 4 || st.Sold != 1 {
		t.Fatalf("at the end: got remaining %d, sold %d; want 4, 1", st.Remaining, st.Sold)
	}
}
