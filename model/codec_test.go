package model

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The regular expressions the hand-written id checks replaced: the checks
// must accept exactly what these accept.
var (
	refCampaignID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	refUserID     = regexp.MustCompile(`^[A-Za-z0-9_.@:-]{1,128}$`)
	refHexTail    = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

func refCampaignOfRequest(id string) (string, bool) {
	i := strings.LastIndexByte(id, '.')
	if i < 0 || !refCampaignID.MatchString(id[:i]) || !refHexTail.MatchString(id[i+1:]) {
		return "", false
	}
	return id[:i], true
}

func checkIDsMatchRegexps(t *testing.T, s string) {
	t.Helper()
	if got, want := ValidCampaignID(s), refCampaignID.MatchString(s); got != want {
		t.Errorf("ValidCampaignID(%q) = %v, want %v", s, got, want)
	}
	if got, want := ValidUserID(s), refUserID.MatchString(s); got != want {
		t.Errorf("ValidUserID(%q) = %v, want %v", s, got, want)
	}
	gotC, gotOK := CampaignOfRequest(s)
	if wantC, wantOK := refCampaignOfRequest(s); gotC != wantC || gotOK != wantOK {
		t.Errorf("CampaignOfRequest(%q) = %q, %v; want %q, %v", s, gotC, gotOK, wantC, wantOK)
	}
}

func TestIDsMatchRegexps(t *testing.T) {
	hex := strings.Repeat("0a", 16)
	cases := []string{"", "a", "A-z_9", "a b", "a.b", "user@example.com:1", "\x00", "é", "a\n", "\xff",
		strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("u", 128), strings.Repeat("u", 129),
		"c." + hex, "c." + strings.ToUpper(hex), "c." + hex + "0", ".c" + hex, "c.d." + hex, "{c}." + hex}
	// Every single byte, alone and inside an otherwise valid id.
	for c := range 256 {
		cases = append(cases, string([]byte{byte(c)}), "ab"+string([]byte{byte(c)})+"cd", "c."+hex[:31]+string([]byte{byte(c)}))
	}
	for _, s := range cases {
		checkIDsMatchRegexps(t, s)
	}
}

func FuzzIDsMatchRegexps(f *testing.F) {
	f.Add("spring-sale." + strings.Repeat("ab", 16))
	f.Add("alice@example.com")
	f.Add("a b")
	f.Fuzz(checkIDsMatchRegexps)
}

// samePurchase compares two decoded requests, times by instant and zone.
func samePurchase(a, b PurchaseRequest) bool {
	an, ao := a.AcceptedAt.Zone()
	bn, bo := b.AcceptedAt.Zone()
	ta, tb := a.AcceptedAt, b.AcceptedAt
	a.AcceptedAt, b.AcceptedAt = time.Time{}, time.Time{}
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

func checkPurchaseDecodeEquivalent(t *testing.T, b []byte) {
	t.Helper()
	if lite, ok := decodePurchaseRequestLite(b); ok {
		ref, err := decodePurchaseRequestJSON(b)
		if err != nil || !samePurchase(lite, ref) {
			t.Fatalf("%q: hand-written path read %+v, encoding/json %+v (%v)", b, lite, ref, err)
		}
	}
	got, gotErr := DecodePurchaseRequest(b)
	want, wantErr := refDecodePurchaseRequest(b)
	if (gotErr == nil) != (wantErr == nil) || !samePurchase(got, want) {
		t.Fatalf("%q: got %+v (%v), want %+v (%v)", b, got, gotErr, want, wantErr)
	}
	if gotErr != nil && errField(gotErr) != errField(wantErr) {
		t.Fatalf("%q: got error %v, want %v", b, gotErr, wantErr)
	}
}

func errField(err error) string {
	if inv, ok := err.(*InvalidError); ok {
		return inv.Field
	}
	return "?"
}

func checkResultDecodeEquivalent(t *testing.T, b []byte) {
	t.Helper()
	if lite, ok := decodeResultLite(b); ok {
		ref, err := decodeResultJSON(b)
		if err != nil || !sameResult(lite, ref) {
			t.Fatalf("%q: hand-written path read %+v, encoding/json %+v (%v)", b, lite, ref, err)
		}
	}
	got, gotErr := DecodeResult(b)
	var want Result
	wantErr := json.Unmarshal(b, &want)
	if wantErr != nil {
		want = Result{} // json.Unmarshal may have filled some fields
	}
	if wantErr == nil && !want.Status.Valid() {
		want, wantErr = Result{}, Invalid("status", "")
	}
	if (gotErr == nil) != (wantErr == nil) || !sameResult(got, want) {
		t.Fatalf("%q: got %+v (%v), want %+v (%v)", b, got, gotErr, want, wantErr)
	}
}

// decodeSeeds are messages around the hand-written path's edges: each must
// decode exactly as encoding/json decodes it, whichever path takes it.
var decodeSeeds = []string{
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1,"accepted_at":"2026-01-01T00:00:00Z"}`,
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1,"accepted_at":"2026-01-01T00:00:00.123456789+05:30"}`,
	`{"quantity":1,"user_id":"u","campaign_id":"c","request_id":"c.00000000000000000000000000000000","v":1}`,
	`{"v":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1} `,
	` {"v":1}`,
	`{"v":1,"v":2}`,
	`{"V":1,"request_id":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1}`,
	`{"v":1,"Request_ID":"c.00000000000000000000000000000000","campaign_id":"c","user_id":"u","quantity":1}`,
	`{"v":1.0}`, `{"v":1e0}`, `{"v":01}`, `{"v":-0}`, `{"v":-}`, `{"v":99999999999999999999}`, `{"v":null}`,
	`{"v":"1"}`, `{"v":1,"user_id":"\u0061"}`, `{"v":1,"user_id":"é"}`, `{"v":1,"user_id":"a\tb"}`,
	`{"v":1,"extra":true}`, `{}`, `{`, `}`, `[]`, `null`, ``, `{"v":1,}`, `{"v":1}}`, `{"v" :1}`,
	`{"v":1,"accepted_at":"2026-13-01T00:00:00Z"}`, `{"v":1,"accepted_at":"2026-01-01 00:00:00Z"}`,
	`{"v":1,"accepted_at":null}`, `{"v":1,"accepted_at":"24:00"}`,
	`{"request_id":"c.0","campaign_id":"c","user_id":"u","status":"success","order_id":"o","quantity":1}`,
	`{"request_id":"c.0","campaign_id":"c","user_id":"u","status":"rejected","reason":"bad_message","quantity":1,"finished_at":"2026-01-01T00:00:00.5Z"}`,
	`{"request_id":"c.0","status":"paid"}`, `{"status":"success","Status":"sold_out"}`,
}

func TestDecodeEquivalentToEncodingJSON(t *testing.T) {
	for _, s := range decodeSeeds {
		checkPurchaseDecodeEquivalent(t, []byte(s))
		checkResultDecodeEquivalent(t, []byte(s))
	}
}

func FuzzDecodeEquivalentToEncodingJSON(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkPurchaseDecodeEquivalent(t, b)
		checkResultDecodeEquivalent(t, b)
	})
}

// checkEncodeEquivalent: the hand-written encoders write exactly what
// json.Marshal writes (and fail where it fails), so old and new gateways,
// workers and notifiers read each other's messages.
func checkEncodeEquivalent(t *testing.T, s1, s2, s3 string, n int64, at time.Time) {
	t.Helper()
	p := PurchaseRequest{RequestID: s1, CampaignID: s2, UserID: s3, Quantity: n, AcceptedAt: at}
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
