package lifecycle

import (
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

func later() time.Time { return time.Now().Add(time.Hour) }

// TestCancel: the owner cancels a pending order and its units come back
// once; a retried cancel changes nothing; another shopper's order is not
// found; a paid order is not cancellable.
func TestCancel(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		o := b.sell(t, "alice", 2, later())
		before := b.redis(t, "alice")

		if _, err := b.svc.Cancel(t.Context(), "mallory", o.ID); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("someone else's cancel: got %v, want %v", err, model.ErrNotFound)
		}
		if got := b.order(t, o.ID); got.Status != model.OrderPendingPayment || !reflect.DeepEqual(b.redis(t, "alice"), before) {
			t.Fatalf("someone else's cancel changed the order (%s) or Redis", got.Status)
		}

		got, err := b.svc.Cancel(t.Context(), "alice", o.ID)
		if err != nil || got.Status != model.OrderCancelled || !got.Returned {
			t.Fatalf("cancel: got %+v, %v; want cancelled, returned", got, err)
		}
		after := b.redis(t, "alice")
		if after.remaining != before.remaining+2 || after.units["alice"] != 0 {
			t.Fatalf("after cancel: got remaining %d, alice %d; want %d, 0", after.remaining, after.units["alice"], before.remaining+2)
		}
		if again, err := b.svc.Cancel(t.Context(), "alice", o.ID); err != nil || again.Status != model.OrderCancelled {
			t.Fatalf("second cancel: got %+v, %v; want the cancelled order", again, err)
		}
		if b.redis(t, "alice").remaining != after.remaining || b.stock.releases(o.ID) != 1 {
			t.Fatalf("second cancel released again")
		}

		paid := b.sell(t, "bob", 1, later())
		if _, err := b.svc.Pay(t.Context(), "bob", paid.ID); err != nil {
			t.Fatalf("pay: %v", err)
		}
		if _, err := b.svc.Cancel(t.Context(), "bob", paid.ID); !errors.Is(err, model.ErrNotCancellable) {
			t.Fatalf("cancel a paid order: got %v, want %v", err, model.ErrNotCancellable)
		}
		if got := b.order(t, paid.ID); got.Status != model.OrderPaid || b.stock.releases(paid.ID) != 0 {
			t.Fatalf("refused cancel changed the paid order: %s, %d releases", got.Status, b.stock.releases(paid.ID))
		}
		if _, err := b.svc.Cancel(t.Context(), "alice", "no such id"); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("cancel a malformed id: got %v, want %v", err, model.ErrNotFound)
		}
	})
}

// TestPay: the fake provider pays through the webhook path; the payment
// is recorded; an order no longer pending, or past its window, is not
// payable; another shopper's order is not found.
func TestPay(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		o := b.sell(t, "alice", 3, later())
		if _, err := b.svc.Pay(t.Context(), "mallory", o.ID); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("someone else's pay: got %v, want %v", err, model.ErrNotFound)
		}
		c, err := b.svc.Pay(t.Context(), "alice", o.ID)
		if err != nil || c.Status != model.OrderPaid || c.Amount != 1500 || c.PaymentID == "" || c.Provider != ProviderFake {
			t.Fatalf("pay: got %+v, %v; want paid 1500 by the fake provider", c, err)
		}
		if got := b.order(t, o.ID); got.Status != model.OrderPaid {
			t.Fatalf("order: got %s, want paid", got.Status)
		}
		ps := b.payments(t)
		if len(ps) != 1 || ps[0].ID != c.PaymentID || ps[0].Status != model.PaymentSucceeded || ps[0].Amount != 1500 {
			t.Fatalf("payments: got %+v, want the one succeeded payment", ps)
		}
		if _, err := b.svc.Pay(t.Context(), "alice", o.ID); !errors.Is(err, model.ErrNotPayable) {
			t.Fatalf("pay twice: got %v, want %v", err, model.ErrNotPayable)
		}

		late := b.sell(t, "bob", 1, time.Now().Add(-time.Second))
		if _, err := b.svc.Pay(t.Context(), "bob", late.ID); !errors.Is(err, model.ErrNotPayable) {
			t.Fatalf("pay past the window: got %v, want %v", err, model.ErrNotPayable)
		}
		if got := b.order(t, late.ID); got.Status != model.OrderPendingPayment || len(b.payments(t)) != 1 {
			t.Fatalf("refused pay changed the order (%s) or the payments", got.Status)
		}

		// A real provider's payment completes through its webhook.
		b.svc.opts.Provider = "stripe"
		pending := b.sell(t, "carol", 1, later())
		c, err = b.svc.Pay(t.Context(), "carol", pending.ID)
		if err != nil || c.Status != model.OrderPendingPayment || c.PaymentID != "" || c.Amount != 500 || !c.PayBy.Equal(pending.ExpiresAt) {
			t.Fatalf("pay with another provider: got %+v, %v; want the checkout of a pending order", c, err)
		}
	})
}

