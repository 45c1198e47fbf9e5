package gateway

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// TestReturnedEventReopensSoldOut: a gateway that cached a campaign as sold
// out admits again once an order's units come back (EventReturned), without
// waiting for its periodic re-check of the flag.
func TestReturnedEventReopensSoldOut(t *testing.T) {
	// A cache and a re-check that outlive the test: only the event may flip
	// the flag.
	svc, st, c := newAdmitService(t, newGatePublisher(false), Options{CampaignCacheTTL: time.Hour, SoldOutRecheck: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	all := make([]model.Deduction, c.Stock)
	for i := range all {
		all[i] = model.Deduction{RequestID: model.FormatRequestID(c.ID, fmt.Sprintf("%032x", i)),
			UserID: fmt.Sprintf("u%d", i), Quantity: 1, OrderID: fmt.Sprintf("o%d", i)}
	}
	if r, err := st.Deduct(t.Context(), c.ID, all); err != nil || !r.SoldOutNow {
		t.Fatalf("sell out: got %+v, %v; want the stock sold out", r.SoldOutNow, err)
	}
	one := func() (int64, string, error) { return 1, "", nil }
	buy := func() error {
		_, err := svc.Purchase(t.Context(), Purchase{UserID: "waiting", CampaignID: c.ID}, one)
		return err
	}
	if err := buy(); !errors.Is(err, model.ErrSoldOut) {
		t.Fatalf("sold out: got %v, want %v", err, model.ErrSoldOut)
	}
	if ok, err := st.Release(t.Context(), c.ID, "o0", "u0", 1); err != nil || !ok {
		t.Fatalf("release: got %v, %v; want released", ok, err)
	}
	if err := buy(); !errors.Is(err, model.ErrSoldOut) {
		t.Fatalf("before the event: got %v, want the cached %v", err, model.ErrSoldOut)
	}
	// The subscription may not be up yet: a returned event is idempotent, so
	// send it until it lands.
	testenv.Eventually(t, 10*time.Second, "a purchase admitted after the returned event", func() (bool, string) {
		if err := st.StockReturned(t.Context(), c.ID); err != nil {
			t.Fatalf("publish returned: %v", err)
		}
		err := buy()
		if err != nil && !errors.Is(err, model.ErrSoldOut) {
			t.Fatalf("after the returned event: got %v, want admitted", err)
		}
		return err == nil, fmt.Sprintf("got %v", err)
	})
}
