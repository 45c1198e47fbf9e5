package lifecycle

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/wire"
	"github.com/flashsale/flashsale/model"
)

// Pay starts paying a shopper's pending order. With ProviderFake the
// payment completes at once, through the same path as a provider's
// webhook. Another shopper's order is model.ErrNotFound; one no longer
// pending, or whose window has passed, is model.ErrNotPayable.
func (s *Service) Pay(ctx context.Context, userID, orderID string) (model.Checkout, error) {
	o, err := s.Order(ctx, userID, orderID)
	if err != nil {
		return model.Checkout{}, err
	}
	now := s.opts.Now()
	if o.Status != model.OrderPendingPayment || (!o.ExpiresAt.IsZero() && !now.Before(o.ExpiresAt)) {
		return model.Checkout{}, fmt.Errorf("pay order %s (%s): %w", orderID, o.Status, model.ErrNotPayable)
	}
	c := model.Checkout{OrderID: o.ID, Amount: o.Amount, Provider: s.opts.Provider, PayBy: o.ExpiresAt, Status: o.Status}
	if s.opts.Provider != ProviderFake {
		return c, nil
	}
	if s.opts.WebhookSecret == "" {
		return model.Checkout{}, errors.New("pay: the fake provider needs payment.webhook_secret")
	}
	body, err := json.Marshal(webhookBody{PaymentID: "fake_" + randomHex(12), OrderID: o.ID,
		Status: model.PaymentSucceeded, Amount: &o.Amount})
	if err != nil {
		return model.Checkout{}, fmt.Errorf("pay order %s: %w", orderID, err)
	}
	p, err := s.HandleWebhook(ctx, SignWebhook(s.opts.WebhookSecret, now, body), body, now)
	if err != nil {
		return model.Checkout{}, fmt.Errorf("pay order %s: %w", orderID, err)
	}
	if p.Status != model.PaymentSucceeded {
		// It expired or was cancelled between the check and the payment.
		return model.Checkout{}, fmt.Errorf("pay order %s: payment %s is %s: %w", orderID, p.ID, p.Status, model.ErrNotPayable)
	}
	c.PaymentID, c.Status = p.ID, model.OrderPaid
	return c, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// webhookBody is the provider's report of one payment.
type webhookBody struct {
	PaymentID string              `json:"payment_id"`
	OrderID   string              `json:"order_id"`
	Status    model.PaymentStatus `json:"status"`
	Amount    *int64              `json:"amount"` // required: 0 is an amount
}

// SignWebhook returns the signature header of a webhook body sent at t:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">", Stripe's form.
func SignWebhook(secret string, t time.Time, body []byte) string {
	ts := t.Unix()
	return "t=" + strconv.FormatInt(ts, 10) + ",v1=" + hex.EncodeToString(webhookMAC(secret, ts, body))
}

func webhookMAC(secret string, ts int64, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(strconv.AppendInt(nil, ts, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// verify checks a webhook's signature header. Any v1 signature may match
// (a provider rotating its secret sends two). The timestamp is checked
// after the signature, so only an authentic message learns it is stale.
func (s *Service) verify(header string, body []byte, now time.Time) error {
	if s.opts.WebhookSecret == "" {
		return model.ErrBadSignature
	}
	var (
		ts    int64
		haveT bool
		sigs  [][]byte
	)
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			n, err := strconv.ParseInt(v, 10, 64)
			ts, haveT = n, err == nil
		case "v1":
			if sig, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	if !haveT || len(sigs) == 0 {
		return model.ErrBadSignature
	}
	want := webhookMAC(s.opts.WebhookSecret, ts, body)
	ok := false
	for _, sig := range sigs {
		ok = hmac.Equal(sig, want) || ok // constant time, and every one compared
	}
	if !ok {
		return model.ErrBadSignature
	}
	if d := now.Sub(time.Unix(ts, 0)); d > s.opts.Tolerance || d < -s.opts.Tolerance {
		return model.ErrStaleSignature
	}
	return nil
}

// decodeWebhook reads a webhook body strictly and checks its fields.
func decodeWebhook(body []byte) (model.Payment, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var w webhookBody
	if err := dec.Decode(&w); err != nil {
		return model.Payment{}, model.Invalid("", "malformed webhook body")
	}
	if len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) > 0 {
		return model.Payment{}, model.Invalid("", "trailing data after webhook body")
	}
	if err := wire.CheckKeys(body, reflect.TypeFor[webhookBody]()); err != nil {
		var ke *wire.KeyError
		if errors.As(err, &ke) {
			return model.Payment{}, model.Invalid(ke.Key, ke.Reason())
		}
		return model.Payment{}, model.Invalid("", "malformed webhook body")
	}
	switch {
	case !model.ValidPaymentID(w.PaymentID):
		return model.Payment{}, model.Invalid("payment_id", "must match [A-Za-z0-9_.@:-]{1,128}")
	case !model.ValidOrderID(w.OrderID):
		return model.Payment{}, model.Invalid("order_id", "must match [A-Za-z0-9_-]{1,64}")
	case w.Status != model.PaymentSucceeded && w.Status != model.PaymentFailed:
		return model.Payment{}, model.Invalid("status", "must be succeeded or failed")
	case w.Amount == nil || *w.Amount < 0:
		return model.Payment{}, model.Invalid("amount", "is required, at least 0")
	}
	return model.Payment{ID: w.PaymentID, OrderID: w.OrderID, Status: w.Status, Amount: *w.Amount}, nil
}

// HandleWebhook records a payment provider's report, signed as SignWebhook
// signs: header is the signature header, body the request body as sent.
// It is idempotent per payment id: a delivery repeating a recorded payment
// returns it and changes nothing; one that names the same payment id with
// other details is model.ErrPaymentConflict. A success pays its pending
// order; a success for an order already expired or cancelled leaves the
// order as it is and is recorded refund_required. Refusals change nothing:
// model.ErrBadSignature (unsigned, forged), model.ErrStaleSignature
// (timestamp off by more than the tolerance), *model.InvalidError (body),
// model.ErrNotFound (unknown order), model.ErrAmountMismatch (not the
// order's amount).
func (s *Service) HandleWebhook(ctx context.Context, header string, body []byte, now time.Time) (model.Payment, error) {
	if err := s.verify(header, body, now); err != nil {
		return model.Payment{}, err
	}
	p, err := decodeWebhook(body)
	if err != nil {
		return model.Payment{}, err
	}
	o, err := s.db.Order(ctx, p.OrderID)
	if err != nil {
		return model.Payment{}, fmt.Errorf("payment %s: %w", p.ID, err)
	}
	if p.Amount != o.Amount {
		return model.Payment{}, fmt.Errorf("payment %s of %d for order %s of %d: %w", p.ID, p.Amount, o.ID, o.Amount, model.ErrAmountMismatch)
	}
	p.CreatedAt = now
	stored, created, err := s.db.RecordPayment(ctx, p)
	if err != nil {
		return model.Payment{}, err
	}
	if !created && !samePayment(stored, p) {
		return model.Payment{}, fmt.Errorf("payment %s: %w", p.ID, model.ErrPaymentConflict)
	}
	if created && stored.Status == model.PaymentRefundRequired {
		s.log.Warn("late payment: refund required", "order_id", o.ID, "payment_id", p.ID)
		if s.opts.LatePayments != nil {
			s.opts.LatePayments.Inc()
		}
	}
	return stored, nil
}

// samePayment reports whether a delivery repeats the stored payment: a
// success stored refund_required is the same success, come late.
func samePayment(stored, p model.Payment) bool {
	status := stored.Status
	if status == model.PaymentRefundRequired {
		status = model.PaymentSucceeded
	}
	return stored.OrderID == p.OrderID && stored.Amount == p.Amount && status == p.Status
}
