package model

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// refUUIDv8 is a UUID in canonical text form, version 8, RFC 9562 variant.
var refUUIDv8 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestOrderIDOf: a request's order id is the same every time, a canonical
// UUIDv8 that ValidOrderID takes, led by the request's UUIDv7 timestamp,
// and different for the same tail in two campaigns.
func TestOrderIDOf(t *testing.T) {
	const tail = "0190a5b27c3d7e4f8a9b0c1d2e3f4a5b" // a UUIDv7, as the gateway makes them
	tests := []struct {
		name, requestID string
		prefix          string // what the id starts with; "" = anything
	}{
		{"gateway request", FormatRequestID("spring-sale", tail), "0190a5b2-7c3d-8e4f-"},
		{"same tail, other campaign", FormatRequestID("autumn-sale", tail), "0190a5b2-7c3d-8e4f-"},
		{"zero tail", FormatRequestID("c", strings.Repeat("0", 32)), "00000000-0000-8000-"},
		{"not a request id", "not-a-request", ""},
		{"empty", "", ""},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := OrderIDOf(tt.requestID)
			if again := OrderIDOf(tt.requestID); again != id {
				t.Fatalf("OrderIDOf(%q) = %q, then %q: want the same", tt.requestID, id, again)
			}
			if !refUUIDv8.MatchString(id) || !ValidOrderID(id) {
				t.Fatalf("OrderIDOf(%q) = %q: want a canonical UUIDv8 that ValidOrderID takes", tt.requestID, id)
			}
			if !strings.HasPrefix(id, tt.prefix) {
				t.Fatalf("OrderIDOf(%q) = %q: want it to start with %q", tt.requestID, id, tt.prefix)
			}
			if other, dup := seen[id]; dup {
				t.Fatalf("OrderIDOf(%q) = %q, as for %q: want distinct ids", tt.requestID, id, other)
			}
			seen[id] = tt.requestID
		})
	}
}

// TestOrderIDOfStable pins the derivation (the value computed apart, with
// Python's hashlib): orders stored under it are deduplicated by their id,
// so a change would store a redelivered success a second time.
func TestOrderIDOfStable(t *testing.T) {
	got := OrderIDOf(FormatRequestID("spring-sale", "0190a5b27c3d7e4f8a9b0c1d2e3f4a5b"))
	if want := "0190a5b2-7c3d-8e4f-8c83-af649f0813d1"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestOrderIDOfOrder: ids sort as the requests' UUIDv7 time bits do, and
// requests that share them get distinct ids.
func TestOrderIDOfOrder(t *testing.T) {
	prev := ""
	seen := map[string]bool{}
	for ms := range 3 {
		for fraction := range 3 { // the 12 bits after the milliseconds
			for i := range 5_000 {
				id := OrderIDOf(FormatRequestID("c", fmt.Sprintf("%012x7%03x%016x", 0x0190a5b27c3d+ms, fraction, i)))
				if seen[id] {
					t.Fatalf("ms %d, fraction %d, request %d: id %s handed out twice", ms, fraction, i, id)
				}
				seen[id] = true
				if i == 0 && id <= prev {
					t.Fatalf("ms %d, fraction %d: id %s sorts before %s of the time before", ms, fraction, id, prev)
				}
				prev = max(prev, id)
			}
		}
	}
}

func BenchmarkOrderIDOf(b *testing.B) {
	rid := FormatRequestID("spring-sale-2026", "0190a5b27c3d7e4f8a9b0c1d2e3f4a5b")
	b.ReportAllocs()
	for b.Loop() {
		_ = OrderIDOf(rid)
	}
}
