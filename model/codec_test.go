package model

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The entry points against encoding/json on model's own types: internal/wire
// holds its hand-written codec to encoding/json on the same keys, and these
// tests hold model's tags, fallbacks and checks to the same reference.

// samePurchase compares two decoded requests, times by instant and zone.
func samePurchase(a, b PurchaseRequest) bool {
	an, ao := a.AdmittedAt.Zone()
	bn, bo := b.AdmittedAt.Zone()
	ta, tb := a.AdmittedAt, b.AdmittedAt
	a.AdmittedAt, b.AdmittedAt = time.Time{}, time.Time{}
	return a == b && ta.Equal(tb) && an == bn && ao == bo
}

func sameResult(a, b Result) bool {
	an, ao := a.FinishedAt.Zone()
	bn, bo := b.FinishedAt.Zone()
	ta, tb := a.FinishedAt, b.FinishedAt
	a.FinishedAt, b.FinishedAt = time.Time{}, time.Time{}
	return a == b && ta.Equal(tb) && an == bn && ao == bo
}

// refDecodePurchaseRequest is DecodePurchaseRequest as it was before the
// hand-written path: encoding/json, then the checks.
func refDecodePurchaseRequest(b []byte) (PurchaseRequest, error) {
	p, err := decodePurchaseRequestJSON(b)
	if err != nil {
		return PurchaseRequest{}, err
	}
	if p.Version != MessageVersion {
		return PurchaseRequest{}, Invalid("v", "unsupported message version")
	}
	if err := p.Validate(); err != nil {
		return PurchaseRequest{}, err
	}
	return p, nil
}

// checkDecodeEquivalent: the entry points decide as encoding/json and the
// checks decide, whichever path reads the bytes.
func checkDecodeEquivalent(t *testing.T, b []byte) {
	t.Helper()
	got, gotErr := DecodePurchaseRequest(b)
	want, wantErr := refDecodePurchaseRequest(b)
	if (gotErr == nil) != (wantErr == nil) || !samePurchase(got, want) {
		t.Fatalf("%q: got %+v (%v), want %+v (%v)", b, got, gotErr, want, wantErr)
	}
	if gotErr != nil && errField(gotErr) != errField(wantErr) {
		t.Fatalf("%q: got error %v, want %v", b, gotErr, wantErr)
	}

	gotR, gotErr := DecodeResult(b)
	var wantR Result
	wantErr = json.Unmarshal(b, &wantR)
	if wantErr != nil {
		wantR = Result{} // json.Unmarshal may have filled some fields
	}
	if wantErr == nil && !wantR.Status.Valid() {
		wantR, wantErr = Result{}, Invalid("status", "")
	}
	if (gotErr == nil) != (wantErr == nil) || !sameResult(gotR, wantR) {
		t.Fatalf("%q: got %+v (%v), want %+v (%v)", b, gotR, gotErr, wantR, wantErr)
	}
}

func errField(err error) string {
	if inv, ok := err.(*InvalidError); ok {
		return inv.Field
	}
	return "?"
}

// decodeSeeds take each path: every key read by hand, messages left to
// encoding/json, and each check's refusal.
var decodeSeeds = []string{
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1,"admitted_at":"2026-01-01T00:00:00.123456789+05:30"}`,
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1,"admitted_at":"2026-01-01T00:00:00Z"} `,
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"\u0075","quantity":1}`,
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1,"accepted_at":"2026-01-01T00:00:00Z"}`,
	`{"v":2,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1}`,
	`{"v":1,"request_id":"d.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1}`,
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"a b","quantity":1}`,
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":0}`,
	`{"v":1,"v":1}`, `{"v":1.0}`, `{"v":1,"admitted_at":"24:00"}`, `{"v":null}`, `{`, ``, `null`,
	`{"request_id":"c.0","campaign_id":"c","user_id":"u","status":"rejected","reason":"bad_message","order_id":"o","quantity":1,"finished_at":"2026-01-01T00:00:00.5Z"}`,
	`{"request_id":"c.0","campaign_id":"c","user_id":"u","status":"success","quantity":1} `,
	`{"request_id":"c.0","status":"paid"}`, `{"status":"success","Status":"sold_out"}`, `{"status":"s\u0075ccess"}`,
}

func TestDecodeEquivalentToEncodingJSON(t *testing.T) {
	for _, s := range decodeSeeds {
		checkDecodeEquivalent(t, []byte(s))
	}
}

// checkEncodeEquivalent: the entry points write exactly what json.Marshal
// writes (and fail where it fails), so old and new gateways, workers and
// notifiers read each other's messages.
func checkEncodeEquivalent(t *testing.T, s1, s2, s3 string, n int64, at time.Time) {
	t.Helper()
	p := PurchaseRequest{RequestID: s1, CampaignID: s2, UserID: s3, Quantity: n, AdmittedAt: at}
	got, gotErr := EncodePurchaseRequest(p)
	p.Version = MessageVersion
	want, wantErr := json.Marshal(p)
	if string(got) != string(want) || (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("EncodePurchaseRequest(%+v) = %s (%v), want %s (%v)", p, got, gotErr, want, wantErr)
	}
	for _, r := range []Result{
		{RequestID: s1, CampaignID: s2, UserID: s3, Status: Status(s2), Reason: s3, OrderID: s1, Quantity: n, FinishedAt: at},
		{RequestID: s1, CampaignID: s2, UserID: s3, Status: StatusSoldOut, Quantity: n},
	} {
		got, gotErr := EncodeResult(r)
		want, wantErr := json.Marshal(r)
		if string(got) != string(want) || (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("EncodeResult(%+v) = %s (%v), want %s (%v)", r, got, gotErr, want, wantErr)
		}
		// Appended after other results, the same bytes follow them, and a
		// failure leaves what was there.
		prefix := []byte(`{"earlier":1}` + "\n")
		appended, appendErr := AppendResult(prefix, r)
		if wantErr == nil && (appendErr != nil || string(appended) != string(prefix)+string(want)) {
			t.Fatalf("AppendResult(%q, %+v) = %s (%v), want %s%s", prefix, r, appended, appendErr, prefix, want)
		}
		if wantErr != nil && (appendErr == nil || string(appended) != string(prefix)) {
			t.Fatalf("AppendResult(%q, %+v) = %s (%v), want %s and an error", prefix, r, appended, appendErr, prefix)
		}
	}
}