// TestExpire: an order not due stays; a due one expires and its units
// come back once, however often the expiry runs; a paid order never
// expires.
func TestExpire(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		deadline := time.Now().Add(time.Minute).Truncate(time.Millisecond)
		o := b.sell(t, "alice", 2, deadline)
		before := b.redis(t, "alice")

		got, err := b.svc.Expire(t.Context(), o.ID, deadline.Add(-time.Millisecond))
		if err != nil || got.Status != model.OrderPendingPayment || !got.ExpiresAt.Equal(deadline) {
			t.Fatalf("early expiry: got %+v, %v; want the pending order, due at %s", got, err, deadline)
		}
		for range 3 {
			got, err = b.svc.Expire(t.Context(), o.ID, deadline)
			if err != nil || got.Status != model.OrderExpired || !got.Returned {
				t.Fatalf("expiry: got %+v, %v; want expired, returned", got, err)
			}
		}
		after := b.redis(t, "alice")
		if after.remaining != before.remaining+2 || after.units["alice"] != 0 || b.stock.releases(o.ID) != 1 {
			t.Fatalf("after expiry: remaining %d (was %d), alice %d, %d releases; want +2, 0, 1",
				after.remaining, before.remaining, after.units["alice"], b.stock.releases(o.ID))
		}

		paid := b.sell(t, "bob", 1, deadline)
		if _, err := b.svc.Pay(t.Context(), "bob", paid.ID); err != nil {
			t.Fatalf("pay: %v", err)
		}
		if got, err := b.svc.Expire(t.Context(), paid.ID, deadline.Add(time.Hour)); err != nil || got.Status != model.OrderPaid {
			t.Fatalf("expire a paid order: got %+v, %v; want it paid", got, err)
		}
		if b.stock.releases(paid.ID) != 0 {
			t.Fatalf("expire of a paid order released its units")
		}
		if _, err := b.svc.Expire(t.Context(), "unknown", deadline); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("expire an unknown order: got %v, want %v", err, model.ErrNotFound)
		}
	})
}

// TestExpireWhileMySQLDecides (issue 28): an order that expires while MySQL
// decides its campaign (the degraded mode) gives its units back to MySQL's
// count once, however often it is expired, and nothing to Redis, which is
// rebuilt from MySQL before it decides again.
func TestExpireWhileMySQLDecides(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		deadline := time.Now().Add(time.Minute).Truncate(time.Millisecond)
		o := b.sell(t, "alice", 2, deadline)
		c, err := b.db.TakeOver(t.Context(), b.campaign.ID)
		if err != nil || c.UnitsHeld != 2 {
			t.Fatalf("take over: got %+v, %v; want 2 units held", c, err)
		}
		for range 3 {
			if got, err := b.svc.Expire(t.Context(), o.ID, deadline); err != nil || got.Status != model.OrderExpired || !got.Returned {
				t.Fatalf("expiry: got %+v, %v; want expired, returned", got, err)
			}
		}
		if c, err := b.db.Campaign(t.Context(), b.campaign.ID); err != nil || c.UnitsHeld != 0 {
			t.Errorf("units held after the expiry: got %+v, %v; want 0", c, err)
		}
		if n := b.stock.releases(o.ID); n != 0 {
			t.Errorf("releases to Redis: got %d, want 0 while MySQL decides", n)
		}
	})
}

