package main

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestClientIPRateLimit: the per-IP limit keys on the peer address unless the
// peer is a configured trusted proxy, so a client cannot dodge it by
// inventing X-Forwarded-For headers.
func TestClientIPRateLimit(t *testing.T) {
	tests := []struct {
		name    string
		trusted []string
		want    []int // status of three purchases from three users, each with its own X-Forwarded-For
	}{
		{name: "forwarded header from an untrusted peer is ignored", want: []int{202, 202, 429}},
		{name: "forwarded header from a trusted proxy is believed", trusted: []string{"127.0.0.1"}, want: []int{202, 202, 202}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := realConfig(t, "memqueue")
			cfg.Gateway.IPRate, cfg.Gateway.IPBurst = 1, 2
			cfg.HTTP.TrustedProxies = tc.trusted
			c := startSystem(t, cfg)
			campaign := testenv.Name(t, "iprl-")
			c.openCampaign(campaign, 10, 1)
			for i, want := range tc.want {
				var body purchaseBody
				hdr := map[string]string{"X-Forwarded-For": fmt.Sprintf("203.0.113.%d", i+1)}
				got := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(fmt.Sprintf("ip%d", i)), `{"quantity":1}`, hdr, &body)
				if got != want {
					t.Fatalf("purchase %d: got %d %q, want %d", i, got, body.Code, want)
				}
				if got == http.StatusTooManyRequests && body.Code != "rate_limited" {
					t.Fatalf("purchase %d: got code %q, want rate_limited", i, body.Code)
				}
			}
		})
	}
}
