package model

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func validRequest() PurchaseRequest {
	return PurchaseRequest{RequestID: FormatRequestID("spring-sale", strings.Repeat("ab", 16)), CampaignID: "spring-sale",
		UserID: "alice", Quantity: 1, AdmittedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func TestPurchaseRequestRoundTrip(t *testing.T) {
	in := validRequest()
	b, err := EncodePurchaseRequest(in)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	out, err := DecodePurchaseRequest(b)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	in.Version = MessageVersion
	if out != in {
		t.Fatalf("got %+v, want %+v", out, in)
	}
}

func TestDecodePurchaseRequestRefuses(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		field string
	}{
		{name: "not json", body: "{", field: "message"},
		{name: "no version", body: `{"request_id":"c.` + strings.Repeat("0", 32) + `","campaign_id":"c","user_id":"u","quantity":1}`, field: "v"},
		{name: "future version", body: `{"v":2,"request_id":"c.` + strings.Repeat("0", 32) + `","campaign_id":"c","user_id":"u","quantity":1}`, field: "v"},
		{name: "request of another campaign", body: `{"v":1,"request_id":"d.` + strings.Repeat("0", 32) + `","campaign_id":"c","user_id":"u","quantity":1}`, field: "request_id"},
		{name: "bad user", body: `{"v":1,"request_id":"c.` + strings.Repeat("0", 32) + `","campaign_id":"c","user_id":"a\nb","quantity":1}`, field: "user_id"},
		{name: "empty user", body: `{"v":1,"request_id":"c.` + strings.Repeat("0", 32) + `","campaign_id":"c","user_id":"","quantity":1}`, field: "user_id"},
		{name: "zero quantity", body: `{"v":1,"request_id":"c.` + strings.Repeat("0", 32) + `","campaign_id":"c","user_id":"u","quantity":0}`, field: "quantity"},
		{name: "huge quantity", body: `{"v":1,"request_id":"c.` + strings.Repeat("0", 32) + `","campaign_id":"c","user_id":"u","quantity":1001}`, field: "quantity"},
		{name: "bad campaign", body: `{"v":1,"request_id":"c.` + strings.Repeat("0", 32) + `","campaign_id":"c{x}","user_id":"u","quantity":1}`, field: "campaign_id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodePurchaseRequest([]byte(tc.body))
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != tc.field {
				t.Fatalf("got %v, want an InvalidError on %q", err, tc.field)
			}
		})
	}
}