// TestRefund: only a paid order is refundable; its units come back while
// the sale is open, and not after it closed.
func TestRefund(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		unpaid := b.sell(t, "alice", 1, later())
		before := b.redis(t, "alice")
		if _, err := b.svc.Refund(t.Context(), unpaid.ID); !errors.Is(err, model.ErrNotRefundable) {
			t.Fatalf("refund an unpaid order: got %v, want %v", err, model.ErrNotRefundable)
		}
		if got := b.order(t, unpaid.ID); got.Status != model.OrderPendingPayment || !reflect.DeepEqual(b.redis(t, "alice"), before) {
			t.Fatalf("refused refund changed the order (%s) or Redis", got.Status)
		}

		paid := b.sell(t, "bob", 2, later())
		if _, err := b.svc.Pay(t.Context(), "bob", paid.ID); err != nil {
			t.Fatalf("pay: %v", err)
		}
		before = b.redis(t, "bob")
		got, err := b.svc.Refund(t.Context(), paid.ID)
		if err != nil || got.Status != model.OrderRefunded || !got.Returned {
			t.Fatalf("refund: got %+v, %v; want refunded, returned", got, err)
		}
		if after := b.redis(t, "bob"); after.remaining != before.remaining+2 || after.units["bob"] != 0 {
			t.Fatalf("refund while open: remaining %d (was %d), bob %d; want +2, 0", after.remaining, before.remaining, after.units["bob"])
		}
		if again, err := b.svc.Refund(t.Context(), paid.ID); err != nil || again.Status != model.OrderRefunded || b.stock.releases(paid.ID) != 1 {
			t.Fatalf("second refund: got %+v, %v, %d releases; want the refunded order, 1 release", again, err, b.stock.releases(paid.ID))
		}

		// After the sale closed the units stay out.
		closed := b.sell(t, "carol", 1, later())
		if _, err := b.svc.Pay(t.Context(), "carol", closed.ID); err != nil {
			t.Fatalf("pay: %v", err)
		}
		before = b.redis(t, "carol")
		b.svc.opts.Now = func() time.Time { return b.campaign.EndAt }
		got, err = b.svc.Refund(t.Context(), closed.ID)
		if err != nil || got.Status != model.OrderRefunded || !got.Returned {
			t.Fatalf("refund after close: got %+v, %v; want refunded, marked", got, err)
		}
		if after := b.redis(t, "carol"); !reflect.DeepEqual(after, before) || b.stock.releases(closed.ID) != 0 {
			t.Fatalf("refund after close gave units back: %+v, was %+v", after, before)
		}
	})
}

// TestExpiryAndSweepAtOnce: the expiry messages and the sweeper expire the
// same orders at the same time: each order's units come back once.
func TestExpiryAndSweepAtOnce(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		past := time.Now().Add(-time.Hour)
		var orders []model.Order
		for i := range 5 {
			orders = append(orders, b.sell(t, []string{"a", "b", "c", "d", "e"}[i], 2, past))
		}
		before := b.redis(t)
		now := time.Now()
		var wg sync.WaitGroup
		for _, o := range orders {
			wg.Go(func() {
				if _, err := b.svc.Expire(t.Context(), o.ID, now); err != nil {
					t.Errorf("expire %s: %v", o.ID, err)
				}
			})
		}
		for range 2 {
			wg.Go(func() {
				if _, err := b.svc.Sweep(t.Context(), now); err != nil {
					t.Errorf("sweep: %v", err)
				}
			})
		}
		wg.Wait()
		for _, o := range orders {
			if got := b.order(t, o.ID); got.Status != model.OrderExpired || !got.Returned || b.stock.releases(o.ID) != 1 {
				t.Errorf("order %s: got %s, returned %v, %d releases; want expired, returned, 1", o.ID, got.Status, got.Returned, b.stock.releases(o.ID))
			}
		}
		if after := b.redis(t); after.remaining != before.remaining+10 || after.soldOut {
			t.Fatalf("got remaining %d (was %d), sold out %v; want +10, not sold out", after.remaining, before.remaining, after.soldOut)
		}
		if sw, err := b.svc.Sweep(t.Context(), now); err != nil || sw != (model.Swept{}) {
			t.Fatalf("sweep after: got %+v, %v; want nothing to do", sw, err)
		}
	})
}

