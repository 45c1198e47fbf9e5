package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestLoadtestChallenge: with --challenge-bits the tool creates a gated
// campaign and buys through the gate: every purchase carries a fresh,
// solved challenge (none is refused challenge_failed), a replay resends its
// purchase's solution and gets the request back, and the sale keeps every
// invariant. The campaign was gated: a purchase without a solution is
// refused (with an Idempotency-Key, which takes it past the sold-out flag
// to the gate).
func TestLoadtestChallenge(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	campaign := testenv.Name(t, "ltgate-")
	out, err := runLoadtestCmd(t, "--url", c.base, "--admin-token", testAdminToken, "--jwt-secret", testJWTSecret,
		"--campaign", campaign, "--json", "--shoppers", "150", "--stock", "30", "--concurrency", "16",
		"--repeat", "0.2", "--idempotent-share", "0.3", "--results", "poll", "--settle", "30s", "--challenge-bits", "4")
	if err != nil {
		t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	if !rep.InvariantsHolding || rep.Successes != 30 {
		t.Errorf("sale: got invariants ok=%v %+v, %d successes; want all holding, 30", rep.InvariantsHolding, rep.Invariants, rep.Successes)
	}
	for code, n := range rep.Refused {
		if strings.Contains(code, "challenge") {
			t.Errorf("refused %d purchases %s, want none", n, code)
		}
	}
	if rep.Replayed == 0 || len(rep.TransportErrors) > 0 {
		t.Errorf("got %d replays answered, transport errors %v; want some replays and no errors", rep.Replayed, rep.TransportErrors)
	}

	var pub struct {
		ChallengeBits int `json:"challenge_bits"`
	}
	if code := c.do("GET", "/api/v1/campaigns/"+campaign, "", nil, nil, &pub); code != http.StatusOK || pub.ChallengeBits != 4 {
		t.Fatalf("campaign: got %d, challenge_bits %d; want 200, 4", code, pub.ChallengeBits)
	}
	var refusal struct {
		Code string `json:"code"`
	}
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("nobody"), `{}`,
		map[string]string{"Idempotency-Key": "k1"}, &refusal); code != http.StatusForbidden || refusal.Code != "challenge_failed" {
		t.Errorf("purchase without a solution: got %d %q, want 403 challenge_failed", code, refusal.Code)
	}
}

// TestLoadtestChallengeFlags: --challenge-bits within the model's range,
// --challenge-fetch only on an ungated campaign.
func TestLoadtestChallengeFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--challenge-bits", "-1"}, "--challenge-bits"},
		{[]string{"--challenge-bits", "29"}, "--challenge-bits"},
		{[]string{"--challenge-bits", "2", "--challenge-fetch"}, "--challenge-fetch"},
	} {
		_, err := parseLoadtestFlags(tc.args, nil, map[string]string{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error about %s", tc.args, err, tc.want)
		}
	}
	o, err := parseLoadtestFlags([]string{"--challenge-fetch"}, nil, map[string]string{})
	if err != nil || !o.challenge.on() || o.challenge.bits != 0 {
		t.Errorf("--challenge-fetch: got %+v, %v; want fetching, 0 bits", o.challenge, err)
	}
}
