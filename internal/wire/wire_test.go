package wire

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// purchaseJSON and resultJSON are the messages as encoding/json reads and
// writes them: model's types with their tags (model's tests hold model's own
// tags to these codecs). Each converts to and from this package's type.
type purchaseJSON struct {
	Version    int       `json:"v"`
	RequestID  string    `json:"request_id"`
	CampaignID string    `json:"campaign_id"`
	UserID     string    `json:"user_id"`
	Quantity   int64     `json:"quantity"`
	AdmittedAt time.Time `json:"admitted_at"`
}

type resultJSON struct {
	RequestID  string    `json:"request_id"`
	CampaignID string    `json:"campaign_id"`
	UserID     string    `json:"user_id"`
	Status     string    `json:"status"`
	Reason     string    `json:"reason,omitempty"`
	OrderID    string    `json:"order_id,omitempty"`
	Quantity   int64     `json:"quantity"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// sameTime compares two times by instant and zone.
func sameTime(a, b time.Time) bool {
	an, ao := a.Zone()
	bn, bo := b.Zone()
	return a.Equal(b) && an == bn && ao == bo
}

func samePurchase(a, b PurchaseRequest) bool {
	ta, tb := a.AdmittedAt, b.AdmittedAt
	a.AdmittedAt, b.AdmittedAt = time.Time{}, time.Time{}
	return a == b && sameTime(ta, tb)
}

func sameResult(a, b Result) bool {
	ta, tb := a.FinishedAt, b.FinishedAt
	a.FinishedAt, b.FinishedAt = time.Time{}, time.Time{}
	return a == b && sameTime(ta, tb)
}

// checkDecodeEquivalent: whatever the hand-written decoders read, encoding/json
// reads the same from the same bytes; the rest they leave to it.
func checkDecodeEquivalent(t *testing.T, b []byte) {
	t.Helper()
	if got, ok := DecodePurchaseRequest(b); ok {
		var want purchaseJSON
		if err := json.Unmarshal(b, &want); err != nil || !samePurchase(got, PurchaseRequest(want)) {
			t.Fatalf("%q: DecodePurchaseRequest read %+v, encoding/json %+v (%v)", b, got, want, err)
		}
	}
	if got, ok := DecodeResult(b); ok {
		var want resultJSON
		if err := json.Unmarshal(b, &want); err != nil || !sameResult(got, Result(want)) {
			t.Fatalf("%q: DecodeResult read %+v, encoding/json %+v (%v)", b, got, want, err)
		}
	}
}

// decodeSeeds are messages around the hand-written decoders' edges.
var decodeSeeds = []string{
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1,"admitted_at":"2026-01-01T00:00:00Z"}`,
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1,"admitted_at":"2026-01-01T00:00:00.123456789+05:30"}`,
	`{"quantity":1,"user_id":"u","campaign_id":"c","request_id":"c.00000000000000000000000000000000","v":1}`,
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1} `,
	` {"v":1}`,
	`{"v":1,"v":2}`,
	`{"V":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1}`,
	`{"v":1,"Request_ID":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1}`,
	`{"v":1.0}`, `{"v":1e0}`, `{"v":01}`, `{"v":-0}`, `{"v":-}`, `{"v":99999999999999999999}`, `{"v":null}`,
	`{"v":"1"}`, `{"v":1,"user_id":"\u0061"}`, `{"v":1,"user_id":"é"}`, `{"v":1,"user_id":"a\tb"}`,
	`{"v":1,"extra":true}`, `{}`, `{`, `}`, `[]`, `null`, ``, `{"v":1,}`, `{"v":1}}`, `{"v" :1}`,
	`{"v":1,"admitted_at":"2026-13-01T00:00:00Z"}`, `{"v":1,"admitted_at":"2026-01-01 00:00:00Z"}`,
	`{"v":1,"admitted_at":null}`, `{"v":1,"admitted_at":"24:00"}`, `{"v":1,"accepted_at":"2026-01-01T00:00:00Z"}`,
	`{"request_id":"c.0","campaign_id":"c","user_id":"u","status":"success","order_id":"o","quantity":1}`,
	`{"request_id":"c.0","campaign_id":"c","user_id":"u","status":"rejected","reason":"bad_message","quantity":1,"finished_at":"2026-01-01T00:00:00.5Z"}`,
	`{"request_id":"c.0","status":"paid"}`, `{"status":"success","Status":"sold_out"}`,
}

func TestDecodeEquivalentToEncodingJSON(t *testing.T) {
	for _, s := range decodeSeeds {
		checkDecodeEquivalent(t, []byte(s))
	}
}

func FuzzDecodeEquivalentToEncodingJSON(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkDecodeEquivalent)
}