// TestSweepExpiresDuePending: the sweeper expires pending orders past
// their window plus the grace, and leaves the rest.
func TestSweepExpiresDuePending(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		now := time.Now()
		lost := b.sell(t, "a", 1, now.Add(-time.Minute))    // its expiry message was lost
		inGrace := b.sell(t, "b", 1, now.Add(-time.Second)) // its message may still come
		open := b.sell(t, "c", 1, now.Add(time.Minute))
		sw, err := b.svc.Sweep(t.Context(), now)
		if err != nil || sw != (model.Swept{Expired: 1}) {
			t.Fatalf("sweep: got %+v, %v; want 1 expired", sw, err)
		}
		for _, tc := range []struct {
			o    model.Order
			want model.OrderStatus
		}{{lost, model.OrderExpired}, {inGrace, model.OrderPendingPayment}, {open, model.OrderPendingPayment}} {
			if got := b.order(t, tc.o.ID).Status; got != tc.want {
				t.Errorf("order of %s: got %s, want %s", tc.o.UserID, got, tc.want)
			}
		}
	})
}

// TestCrashBetweenTransitionAndRelease: a crash after the MySQL transition
// (before the Redis release, or after it but before the mark) leaves an
// order the sweeper completes, giving its units back exactly once.
func TestCrashBetweenTransitionAndRelease(t *testing.T) {
	for _, tc := range []struct {
		name              string
		before, after     int
		releasedAtCrashed int
	}{
		{name: "before the release", before: 1},
		{name: "before the mark", after: 1, releasedAtCrashed: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachEnv(t, func(t *testing.T, b *testBundle) {
				o := b.sell(t, "alice", 2, later())
				before := b.redis(t, "alice")
				b.stock.fail(tc.before, tc.after)
				if _, err := b.svc.Cancel(t.Context(), "alice", o.ID); !errors.Is(err, errCrash) {
					t.Fatalf("cancel: got %v, want the injected crash", err)
				}
				if got := b.order(t, o.ID); got.Status != model.OrderCancelled || got.Returned || b.stock.releases(o.ID) != tc.releasedAtCrashed {
					t.Fatalf("after the crash: got %s, returned %v, %d releases", got.Status, got.Returned, b.stock.releases(o.ID))
				}
				sw, err := b.svc.Sweep(t.Context(), time.Now())
				if err != nil || sw != (model.Swept{Released: 1}) {
					t.Fatalf("sweep: got %+v, %v; want 1 released", sw, err)
				}
				if sw, err := b.svc.Sweep(t.Context(), time.Now()); err != nil || sw != (model.Swept{}) {
					t.Fatalf("second sweep: got %+v, %v; want nothing", sw, err)
				}
				after := b.redis(t, "alice")
				if got := b.order(t, o.ID); !got.Returned || b.stock.releases(o.ID) != 1 ||
					after.remaining != before.remaining+2 || after.units["alice"] != 0 {
					t.Fatalf("after the sweep: returned %v, %d releases, remaining %d (was %d), alice %d; want true, 1, +2, 0",
						got.Returned, b.stock.releases(o.ID), after.remaining, before.remaining, after.units["alice"])
				}
			})
		})
	}
}

// TestListings: listings take a bounded limit and known statuses.
func TestListings(t *testing.T) {
	forEachEnv(t, func(t *testing.T, b *testBundle) {
		for range 3 {
			b.sell(t, "alice", 1, later())
		}
		got, next, err := b.svc.UserOrders(t.Context(), "alice", "", 2)
		if err != nil || len(got) != 2 || next == "" {
			t.Fatalf("first page: got %d orders, next %q, %v", len(got), next, err)
		}
		if rest, next, err := b.svc.UserOrders(t.Context(), "alice", next, 0); err != nil || len(rest) != 1 || next != "" {
			t.Fatalf("second page: got %d orders, next %q, %v", len(rest), next, err)
		}
		if list, _, err := b.svc.CampaignOrders(t.Context(), b.campaign.ID, model.OrderPendingPayment, "", 0); err != nil || len(list) != 3 {
			t.Fatalf("campaign orders: got %d, %v; want 3", len(list), err)
		}
		var inv *model.InvalidError
		for _, err := range []error{
			second(b.svc.UserOrders(t.Context(), "alice", "", MaxPage+1)),
			second(b.svc.UserOrders(t.Context(), "alice", "", -1)),
			second(b.svc.CampaignOrders(t.Context(), b.campaign.ID, "shipped", "", 0)),
			second(b.svc.Payments(t.Context(), "pending", "", 0)),
			second(b.svc.UserOrders(t.Context(), "alice", "not a cursor", 0)),
		} {
			if !errors.As(err, &inv) {
				t.Errorf("got %v, want an InvalidError", err)
			}
		}
	})
}

func second[A, B any](_ A, _ B, err error) error { return err }
