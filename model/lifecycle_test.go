package model

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
)

var orderStatuses = []OrderStatus{OrderPendingPayment, OrderPaid, OrderCancelled, OrderExpired, OrderRefunded}

// TestCanTransition checks every pair of states against the lifecycle.
func TestCanTransition(t *testing.T) {
	allowed := map[[2]OrderStatus]bool{
		{OrderPendingPayment, OrderPaid}:      true,
		{OrderPendingPayment, OrderCancelled}: true,
		{OrderPendingPayment, OrderExpired}:   true,
		{OrderPaid, OrderRefunded}:            true,
	}
	for _, from := range append(orderStatuses, "unknown") {
		for _, to := range append(orderStatuses, "unknown") {
			if got, want := from.CanTransition(to), allowed[[2]OrderStatus{from, to}]; got != want {
				t.Errorf("%s -> %s: got %v, want %v", from, to, got, want)
			}
		}
	}
}

func TestOrderStatusClasses(t *testing.T) {
	tests := []struct {
		status               OrderStatus
		active, final, valid bool
	}{
		{OrderPendingPayment, true, false, true},
		{OrderPaid, true, false, true},
		{OrderCancelled, false, true, true},
		{OrderExpired, false, true, true},
		{OrderRefunded, false, true, true},
		{"shipped", false, false, false},
		{"", false, false, false},
	}
	for _, tc := range tests {
		t.Run(string(tc.status), func(t *testing.T) {
			if a, f, v := tc.status.Active(), tc.status.Final(), tc.status.Valid(); a != tc.active || f != tc.final || v != tc.valid {
				t.Fatalf("got active %v final %v valid %v, want %v %v %v", a, f, v, tc.active, tc.final, tc.valid)
			}
			// A final state goes nowhere; every active one goes somewhere.
			moves := 0
			for _, to := range orderStatuses {
				if tc.status.CanTransition(to) {
					moves++
				}
			}
			if got := moves > 0; got != tc.active {
				t.Fatalf("got %d moves, want some only from an active state", moves)
			}
		})
	}
}

func TestCampaignPaymentFields(t *testing.T) {
	start := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	base := Campaign{ID: "c1", Name: "n", Stock: 1, PerUserLimit: 1, StartAt: start, EndAt: start.Add(time.Hour)}
	tests := []struct {
		name   string
		price  int64
		window time.Duration
		field  string // "" = valid
	}{
		{name: "defaults", price: 0, window: 0},
		{name: "shortest window", price: 1, window: MinPaymentWindow},
		{name: "longest window", price: MaxPrice, window: MaxPaymentWindow},
		{name: "negative price", price: -1, field: "price"},
		{name: "huge price", price: MaxPrice + 1, field: "price"},
		{name: "window too short", window: MinPaymentWindow - time.Millisecond, field: "payment_window"},
		{name: "window too long", window: MaxPaymentWindow + time.Millisecond, field: "payment_window"},
		{name: "negative window", window: -time.Minute, field: "payment_window"},
		{name: "window below a millisecond", window: 2*time.Second + time.Microsecond, field: "payment_window"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			c.Price, c.PaymentWindow = tc.price, tc.window
			err := c.Validate()
			var inv *InvalidError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("got %v, want nil", err)
			case tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field):
				t.Fatalf("got %v, want an InvalidError on %q", err, tc.field)
			}
		})
	}
	if got := base.WithDefaults().PaymentWindow; got != DefaultPaymentWindow {
		t.Errorf("WithDefaults: got window %s, want %s", got, DefaultPaymentWindow)
	}
	set := base
	set.PaymentWindow = 3 * time.Second
	if got := set.WithDefaults().PaymentWindow; got != 3*time.Second {
		t.Errorf("WithDefaults on a set window: got %s, want 3s", got)
	}
	// MaxPrice's reason: the largest amount is exact in a float64.
	if amount := int64(MaxPrice) * MaxQuantity; amount >= 1<<53 {
		t.Errorf("MaxPrice × MaxQuantity = %d, want below 2^53", amount)
	}
}

func TestPaymentStatus(t *testing.T) {
	for _, s := range []PaymentStatus{PaymentSucceeded, PaymentFailed, PaymentRefundRequired} {
		if !s.Valid() {
			t.Errorf("%s: got invalid, want valid", s)
		}
	}
	for _, s := range []PaymentStatus{"", "pending", "SUCCEEDED"} {
		if s.Valid() {
			t.Errorf("%q: got valid, want invalid", s)
		}
	}
}

var (
	refOrderID   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	refPaymentID = regexp.MustCompile(`^[A-Za-z0-9_.@:-]{1,128}$`)
)

func TestOrderAndPaymentIDs(t *testing.T) {
	cases := []string{"", "0190a5b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b", "order-000001", "pi_3Mtw.x@y:z", "a b", "é",
		strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("p", 128), strings.Repeat("p", 129)}
	for c := range 256 {
		cases = append(cases, "ab"+string([]byte{byte(c)})+"cd")
	}
	for _, s := range cases {
		if got, want := ValidOrderID(s), refOrderID.MatchString(s); got != want {
			t.Errorf("ValidOrderID(%q) = %v, want %v", s, got, want)
		}
		if got, want := ValidPaymentID(s), refPaymentID.MatchString(s); got != want {
			t.Errorf("ValidPaymentID(%q) = %v, want %v", s, got, want)
		}
	}
}
