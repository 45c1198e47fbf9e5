package lifecycle

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flashsale/flashsale/model"
)

// TestWebhookRefusals: every bad webhook gets its exact error and changes
// nothing: not the order, not the payments, not Redis.
func TestWebhookRefusals(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		o := b.sell(t, "alice", 2, later())
		now := time.Now()
		// A payment recorded first, whose id the replays reuse.
		paid := b.sell(t, "bob", 1, later())
		first := webhook(paid.ID, "pi_first", model.PaymentSucceeded, 500)
		if _, err := b.svc.HandleWebhook(t.Context(), SignWebhook(testSecret, now, first), first, now); err != nil {
			t.Fatalf("first webhook: %v", err)
		}
		good := webhook(o.ID, "pi_1", model.PaymentSucceeded, 1000)
		ts := now.Unix()
		sign := func(body []byte) string { return SignWebhook(testSecret, now, body) }

		type row struct {
			name    string
			header  string
			body    []byte
			wantErr error
			field   string // for an InvalidError
		}
		signed := func(name string, body []byte, wantErr error, field string) row {
			return row{name: name, header: sign(body), body: body, wantErr: wantErr, field: field}
		}
		tests := []row{
			{name: "unsigned", header: "", body: good, wantErr: model.ErrBadSignature},
			{name: "forged", header: SignWebhook("not the secret", now, good), body: good, wantErr: model.ErrBadSignature},
			{name: "body changed after signing", header: sign(good), body: webhook(o.ID, "pi_1", model.PaymentSucceeded, 1), wantErr: model.ErrBadSignature},
			{name: "timestamp changed after signing", header: "t=" + strconv.FormatInt(ts-1, 10) + ",v1=" + signature(sign(good)), body: good, wantErr: model.ErrBadSignature},
			{name: "no timestamp", header: "v1=" + signature(sign(good)), body: good, wantErr: model.ErrBadSignature},
			{name: "not hex", header: "t=" + strconv.FormatInt(ts, 10) + ",v1=zz", body: good, wantErr: model.ErrBadSignature},
			{name: "expired timestamp", header: SignWebhook(testSecret, now.Add(-6*time.Minute), good), body: good, wantErr: model.ErrStaleSignature},
			{name: "future timestamp", header: SignWebhook(testSecret, now.Add(6*time.Minute), good), body: good, wantErr: model.ErrStaleSignature},
			signed("replayed payment id for another order", webhook(o.ID, "pi_first", model.PaymentSucceeded, 1000), model.ErrPaymentConflict, ""),
			signed("replayed payment id as failed", webhook(paid.ID, "pi_first", model.PaymentFailed, 500), model.ErrPaymentConflict, ""),
			signed("amount mismatch", webhook(o.ID, "pi_2", model.PaymentSucceeded, 999), model.ErrAmountMismatch, ""),
			signed("unknown order", webhook("no-such-order", "pi_3", model.PaymentSucceeded, 1000), model.ErrNotFound, ""),
			signed("provider cannot say refund_required", webhook(o.ID, "pi_4", model.PaymentRefundRequired, 1000), nil, "status"),
			signed("no amount", []byte(`{"payment_id":"pi_5","order_id":"`+o.ID+`","status":"succeeded"}`), nil, "amount"),
			signed("negative amount", webhook(o.ID, "pi_6", model.PaymentSucceeded, -1), nil, "amount"),
			signed("bad payment id", webhook(o.ID, "pi 7", model.PaymentSucceeded, 1000), nil, "payment_id"),
			signed("unknown field", []byte(`{"payment_id":"pi_8","order_id":"`+o.ID+`","status":"succeeded","amount":1000,"x":1}`), nil, ""),
			signed("not json", []byte(`{`), nil, ""),
			signed("trailing bracket", append(webhook(o.ID, "pi_9", model.PaymentSucceeded, 1000), ']'), nil, ""),
			signed("amount in another case", []byte(`{"payment_id":"pi_10","order_id":"`+o.ID+`","status":"succeeded","Amount":1000}`), nil, "Amount"),
			signed("repeated amount", []byte(`{"payment_id":"pi_11","order_id":"`+o.ID+`","status":"succeeded","amount":1,"amount":1000}`), nil, "amount"),
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				header := tc.header
				ordersBefore := []model.Order{b.order(t, o.ID), b.order(t, paid.ID)}
				paymentsBefore, redisBefore := b.payments(t), b.redis(t, "alice", "bob")

				p, err := b.svc.HandleWebhook(t.Context(), header, tc.body, now)
				var inv *model.InvalidError
				switch {
				case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
					t.Fatalf("got %+v, %v; want %v", p, err, tc.wantErr)
				case tc.wantErr == nil && (!errors.As(err, &inv) || inv.Field != tc.field):
					t.Fatalf("got %+v, %v; want an InvalidError on %q", p, err, tc.field)
				}
				ordersAfter := []model.Order{b.order(t, o.ID), b.order(t, paid.ID)}
				if !reflect.DeepEqual(ordersAfter, ordersBefore) || !reflect.DeepEqual(b.payments(t), paymentsBefore) ||
					!reflect.DeepEqual(b.redis(t, "alice", "bob"), redisBefore) {
					t.Fatalf("a refused webhook changed something")
				}
			})
		}

		// With no secret configured every webhook is refused.
		b.svc.opts.WebhookSecret = ""
		if _, err := b.svc.HandleWebhook(t.Context(), SignWebhook("", now, good), good, now); !errors.Is(err, model.ErrBadSignature) {
			t.Fatalf("no secret: got %v, want %v", err, model.ErrBadSignature)
		}
	})
}