// TestEncodeEquivalentToEncodingJSON holds the entry points to encoding/json
// on model's own types: one case the hand-written encoder takes, and one of
// each kind it declines (escaping, an unrepresentable time), which fall back.
// internal/wire's table and fuzz target cover the encoder itself.
func TestEncodeEquivalentToEncodingJSON(t *testing.T) {
	utc := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		s1, s2, s3 string
		n          int64
		at         time.Time
	}{
		{"valid", "c." + strings.Repeat("ab", 16), "c", "alice", 1, utc},
		{"html characters", "a<b", "c&d", "e>f", 1, utc},
		{"control and non-ASCII", "a\nb", "é", "\xff", 1, utc},
		{"year 10000", "r", "c", "u", 1, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkEncodeEquivalent(t, tc.s1, tc.s2, tc.s3, tc.n, tc.at) })
	}
}

func TestResultRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		r    Result
	}{
		{"success", Result{RequestID: "c." + strings.Repeat("ab", 16), CampaignID: "c", UserID: "alice", Status: StatusSuccess, OrderID: "0193", Quantity: 2}},
		{"rejected", Result{RequestID: "c.1", CampaignID: "c", UserID: "u", Status: StatusRejected, Reason: ReasonPoison, Quantity: 1,
			FinishedAt: time.Date(2026, 1, 1, 0, 0, 0, 5, time.UTC)}},
		{"escaped", Result{RequestID: "c.<1>", CampaignID: "c", UserID: "é\"", Status: StatusSoldOut, Quantity: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := EncodeResult(tc.r)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			got, err := DecodeResult(b)
			if err != nil || !sameResult(got, tc.r) {
				t.Fatalf("got %+v (%v), want %+v", got, err, tc.r)
			}
		})
	}
	if _, err := DecodeResult([]byte(`{"request_id":"c.1","status":"paid","quantity":1}`)); errField(err) != "status" {
		t.Fatalf("unknown status: got %v, want an InvalidError on status", err)
	}
}

func BenchmarkDecodePurchaseRequest(b *testing.B) {
	msg, _ := EncodePurchaseRequest(validRequest())
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodePurchaseRequest(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := refDecodePurchaseRequest(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkEncodePurchaseRequest(b *testing.B) {
	p := validRequest()
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := EncodePurchaseRequest(p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkResultCodec(b *testing.B) {
	r := Result{RequestID: "spring-sale." + strings.Repeat("ab", 16), CampaignID: "spring-sale", UserID: "alice",
		Status: StatusSuccess, OrderID: "0193c6a2-7b7e-7000-8000-000000000000", Quantity: 1}
	msg, _ := EncodeResult(r)
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = EncodeResult(r)
		}
	})
	b.Run("encode_encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(r)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = DecodeResult(msg)
		}
	})
	b.Run("decode_encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = decodeResultJSON(msg)
		}
	})
}

// providerSubjects are JWT subjects identity providers issue, and the edges
// of what CheckUserID accepts: each must cross every wire form unchanged.
var providerSubjects = []string{
	"auth0|5f7c8ec7b4a1d2006b1f0e3a", "google-oauth2|1234", "Zoë|日本語", `a|b"c\d<e>&{f}`,
	strings.Repeat("é", 127) + "a",
}

// TestPurchaseRequestCarriesAnySubject: a queue message of every provider
// subject decodes to the same request, through wire's codec or its
// encoding/json fallback.
func TestPurchaseRequestCarriesAnySubject(t *testing.T) {
	for _, user := range providerSubjects {
		p := PurchaseRequest{RequestID: "c." + strings.Repeat("ab", 16), CampaignID: "c", UserID: user, Quantity: 1,
			AdmittedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		b, err := EncodePurchaseRequest(p)
		if err != nil {
			t.Fatalf("encode %q: %v", user, err)
		}
		got, err := DecodePurchaseRequest(b)
		p.Version = MessageVersion
		if err != nil || got != p {
			t.Fatalf("decode %s: got %+v, %v; want %+v", b, got, err, p)
		}
		r := Result{RequestID: p.RequestID, CampaignID: "c", UserID: user, Status: StatusSuccess, OrderID: "o", Quantity: 1}
		if b, err = EncodeResult(r); err != nil {
			t.Fatalf("encode result of %q: %v", user, err)
		}
		if back, err := DecodeResult(b); err != nil || back != r {
			t.Fatalf("decode result %s: got %+v, %v; want %+v", b, back, err, r)
		}
	}
}
