package main

import (
	"crypto/sha256"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/challenge"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestChallengeEndToEnd: a gated campaign (challenge_bits stored through
// the admin API) sells to a purchase whose Flashsale-Challenge solves a
// challenge fetched from the gateway, once; the same solution again, or
// none, is 403 challenge_failed and admits nothing.
func TestChallengeEndToEnd(t *testing.T) {
	c := startSystem(t, realConfig(t, "memqueue"))
	id := testenv.Name(t, "gated-")
	c.openCampaignOf(campaignBody{ID: id, Name: "gated", Stock: 10, PerUserLimit: 2, ChallengeBits: 8,
		StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)})
	var pub struct {
		ChallengeBits int `json:"challenge_bits"`
	}
	if code := c.do("GET", "/api/v1/campaigns/"+id, "", nil, nil, &pub); code != http.StatusOK || pub.ChallengeBits != 8 {
		t.Fatalf("public campaign: got %d %+v, want 200 with challenge_bits 8", code, pub)
	}
	alice := c.token("alice")
	var ch struct {
		Challenge string    `json:"challenge"`
		Bits      int       `json:"bits"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if code := c.do("GET", "/api/v1/campaigns/"+id+"/challenge", alice, nil, nil, &ch); code != http.StatusOK || ch.Bits != 8 ||
		!ch.ExpiresAt.After(time.Now()) {
		t.Fatalf("challenge: got %d %+v, want 200, 8 bits, a future expiry", code, ch)
	}
	var solution string
	for n := 0; solution == ""; n++ {
		s := ch.Challenge + "." + strconv.Itoa(n)
		if sum := sha256.Sum256([]byte(s)); challenge.LeadingZeroBits(sum[:]) >= ch.Bits {
			solution = s
		}
	}
	buy := "/api/v1/campaigns/" + id + "/purchases"
	header := map[string]string{"Flashsale-Challenge": solution}
	if code := c.do("POST", buy, alice, `{}`, nil, nil); code != http.StatusForbidden {
		t.Fatalf("without the header: got %d, want 403", code)
	}
	if code := c.do("POST", buy, alice, `{}`, header, nil); code != http.StatusAccepted {
		t.Fatalf("solved: got %d, want 202", code)
	}
	var refusal struct {
		Code string `json:"code"`
	}
	if code := c.do("POST", buy, alice, `{}`, header, &refusal); code != http.StatusForbidden || refusal.Code != "challenge_failed" {
		t.Fatalf("same solution again: got %d %+v, want 403 challenge_failed", code, refusal)
	}
	if st := c.stats(id); st.Admitted != 1 {
		t.Fatalf("admitted: got %d, want 1", st.Admitted)
	}
}