// signature is the v1 part of a signature header.
func signature(header string) string {
	_, sig, _ := strings.Cut(header, ",v1=")
	return sig
}

// TestWebhookIdempotent: concurrent deliveries of one payment record it
// once and all get the same answer; a signature with a rotated secret's
// second v1 is accepted; a failed payment leaves the order payable.
func TestWebhookIdempotent(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		o := b.sell(t, "alice", 1, later())
		now := time.Now()

		failed := webhook(o.ID, "pi_declined", model.PaymentFailed, 500)
		p, err := b.svc.HandleWebhook(t.Context(), SignWebhook(testSecret, now, failed), failed, now)
		if err != nil || p.Status != model.PaymentFailed || b.order(t, o.ID).Status != model.OrderPendingPayment {
			t.Fatalf("failed payment: got %+v, %v; want recorded failed, order pending", p, err)
		}

		body := webhook(o.ID, "pi_ok", model.PaymentSucceeded, 500)
		header := SignWebhook("old secret", now, body) + ",v1=" + signature(SignWebhook(testSecret, now, body))
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			answers []model.Payment
		)
		for range 8 {
			wg.Go(func() {
				p, err := b.svc.HandleWebhook(t.Context(), header, body, now)
				if err != nil {
					t.Errorf("delivery: %v", err)
					return
				}
				mu.Lock()
				answers = append(answers, p)
				mu.Unlock()
			})
		}
		wg.Wait()
		for _, a := range answers {
			if a != answers[0] || a.Status != model.PaymentSucceeded {
				t.Fatalf("got answers %+v, want one succeeded payment", answers)
			}
		}
		if got := b.order(t, o.ID).Status; got != model.OrderPaid || len(b.payments(t)) != 2 {
			t.Fatalf("got order %s and %d payments, want paid and 2", got, len(b.payments(t)))
		}
	})
}

// TestLatePayment: a success for an order that expired does not resurrect
// it: the payment is refund_required, listed for admins, and its replays
// say the same.
func TestLatePayment(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		o := b.sell(t, "alice", 1, time.Now().Add(-time.Minute))
		if got, err := b.svc.Expire(t.Context(), o.ID, time.Now()); err != nil || got.Status != model.OrderExpired {
			t.Fatalf("expire: got %+v, %v", got, err)
		}
		redisBefore := b.redis(t, "alice")
		now := time.Now()
		body := webhook(o.ID, "pi_late", model.PaymentSucceeded, 500)
		for range 2 {
			p, err := b.svc.HandleWebhook(t.Context(), SignWebhook(testSecret, now, body), body, now)
			if err != nil || p.Status != model.PaymentRefundRequired {
				t.Fatalf("late payment: got %+v, %v; want refund_required", p, err)
			}
		}
		if got := b.order(t, o.ID).Status; got != model.OrderExpired || !reflect.DeepEqual(b.redis(t, "alice"), redisBefore) {
			t.Fatalf("late payment changed the order (%s) or Redis", got)
		}
		list, _, err := b.svc.Payments(t.Context(), model.PaymentRefundRequired, "", 0)
		if err != nil || len(list) != 1 || list[0].ID != "pi_late" {
			t.Fatalf("refund_required payments: got %+v, %v", list, err)
		}
		if got := testutil.ToFloat64(b.late); got != 1 {
			t.Fatalf("late payments counted: got %v, want 1 (the payment, delivered twice)", got)
		}
	})
}

// TestPaymentVsExpiry: a webhook's payment and the expiry of the same
// order at the same instant, many times: exactly one wins each time; the
// units come back only when the expiry won, and the payment that lost is
// refund_required.
func TestPaymentVsExpiry(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		b.svc.opts.Tolerance = time.Hour // the rounds take a while under -race
		// Ten units, so each round's order is sold and, when it expires,
		// returned; a paid one is refunded to put the units back.
		now := time.Now()
		paid, expired := 0, 0
		for i := range 50 {
			o := b.sell(t, "alice", 1, now.Add(-time.Second))
			body := webhook(o.ID, "pi_"+strconv.Itoa(i), model.PaymentSucceeded, 500)
			header := SignWebhook(testSecret, now, body)
			var (
				wg     sync.WaitGroup
				start  = make(chan struct{})
				p      model.Payment
				e      model.Order
				pe, ee error
			)
			wg.Go(func() { <-start; p, pe = b.svc.HandleWebhook(t.Context(), header, body, now) })
			wg.Go(func() { <-start; e, ee = b.svc.Expire(t.Context(), o.ID, now) })
			close(start)
			wg.Wait()
			if pe != nil || ee != nil {
				t.Fatalf("round %d: payment %v, expiry %v", i, pe, ee)
			}
			final := b.order(t, o.ID)
			switch {
			case final.Status == model.OrderPaid && p.Status == model.PaymentSucceeded && e.Status == model.OrderPaid && b.stock.releases(o.ID) == 0:
				paid++
				if _, err := b.svc.Refund(t.Context(), o.ID); err != nil {
					t.Fatalf("refund: %v", err)
				}
			case final.Status == model.OrderExpired && p.Status == model.PaymentRefundRequired && final.Returned && b.stock.releases(o.ID) == 1:
				expired++
			default:
				t.Fatalf("round %d: got order %s, payment %s, expiry saw %s, %d releases; want exactly one winner",
					i, final.Status, p.Status, e.Status, b.stock.releases(o.ID))
			}
		}
		t.Logf("%d paid, %d expired", paid, expired)
		if st := b.redis(t, "alice"); st.remaining != b.campaign.Stock || st.units["alice"] != 0 {
			t.Fatalf("after every round: got remaining %d, alice %d; want %d, 0", st.remaining, st.units["alice"], b.campaign.Stock)
		}
	})
}
