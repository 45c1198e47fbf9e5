package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/model"
)

// The order routes: what follows a success. A shopper lists, reads, pays
// and cancels their own orders (anyone else's is 404, like an unknown one),
// the payment provider reports payments through a signed webhook, and an
// admin lists a campaign's orders and the payments, and refunds. Every
// handler binds, calls one Orders method and writes the answer; the
// lifecycle (internal/lifecycle) decides.

// Orders is what the order routes need of the order lifecycle
// (lifecycle.Service), one method per route.
type Orders interface {
	Order(ctx context.Context, userID, orderID string) (model.Order, error)
	UserOrders(ctx context.Context, userID, cursor string, limit int) ([]model.Order, string, error)
	Cancel(ctx context.Context, userID, orderID string) (model.Order, error)
	Pay(ctx context.Context, userID, orderID string) (model.Checkout, error)
	HandleWebhook(ctx context.Context, header string, body []byte, now time.Time) (model.Payment, error)
	CampaignOrders(ctx context.Context, campaignID string, status model.OrderStatus, cursor string, limit int) ([]model.Order, string, error)
	Refund(ctx context.Context, orderID string) (model.Order, error)
	Payments(ctx context.Context, status model.PaymentStatus, cursor string, limit int) ([]model.Payment, string, error)
}

// WebhookPath is where the payment provider posts its reports, and
// SignatureHeader the header that carries their signature:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">" keyed with
// payment.webhook_secret (Stripe's scheme).
const (
	WebhookPath     = "/webhooks/payments"
	SignatureHeader = "Flashsale-Signature"
)

// OrderHandlers are the order routes.
type OrderHandlers struct {
	log    *slog.Logger
	orders Orders
	now    func() time.Time
}

// NewOrderHandlers returns the order routes over orders.
func NewOrderHandlers(log *slog.Logger, orders Orders) *OrderHandlers {
	return &OrderHandlers{log: log, orders: orders, now: time.Now}
}

// RegisterShopper mounts a shopper's order routes; shopper wraps a handler
// in the JWT check (httpapi.Shopper).
func (h *OrderHandlers) RegisterShopper(r gin.IRouter, shopper func(httpapi.ShopperHandler) gin.HandlerFunc) {
	r.GET("/api/v1/orders", shopper(h.list))
	r.GET("/api/v1/orders/:order", shopper(h.get))
	r.POST("/api/v1/orders/:order/cancel", shopper(h.cancel))
	r.POST("/api/v1/orders/:order/pay", shopper(h.pay))
}

// RegisterWebhook mounts the payment provider's webhook. It takes no token:
// the signature authenticates it.
func (h *OrderHandlers) RegisterWebhook(r gin.IRouter) {
	r.POST(WebhookPath, h.webhook)
}

// RegisterAdmin mounts the admin's order routes; admin is the admin-token
// middleware.
func (h *OrderHandlers) RegisterAdmin(r gin.IRouter, admin gin.HandlerFunc) {
	g := r.Group("/admin/v1", admin)
	g.GET("/campaigns/:id/orders", h.campaignOrders)
	g.POST("/orders/:order/refund", h.refund)
	g.GET("/payments", h.payments)
}

type orderResponse struct {
	ID         string            `json:"id"`
	RequestID  string            `json:"request_id"`
	CampaignID string            `json:"campaign_id"`
	UserID     string            `json:"user_id"`
	Quantity   int64             `json:"quantity"`
	Amount     int64             `json:"amount"`
	Status     model.OrderStatus `json:"status"`
	CreatedAt  time.Time         `json:"created_at"`
	UpdatedAt  time.Time         `json:"updated_at"`
	ExpiresAt  *time.Time        `json:"expires_at,omitempty"` // none on orders from before payment windows
}

