package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// limitedBinary returns a command that runs flashsale limited to
// fileLimit open descriptors (soft and hard, so Go cannot raise it at
// start).
func limitedBinary(t *testing.T, fileLimit int) string {
	t.Helper()
	bin := buildBinary(t)
	limited := filepath.Join(t.TempDir(), "flashsale-limited")
	script := fmt.Sprintf("#!/bin/sh\nulimit -n %d || exit 1\nexec %q \"$@\"\n", fileLimit, bin)
	if err := os.WriteFile(limited, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return limited
}

// TestDescriptorBudgets: the WebSockets' budget (notifier.max_conns, its
// reserve at most half the limit) and the main listener's (http.max_conns,
// its reserve at most a quarter), so WebSockets leave plain HTTP room.
func TestDescriptorBudgets(t *testing.T) {
	ws := func(maxConns, reserve, limit int) int {
		c := config.Default().Notifier
		c.MaxConns, c.FDReserve = maxConns, reserve
		return webSocketBudget(c, limit)
	}
	listener := func(maxConns, reserve, limit int) int {
		c := config.Default().HTTP
		c.MaxConns, c.FDReserve = maxConns, reserve
		return connBudget(c, limit)
	}
	tests := []struct {
		name                         string
		budget                       func(maxConns, reserve, fileLimit int) int
		maxConns, reserve, fileLimit int
		want                         int
	}{
		{"websockets: set explicitly", ws, 500, 256, 1024, 500},
		{"websockets: the limit less the reserve", ws, 0, 256, 65536, 65280},
		{"websockets: the reserve takes at most half", ws, 0, 256, 256, 128},
		{"websockets: no reserve", ws, 0, 0, 1024, 1024},
		{"listener: set explicitly", listener, 500, 128, 1024, 500},
		{"listener: the limit less the reserve", listener, 0, 128, 1024, 896},
		{"listener: the reserve takes at most a quarter", listener, 0, 128, 256, 192},
	}
	for _, tt := range tests {
		if got := tt.budget(tt.maxConns, tt.reserve, tt.fileLimit); got != tt.want {
			t.Errorf("%s: got %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestWebSocketFloodKeepsServiceUp is the attack on a process
// limited to 256 descriptors: one user opening socket after socket, then
// many users filling every WebSocket the process allows. The user is capped
// at notifier.max_conns_per_user (429), the process at its limit less
// notifier.fd_reserve (503), and meanwhile /healthz, purchases, polls and
// the sockets already open keep working; a closed socket frees its slot.
func TestWebSocketFloodKeepsServiceUp(t *testing.T) {
	testenv.SkipShort(t, "a flood of WebSockets")
	const fileLimit, reserve = 256, 128
	budget := fileLimit - reserve
	perUser := config.Default().Notifier.MaxConnsPerUser

	cfg := realConfig(t, "memqueue")
	limited := limitedBinary(t, fileLimit)
	env := append(processEnv(cfg),
		"FLASHSALE_NOTIFIER_FD_RESERVE="+strconv.Itoa(reserve),
		"FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP=100000", // every socket comes from 127.0.0.1
		"FLASHSALE_NOTIFIER_PING_INTERVAL=1h",        // idle sockets must not be dropped for missing pongs
	)
	c := startRole(t, limited, "serve", env).client(t, cfg)
	campaign := testenv.Name(t, "wsflood-")
	c.openCampaign(campaign, 10, 1)

	u, _ := url.Parse(c.base)
	u.Scheme, u.Path = "ws", "/api/v1/ws"
	dialer := &websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	// dial opens a socket as user: the socket (kept open until the whole
	// test ends), or the refusal's status, code and Retry-After.
	outer := t
	dial := func(t *testing.T, user string) (*websocket.Conn, int, string, string) {
		t.Helper()
		q := url.Values{"access_token": {c.token(user)}}
		ws, resp, err := dialer.Dial(u.String()+"?"+q.Encode(), nil)
		if err == nil {
			outer.Cleanup(func() { _ = ws.Close() })
			return ws, http.StatusSwitchingProtocols, "", ""
		}
		if resp == nil {
			t.Fatalf("dial as %s: %v (no answer: the process is out of descriptors?)", user, err)
		}
		defer resp.Body.Close()
		var body struct{ Code string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return nil, resp.StatusCode, body.Code, resp.Header.Get("Retry-After")
	}
	var open []*websocket.Conn

	t.Run("one user is capped", func(t *testing.T) {
		var refusals []string
		for range 5 * perUser {
			ws, status, code, retry := dial(t, "mallory")
			if ws != nil {
				open = append(open, ws)
				continue
			}
			refusals = append(refusals, fmt.Sprintf("%d %s %s", status, code, retry))
		}
		if len(open) != perUser {
			t.Fatalf("got %d sockets for one user, want notifier.max_conns_per_user (%d)", len(open), perUser)
		}
		for _, r := range refusals {
			if r != "429 too_many_connections 5" {
				t.Fatalf("got refusal %q, want 429 too_many_connections with Retry-After 5", r)
			}
		}
	})

	t.Run("the process is capped below its descriptor limit", func(t *testing.T) {
		// At most as many attempts as descriptors: without the budget the
		// process runs out of them before this loop ends.
		status, code, retry := 0, "", ""
		for i := 0; len(open) < fileLimit && status == 0; i++ {
			for range perUser {
				ws, s, cd, ra := dial(t, fmt.Sprintf("crowd-%d", i))
				if ws == nil {
					status, code, retry = s, cd, ra
					break
				}
				open = append(open, ws)
			}
		}
		if len(open) != budget || status != http.StatusServiceUnavailable || code != "unavailable" || retry != "5" {
			t.Fatalf("got %d sockets, then %d %s (Retry-After %q); want %d (limit %d less reserve %d), then 503 unavailable (5)",
				len(open), status, code, retry, budget, fileLimit, reserve)
		}
	})

	t.Run("plain HTTP and open sockets still answer", func(t *testing.T) {
		c.healthyUnderLoad(32)
		// A shopper buys, polls and, on a socket opened before the flood
		// ended, is pushed the result.
		var p purchaseBody
		if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("crowd-0"), `{"quantity":1}`, nil, &p); code != http.StatusAccepted {
			t.Fatalf("purchase: got %d, want 202", code)
		}
		ws := open[perUser] // crowd-0's first socket
		if err := ws.WriteJSON(map[string]any{"type": "subscribe", "request_ids": []string{p.RequestID}}); err != nil {
			t.Fatalf("subscribe: %v", err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(20 * time.Second))
		for {
			var f struct {
				Type   string     `json:"type"`
				Result resultBody `json:"result"`
			}
			if err := ws.ReadJSON(&f); err != nil {
				t.Fatalf("read: %v", err)
			}
			if f.Type == "result" {
				if f.Result.Status != "success" {
					t.Fatalf("got %+v, want success", f.Result)
				}
				break
			}
		}
		if r := c.waitFinal("crowd-0", p.RequestID, 20*time.Second); r.Status != "success" {
			t.Fatalf("poll: got %+v, want success", r)
		}
	})

	t.Run("a closed socket frees its slot", func(t *testing.T) {
		_ = open[0].Close()
		testenv.Eventually(t, 20*time.Second, "a slot after a socket closed", func() (bool, string) {
			ws, status, code, _ := dial(t, "newcomer")
			if ws == nil && status != http.StatusServiceUnavailable {
				t.Fatalf("got %d %s, want 503 until the slot frees, then 101", status, code)
			}
			return ws != nil, fmt.Sprintf("%d %s", status, code)
		})
	})
}
