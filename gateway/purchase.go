package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"

	"github.com/gin-gonic/gin"
	"github.com/sony/gobreaker/v2"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/wire"
	"github.com/flashsale/flashsale/model"
)

// The purchase route, from the request to the answer: the handler, its body
// decoder and answer writer, and the one service call between them. It is
// the one hot route — every shopper of a sale calls it — so its body and its
// answer skip encoding/json's reflection in the common case. Anything but
// the common case goes through the generic code, so the inputs taken, the
// errors and the bytes written stay exactly those of httpapi.DecodeJSON and
// gin's JSON renderer (tested and fuzzed in purchase_test.go). What happens
// to an admitted purchase next (coalesced Redis call and publish) is in
// admit.go.

// Paths of the purchase route, and of what its answer points to (served by
// the notifier).
const (
	purchasePath = "/api/v1/campaigns/:id/purchases"
	pollPath     = "/api/v1/purchases/"
	wsPath       = "/api/v1/ws"
)

type purchaseRequest struct {
	Quantity *int64 `json:"quantity"`
}

type purchaseResponse struct {
	RequestID string       `json:"request_id"`
	Status    model.Status `json:"status"`
	OrderID   string       `json:"order_id,omitempty"`
	Reason    string       `json:"reason,omitempty"`
	PollURL   string       `json:"poll_url"`
	WSURL     string       `json:"ws_url"`
}

func (h *Handlers) purchase(c *gin.Context, userID string) {
	adm, err := h.svc.Purchase(c.Request.Context(),
		Purchase{UserID: userID, CampaignID: c.Param("id"), IdempotencyKey: c.GetHeader("Idempotency-Key"),
			Challenge: c.GetHeader(challengeHeader), DeviceID: cut(c.GetHeader(deviceHeader), maxDeviceID),
			UserAgent: cut(c.Request.UserAgent(), maxDeviceID)},
		func() (int64, string, error) {
			qty, err := decodePurchaseBody(c)
			return qty, c.ClientIP(), err
		})
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	writePurchaseAnswer(c, adm)
}

// Purchase is a shopper's request to buy.
type Purchase struct {
	UserID         string
	CampaignID     string
	Quantity       int64
	IdempotencyKey string
	// ClientIP is the shopper's address as the HTTP layer determined it
	// (trusted proxies only); "" skips the per-IP limit.
	ClientIP string
	// Challenge is the solved challenge a gated campaign asks for
	// (challenge.go).
	Challenge string
	// DeviceID and UserAgent are for the risk check only (risk.go).
	DeviceID, UserAgent string

	// tag is the shopper's bucket's tag (model.UserTag), set once the
	// campaign is known: their request's keys and queue partition.
	tag string
	// buckets is the campaign's bucket count: the campaign rate limit is
	// shared among them (model.RateLimits.PerBucket).
	buckets int
}

// cut returns s, or its first n bytes.
func cut(s string, n int) string { return s[:min(len(s), n)] }

var idempotencyKeyPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// Admitted is the answer to an admitted purchase.
type Admitted struct {
	RequestID string
	// Existing is true when the idempotency key matched an earlier request.
	Existing bool
	// Result is, when Existing, the earlier request's result as it stands:
	// queued, or final once a worker decided it. A new request decided at
	// once (in MySQL, while Redis is out: degraded.go) carries its final
	// result too.
	Result model.Result
}