func toOrderResponse(o model.Order) orderResponse {
	return orderResponse{ID: o.ID, RequestID: o.RequestID, CampaignID: o.CampaignID, UserID: o.UserID,
		Quantity: o.Quantity, Amount: o.Amount, Status: o.Status, CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt,
		ExpiresAt: timeOrNil(o.ExpiresAt)}
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

type orderPage struct {
	Orders     []orderResponse `json:"orders"`
	NextCursor string          `json:"next_cursor,omitempty"` // "" after the last page
}

func toOrderPage(orders []model.Order, next string) orderPage {
	out := orderPage{Orders: make([]orderResponse, len(orders)), NextCursor: next}
	for i, o := range orders {
		out.Orders[i] = toOrderResponse(o)
	}
	return out
}

type checkoutResponse struct {
	OrderID  string     `json:"order_id"`
	Amount   int64      `json:"amount"`
	Provider string     `json:"provider"`
	PayBy    *time.Time `json:"pay_by,omitempty"`
	// PaymentID is set when the payment completed at once (the fake
	// provider); Status is then paid.
	PaymentID string            `json:"payment_id,omitempty"`
	Status    model.OrderStatus `json:"status"`
}

type paymentResponse struct {
	ID        string              `json:"payment_id"`
	OrderID   string              `json:"order_id"`
	Amount    int64               `json:"amount"`
	Status    model.PaymentStatus `json:"status"`
	CreatedAt time.Time           `json:"created_at"`
}

func toPaymentResponse(p model.Payment) paymentResponse {
	return paymentResponse{ID: p.ID, OrderID: p.OrderID, Amount: p.Amount, Status: p.Status, CreatedAt: p.CreatedAt}
}

type paymentPage struct {
	Payments   []paymentResponse `json:"payments"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// pageQuery reads a listing's cursor and limit (0 when absent: the
// default page).
func pageQuery(c *gin.Context) (cursor string, limit int, err error) {
	if s := c.Query("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil {
			return "", 0, model.Invalid("limit", "must be a whole number")
		}
	}
	return c.Query("cursor"), limit, nil
}

func (h *OrderHandlers) list(c *gin.Context, userID string) {
	cursor, limit, err := pageQuery(c)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	orders, next, err := h.orders.UserOrders(c.Request.Context(), userID, cursor, limit)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toOrderPage(orders, next))
}

func (h *OrderHandlers) get(c *gin.Context, userID string) {
	o, err := h.orders.Order(c.Request.Context(), userID, c.Param("order"))
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toOrderResponse(o))
}

func (h *OrderHandlers) cancel(c *gin.Context, userID string) {
	o, err := h.orders.Cancel(c.Request.Context(), userID, c.Param("order"))
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toOrderResponse(o))
}

func (h *OrderHandlers) pay(c *gin.Context, userID string) {
	co, err := h.orders.Pay(c.Request.Context(), userID, c.Param("order"))
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, checkoutResponse{OrderID: co.OrderID, Amount: co.Amount, Provider: co.Provider,
		PayBy: timeOrNil(co.PayBy), PaymentID: co.PaymentID, Status: co.Status})
}

// webhook hands the body to the lifecycle exactly as sent: the signature
// covers its bytes. A late payment (its order expired or was cancelled) is
// answered 200 too, as refund_required: the provider must not retry it.
func (h *OrderHandlers) webhook(c *gin.Context) {
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			err = model.ErrBodyTooLarge
		}
		httpapi.Abort(c, h.log, err)
		return
	}
	p, err := h.orders.HandleWebhook(c.Request.Context(), c.GetHeader(SignatureHeader), body, h.now())
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toPaymentResponse(p))
}

func (h *OrderHandlers) campaignOrders(c *gin.Context) {
	cursor, limit, err := pageQuery(c)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	orders, next, err := h.orders.CampaignOrders(c.Request.Context(), c.Param("id"), model.OrderStatus(c.Query("status")), cursor, limit)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toOrderPage(orders, next))
}

func (h *OrderHandlers) refund(c *gin.Context) {
	o, err := h.orders.Refund(c.Request.Context(), c.Param("order"))
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toOrderResponse(o))
}

func (h *OrderHandlers) payments(c *gin.Context) {
	cursor, limit, err := pageQuery(c)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	ps, next, err := h.orders.Payments(c.Request.Context(), model.PaymentStatus(c.Query("status")), cursor, limit)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	out := paymentPage{Payments: make([]paymentResponse, len(ps)), NextCursor: next}
	for i, p := range ps {
		out.Payments[i] = toPaymentResponse(p)
	}
	c.JSON(http.StatusOK, out)
}