// checkEncodeEquivalent: the hand-written encoders write exactly what
// json.Marshal writes, and decline exactly where it escapes a string or
// fails, so old and new gateways, workers and notifiers read each other's
// messages.
func checkEncodeEquivalent(t *testing.T, s1, s2, s3 string, n int64, at time.Time) {
	t.Helper()
	for _, s := range []string{s1, s2, s3} {
		if want, _ := json.Marshal(s); JSONSafe(s) && string(want) != `"`+s+`"` {
			t.Fatalf("JSONSafe(%q) = true, but json.Marshal writes %s", s, want)
		}
	}
	safe := JSONSafe(s1) && JSONSafe(s2) && JSONSafe(s3)

	p := PurchaseRequest{Version: 1, RequestID: s1, CampaignID: s2, UserID: s3, Quantity: n, AdmittedAt: at}
	got, ok := EncodePurchaseRequest(p)
	want, wantErr := json.Marshal(purchaseJSON(p))
	if ok != (safe && wantErr == nil) || (ok && string(got) != string(want)) {
		t.Fatalf("EncodePurchaseRequest(%+v) = %s, %v; json.Marshal writes %s (%v)", p, got, ok, want, wantErr)
	}

	for _, r := range []Result{
		{RequestID: s1, CampaignID: s2, UserID: s3, Status: s2, Reason: s3, OrderID: s1, Quantity: n, FinishedAt: at},
		{RequestID: s1, CampaignID: s2, UserID: s3, Status: "sold_out", Quantity: n},
	} {
		want, wantErr := json.Marshal(resultJSON(r))
		// Appended after other results, the same bytes follow them; declining
		// leaves what was there.
		prefix := []byte(`{"earlier":1}` + "\n")
		got, ok := AppendResult(prefix, r)
		if ok != (safe && wantErr == nil) {
			t.Fatalf("AppendResult(%q, %+v): got ok %v, want %v (json.Marshal: %s, %v)", prefix, r, ok, !ok, want, wantErr)
		}
		if ok && string(got) != string(prefix)+string(want) {
			t.Fatalf("AppendResult(%q, %+v) = %s, want %s%s", prefix, r, got, prefix, want)
		}
		if !ok && string(got) != string(prefix) {
			t.Fatalf("AppendResult(%q, %+v) declined with %s, want %s", prefix, r, got, prefix)
		}
	}
}

func TestEncodeEquivalentToEncodingJSON(t *testing.T) {
	utc := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		s1, s2, s3 string
		n          int64
		at         time.Time
	}{
		{"valid", "c." + strings.Repeat("ab", 16), "c", "alice", 1, utc},
		{"zero time", "c.x", "c", "u", 0, time.Time{}},
		{"nanoseconds and an offset", "r", "c", "u", -7, time.Date(2026, 5, 6, 7, 8, 9, 123456789, time.FixedZone("x", 5*3600+1800))},
		{"html characters", "a<b", "c&d", "e>f", 1, utc},
		{"quote and backslash", `a"b`, `c\d`, "e", 1, utc},
		{"control and non-ASCII", "a\nb", "é", "\xff", 1, utc},
		{"DEL", "a\x7fb", "c", "u", 1, utc},
		{"year 10000", "r", "c", "u", 1, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"negative year", "r", "c", "u", 1, time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"empty", "", "", "", 0, utc},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkEncodeEquivalent(t, tc.s1, tc.s2, tc.s3, tc.n, tc.at) })
	}
}

func FuzzEncodeEquivalentToEncodingJSON(f *testing.F) {
	f.Add("c."+strings.Repeat("ab", 16), "c", "alice", int64(1), int64(1767225600), int64(0), 0)
	f.Add("a<b", `c"d`, "é", int64(-3), int64(-1e12), int64(999), 90)
	f.Fuzz(func(t *testing.T, s1, s2, s3 string, n, sec, nsec int64, offsetMinutes int) {
		at := time.Unix(sec, nsec).In(time.FixedZone("z", (offsetMinutes%(48*60))*60))
		checkEncodeEquivalent(t, s1, s2, s3, n, at)
	})
}

// TestRoundTrip: what the encoders write, the decoders read back themselves,
// without leaving it to encoding/json.
func TestRoundTrip(t *testing.T) {
	at := time.Date(2026, 5, 6, 7, 8, 9, 123456789, time.FixedZone("", 5*3600+1800))
	p := PurchaseRequest{Version: 1, RequestID: "c." + strings.Repeat("ab", 16), CampaignID: "c", UserID: "alice", Quantity: 2, AdmittedAt: at}
	b, ok := EncodePurchaseRequest(p)
	if !ok {
		t.Fatalf("EncodePurchaseRequest(%+v) declined", p)
	}
	if got, ok := DecodePurchaseRequest(b); !ok || !samePurchase(got, p) {
		t.Fatalf("DecodePurchaseRequest(%s) = %+v, %v; want %+v, true", b, got, ok, p)
	}
	for _, r := range []Result{
		{RequestID: p.RequestID, CampaignID: "c", UserID: "alice", Status: "success", OrderID: "0193", Quantity: 2},
		{RequestID: p.RequestID, CampaignID: "c", UserID: "alice", Status: "rejected", Reason: "undeliverable", Quantity: 2, FinishedAt: at},
	} {
		b, ok := AppendResult(nil, r)
		if !ok {
			t.Fatalf("AppendResult(nil, %+v) declined", r)
		}
		if got, ok := DecodeResult(b); !ok || !sameResult(got, r) {
			t.Fatalf("DecodeResult(%s) = %+v, %v; want %+v, true", b, got, ok, r)
		}
	}
}