func TestCampaignOfRequest(t *testing.T) {
	hex := strings.Repeat("0f", 16)
	tests := []struct {
		id     string
		want   string
		wantOK bool
	}{
		{id: "spring-sale." + hex, want: "spring-sale", wantOK: true},
		{id: "a_b-c." + hex, want: "a_b-c", wantOK: true},
		{id: "spring-sale", wantOK: false},
		{id: "." + hex, wantOK: false},
		{id: "x." + strings.ToUpper(hex), wantOK: false},
		{id: "x." + hex[:31], wantOK: false},
		{id: "a.b." + hex, wantOK: false},
		{id: strings.Repeat("a", 65) + "." + hex, wantOK: false},
		{id: "{x}." + hex, wantOK: false},
		// A bucket's request names its bucket's tag (BucketTag).
		{id: "spring-sale:0." + hex, want: "spring-sale", wantOK: true},
		{id: "spring-sale:63." + hex, want: "spring-sale", wantOK: true},
		{id: "spring-sale:64." + hex, wantOK: false},
		{id: "spring-sale:07." + hex, wantOK: false},
		{id: "spring-sale:." + hex, wantOK: false},
		{id: "spring-sale:1:2." + hex, wantOK: false},
		{id: ":1." + hex, wantOK: false},
	}
	for _, tc := range tests {
		got, ok := CampaignOfRequest(tc.id)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("CampaignOfRequest(%q) = %q, %v; want %q, %v", tc.id, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestCampaignValidateAndWindow(t *testing.T) {
	start := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	ok := Campaign{ID: "c1", Name: "n", Stock: 1, PerUserLimit: 1, StartAt: start, EndAt: start.Add(time.Hour)}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid campaign: %v", err)
	}
	mutations := []struct {
		name  string
		mut   func(*Campaign)
		field string
	}{
		{"id", func(c *Campaign) { c.ID = "a b" }, "id"},
		{"name", func(c *Campaign) { c.Name = "" }, "name"},
		{"stock zero", func(c *Campaign) { c.Stock = 0 }, "stock"},
		{"stock huge", func(c *Campaign) { c.Stock = MaxStock + 1 }, "stock"},
		{"limit", func(c *Campaign) { c.PerUserLimit = 0 }, "per_user_limit"},
		{"challenge bits negative", func(c *Campaign) { c.ChallengeBits = -1 }, "challenge_bits"},
		{"challenge bits too many", func(c *Campaign) { c.ChallengeBits = MaxChallengeBits + 1 }, "challenge_bits"},
		{"no start", func(c *Campaign) { c.StartAt = time.Time{} }, "start_at"},
		{"end before start", func(c *Campaign) { c.EndAt = c.StartAt }, "end_at"},
	}
	for _, m := range mutations {
		c := ok
		m.mut(&c)
		var inv *InvalidError
		if err := c.Validate(); !errors.As(err, &inv) || inv.Field != m.field {
			t.Errorf("%s: got %v, want an InvalidError on %q", m.name, err, m.field)
		}
	}
	windows := []struct {
		at   time.Time
		want error
	}{
		{start.Add(-time.Nanosecond), ErrNotStarted},
		{start, nil},
		{start.Add(time.Hour - time.Nanosecond), nil},
		{start.Add(time.Hour), ErrEnded},
	}
	for _, w := range windows {
		if got := ok.Window(w.at); !errors.Is(got, w.want) {
			t.Errorf("Window(%s): got %v, want %v", w.at, got, w.want)
		}
	}
}

func TestStatus(t *testing.T) {
	for _, s := range FinalStatuses {
		if !s.Final() || !s.Valid() {
			t.Errorf("%s: got final %v valid %v, want true true", s, s.Final(), s.Valid())
		}
	}
	if StatusQueued.Final() || !StatusQueued.Valid() || Status("paid").Valid() {
		t.Errorf("queued must be valid and not final; unknown statuses invalid")
	}
}

func FuzzDecodePurchaseRequest(f *testing.F) {
	good, _ := EncodePurchaseRequest(validRequest())
	f.Add(good)
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`{"v":1,"quantity":-1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodePurchaseRequest(b)
		if err != nil {
			return
		}
		// Whatever decodes must be valid and survive a round trip.
		if verr := p.Validate(); verr != nil {
			t.Fatalf("decoded an invalid request %+v: %v", p, verr)
		}
		again, err := EncodePurchaseRequest(p)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		p2, err := DecodePurchaseRequest(again)
		if err != nil || !p2.AdmittedAt.Equal(p.AdmittedAt) || p2.RequestID != p.RequestID || p2.Quantity != p.Quantity {
			t.Fatalf("round trip changed %+v into %+v (%v)", p, p2, err)
		}
	})
}

func TestBuckets(t *testing.T) {
	hex := strings.Repeat("0f", 16)
	tests := []struct {
		name     string
		campaign string
		buckets  int
	}{
		{name: "one", campaign: "c", buckets: 1},
		{name: "unset", campaign: "c", buckets: 0},
		{name: "four", campaign: "c", buckets: 4},
		{name: "most", campaign: "spring-sale", buckets: MaxBuckets},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := map[int]bool{}
			for i := range 1000 {
				u := fmt.Sprint("user", i)
				b := BucketOf(u, tt.buckets)
				if b < 0 || b >= max(tt.buckets, 1) || b != BucketOf(u, tt.buckets) {
					t.Fatalf("BucketOf(%q, %d) = %d, want a stable bucket below %d", u, tt.buckets, b, max(tt.buckets, 1))
				}
				seen[b] = true
				tag := UserTag(Campaign{ID: tt.campaign, Buckets: tt.buckets}, u)
				rid := FormatRequestID(tag, hex)
				gotTag, ok := TagOfRequest(rid)
				c, gotB, okSplit := SplitTag(gotTag)
				if !ok || !okSplit || gotTag != tag || c != tt.campaign || gotB != b {
					t.Fatalf("request %q: tag %q (%v), split %q %d (%v); want %q, %s bucket %d", rid, gotTag, ok, c, gotB, okSplit, tag, tt.campaign, b)
				}
				if tt.buckets <= 1 && tag != tt.campaign {
					t.Fatalf("one bucket: tag %q, want the campaign id %q", tag, tt.campaign)
				}
			}
			if len(seen) != max(tt.buckets, 1) {
				t.Errorf("1000 users reached %d buckets, want all %d", len(seen), max(tt.buckets, 1))
			}
		})
	}
}