// Purchase admits a purchase, cheapest checks first, and enqueues it. p
// holds what the request line and headers say (user, campaign,
// Idempotency-Key); read, unless nil, completes it from the body and the
// connection: its quantity and client IP replace p's. Most purchases of a
// flash sale end at the sold-out flag, so a cached, open, sold-out campaign
// refuses a purchase without an Idempotency-Key before read is called: its
// body is never read. With a key, the earlier request may have succeeded,
// so it goes on.
func (s *Service) Purchase(ctx context.Context, p Purchase, read func() (quantity int64, clientIP string, err error)) (Admitted, error) {
	if p.IdempotencyKey == "" && s.soldOutEarly(p.CampaignID) {
		return Admitted{}, s.refuse("sold_out", model.ErrSoldOut)
	}
	if read != nil {
		var err error
		if p.Quantity, p.ClientIP, err = read(); err != nil {
			return Admitted{}, err
		}
	}
	if !model.ValidCampaignID(p.CampaignID) {
		return Admitted{}, s.refuse("not_found", model.ErrNotFound)
	}
	if p.Quantity < 1 || p.Quantity > model.MaxQuantity {
		return Admitted{}, s.refuse("invalid", model.Invalid("quantity", fmt.Sprintf("must be between 1 and %d", model.MaxQuantity)))
	}
	if p.IdempotencyKey != "" && !idempotencyKeyPattern.MatchString(p.IdempotencyKey) {
		return Admitted{}, s.refuse("invalid", model.Invalid("Idempotency-Key", "must match [A-Za-z0-9_.:-]{1,64}"))
	}
	cc, c, err := s.campaign(ctx, p.CampaignID)
	if err != nil {
		return Admitted{}, s.refuse("campaign", err)
	}
	p.tag, p.buckets = model.UserTag(c, p.UserID), c.Buckets
	if p.Quantity > c.PerUserLimit {
		return Admitted{}, s.refuse("invalid", model.Invalid("quantity", fmt.Sprintf("exceeds the per-user limit of %d", c.PerUserLimit)))
	}
	if err := s.judge(ctx, p); err != nil {
		return Admitted{}, err
	}
	if s.inMySQL(c.ID) {
		return s.purchaseInMySQL(ctx, cc, c, p)
	}
	pass, err := s.verifyChallenge(p, c)
	if err != nil {
		return Admitted{}, err
	}
	if err := c.Window(s.opts.Now()); err != nil {
		return s.earlierOr(ctx, p, "window", err)
	}
	if c.Paused {
		return s.earlierOr(ctx, p, "paused", model.ErrPaused)
	}
	if cc.soldOut.Load() {
		return s.earlierOr(ctx, p, "sold_out", model.ErrSoldOut)
	}
	// While the queue is known to be down, refuse before writing anything
	// to Redis: nothing to withdraw, and the shopper learns it at once. The
	// publishes that opened the breaker may have kept their requests (an
	// unknown outcome): a retry of one gets it back.
	if s.breaker.State() == gobreaker.StateOpen {
		return s.earlierOr(ctx, p, "queue_down", fmt.Errorf("queue: %w: circuit open", model.ErrUnavailable))
	}
	return s.enqueue(ctx, p, pass)
}

// earlierOr answers p with the request its Idempotency-Key names, if any,
// and refuses it with err (counted under reason) otherwise.
func (s *Service) earlierOr(ctx context.Context, p Purchase, reason string, err error) (Admitted, error) {
	if adm, ok, eerr := s.earlier(ctx, p); ok || eerr != nil {
		return adm, eerr
	}
	return Admitted{}, s.refuse(reason, err)
}

// earlier returns the request p's Idempotency-Key already names, if any,
// where a purchase is about to be refused without admit.lua (sold out,
// queue down, the sale over or paused): a shopper
// repeating a request whose answer it lost must get that request back, as
// it stands now, not a refusal, since it may well succeed. The same key
// with another body is refused as admit.lua refuses it.
func (s *Service) earlier(ctx context.Context, p Purchase) (Admitted, bool, error) {
	if p.IdempotencyKey == "" {
		return Admitted{}, false, nil
	}
	a, ok, err := s.stock.IdempotentRequest(ctx, model.AdmitRequest{CampaignID: p.CampaignID, Tag: p.tag, UserID: p.UserID,
		Quantity: p.Quantity, IdempotencyKey: p.IdempotencyKey})
	if err != nil {
		return Admitted{}, false, s.refuse("unavailable", err)
	}
	if !ok {
		return Admitted{}, false, nil
	}
	if a.Code == model.AdmitKeyReused {
		return Admitted{}, true, s.refuse("idempotency_key_reused", model.ErrIdempotencyKeyReused)
	}
	return Admitted{RequestID: a.RequestID, Existing: true, Result: a.Result}, true, nil
}

// soldOutEarly reports whether campaignID is cached, open and sold out. It
// never loads anything, so it costs a map lookup; false means Purchase
// decides the long way.
func (s *Service) soldOutEarly(campaignID string) bool {
	cc := s.cache.get(campaignID)
	if cc == nil || !cc.soldOut.Load() {
		return false
	}
	snap := cc.snap.Load()
	now := s.opts.Now()
	return s.fresh(snap, now) && snap.err == nil && snap.campaign.Window(now) == nil
}

// decodePurchaseBody returns the quantity of a purchase body; an absent
// quantity is 1. Errors are httpapi.DecodeJSON's.
func decodePurchaseBody(c *gin.Context) (int64, error) {
	// Bodies are tiny; a read that fills buf falls back to the decoder with
	// what was read put back in front of the rest.
	buf := make([]byte, 64)
	n, err := io.ReadFull(c.Request.Body, buf)
	var rest io.Reader
	switch err {
	case io.EOF, io.ErrUnexpectedEOF: // the whole body is in buf[:n]
		if q, ok := fastQuantity(buf[:n]); ok {
			return q, nil
		}
		rest = bytes.NewReader(buf[:n])
	default: // full buffer, or a read error (MaxBytesReader repeats it)
		rest = io.MultiReader(bytes.NewReader(buf[:n]), c.Request.Body)
	}
	var req purchaseRequest
	if err := httpapi.DecodeJSONFrom(rest, &req); err != nil {
		return 0, err
	}
	if req.Quantity == nil {
		return 1, nil
	}
	return *req.Quantity, nil
}

// fastQuantity reads the body with wire.Decoder: {} or an object whose
// one member is an integer "quantity"; ok is false for anything else, which
// the strict decoder then judges.
func fastQuantity(b []byte) (q int64, ok bool) {
	q = 1
	d := wire.NewDecoder(b)
	ok = d.Members(func(key string) (uint16, bool) {
		if key != "quantity" {
			return 0, false
		}
		var ok bool
		q, ok = d.Int()
		return 1, ok
	})
	return q, ok
}

// writePurchaseAnswer writes the answer to an admitted purchase: 202 and
// queued for a new request, 200 and the request's result as it stands for
// an earlier one (a replay, rare, takes gin's renderer). A new request
// decided at once (in MySQL) is 202 with its final result, as a replay's
// (gin's renderer too). A queued request's answer is the bytes
// c.JSON(http.StatusAccepted, purchaseResponse{…}) writes, built without
// reflection when the request id needs no JSON escaping (ours never do; a
// value from elsewhere takes gin's renderer).
func writePurchaseAnswer(c *gin.Context, adm Admitted) {
	requestID := adm.RequestID
	if adm.Existing || adm.Result.Status.Final() {
		status := http.StatusAccepted
		if adm.Existing {
			status = http.StatusOK
		}
		c.JSON(status, purchaseResponse{RequestID: requestID, Status: adm.Result.Status,
			OrderID: adm.Result.OrderID, Reason: adm.Result.Reason, PollURL: pollPath + requestID, WSURL: wsPath})
		return
	}
	if !wire.JSONSafe(requestID) {
		c.JSON(http.StatusAccepted, purchaseResponse{RequestID: requestID, Status: model.StatusQueued,
			PollURL: pollPath + requestID, WSURL: wsPath})
		return
	}
	b := make([]byte, 0, 96+2*len(requestID))
	b = append(b, `{"request_id":"`...)
	b = append(b, requestID...)
	b = append(b, `","status":"`+model.StatusQueued+`","poll_url":"`+pollPath...)
	b = append(b, requestID...)
	b = append(b, `","ws_url":"`+wsPath+`"}`...)
	httpapi.WriteJSON(c, http.StatusAccepted, b)
}
