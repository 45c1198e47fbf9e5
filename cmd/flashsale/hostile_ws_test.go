package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestHostileWebSocket: hostile WebSocket clients get their exact refusal,
// and nothing they do changes stock, results or orders.
func TestHostileWebSocket(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	cfg.Notifier.AllowedOrigins = []string{"https://shop.example"}
	cfg.Notifier.MaxSubscriptionsPerConn = 8
	cfg.Notifier.PollRate, cfg.Notifier.PollBurst = 1, 5
	cfg.Notifier.SubscribeRate, cfg.Notifier.SubscribeBurst = 1, 16
	c := startSystem(t, cfg)
	campaign := testenv.Name(t, "ws-")
	c.openCampaign(campaign, 5, 1)
	var alicePurchase purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("alice"), `{"quantity":1}`, nil, &alicePurchase); code != http.StatusAccepted {
		t.Fatalf("purchase: got %d", code)
	}
	before := c.settle(campaign, 10*time.Second)

	wsURL := func(token string) string {
		u, _ := url.Parse(c.base)
		u.Scheme, u.Path = "ws", "/api/v1/ws"
		if token != "" {
			u.RawQuery = "access_token=" + url.QueryEscape(token)
		}
		return u.String()
	}
	dial := func(t *testing.T, token, origin string) (*websocket.Conn, int) {
		t.Helper()
		h := http.Header{}
		if origin != "" {
			h.Set("Origin", origin)
		}
		conn, resp, err := websocket.DefaultDialer.Dial(wsURL(token), h)
		if err != nil {
			if resp == nil {
				t.Fatalf("dial: %v", err)
			}
			return nil, resp.StatusCode
		}
		t.Cleanup(func() { conn.Close() })
		return conn, http.StatusSwitchingProtocols
	}
	type frame struct {
		Type      string   `json:"type"`
		Code      string   `json:"code"`
		RequestID string   `json:"request_id"`
		IDs       []string `json:"request_ids"`
	}
	read := func(t *testing.T, conn *websocket.Conn) frame {
		t.Helper()
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		var f frame
		if err := conn.ReadJSON(&f); err != nil {
			t.Fatalf("read: %v", err)
		}
		return f
	}

	t.Run("handshakes", func(t *testing.T) {
		tests := []struct {
			name   string
			token  string
			origin string
			want   int
		}{
			{"no token", "", "https://shop.example", http.StatusUnauthorized},
			{"forged token", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.", "https://shop.example", http.StatusUnauthorized},
			{"foreign origin", c.token("alice"), "https://evil.example", http.StatusForbidden},
			{"allowed origin", c.token("alice"), "https://shop.example", http.StatusSwitchingProtocols},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				if _, got := dial(t, tc.token, tc.origin); got != tc.want {
					t.Fatalf("got %d, want %d", got, tc.want)
				}
			})
		}
	})

	t.Run("another user's request looks unknown", func(t *testing.T) {
		conn, _ := dial(t, c.token("mallory"), "https://shop.example")
		_ = conn.WriteJSON(map[string]any{"type": "subscribe", "request_ids": []string{alicePurchase.RequestID}})
		if f := read(t, conn); f.Type != "error" || f.Code != "not_found" || f.RequestID != alicePurchase.RequestID {
			t.Fatalf("got %+v, want error not_found for alice's request", f)
		}
		if f := read(t, conn); f.Type != "subscribed" || len(f.IDs) != 0 {
			t.Fatalf("got %+v, want subscribed to nothing", f)
		}
	})

	t.Run("malformed frames", func(t *testing.T) {
		conn, _ := dial(t, c.token("alice"), "https://shop.example")
		for _, bad := range []string{`{`, `{"type":"buy"}`, `{"type":"subscribe","request_ids":"x"}`, `{"type":"subscribe","request_ids":[]}`,
			// Keys encoding/json would take leniently (another case, repeated).
			`{"type":"subscribe","Request_IDs":["x"]}`, `{"type":"subscribe","request_ids":[],"request_ids":["x"]}`} {
			_ = conn.WriteMessage(websocket.TextMessage, []byte(bad))
			if f := read(t, conn); f.Type != "error" || f.Code != "invalid_request" {
				t.Fatalf("frame %s: got %+v, want error invalid_request", bad, f)
			}
		}
	})

	t.Run("subscription cap", func(t *testing.T) {
		conn, _ := dial(t, c.token("alice"), "https://shop.example")
		var ids []string
		for i := range 9 {
			ids = append(ids, fmt.Sprintf("%s.%032x", campaign, i+1))
		}
		_ = conn.WriteJSON(map[string]any{"type": "subscribe", "request_ids": ids})
		codes := map[string]int{}
		for {
			f := read(t, conn)
			if f.Type == "subscribed" {
				break
			}
			codes[f.Code]++
		}
		// Interest is registered (up to the cap) before the store is read, so
		// 8 ids are looked up and unknown, and the 9th is over the cap.
		if codes["not_found"] != 8 || codes["too_many_subscriptions"] != 1 {
			t.Fatalf("got %v, want 8 not_found and 1 too_many_subscriptions", codes)
		}
	})

	t.Run("frame flood closes the connection", func(t *testing.T) {
		conn, _ := dial(t, c.token("alice"), "https://shop.example")
		for range 50 {
			if err := conn.WriteMessage(websocket.TextMessage, []byte("garbage")); err != nil {
				break
			}
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		var err error
		for err == nil {
			_, _, err = conn.ReadMessage()
		}
		if !websocket.IsCloseError(err, websocket.ClosePolicyViolation) && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("got %v, want a policy-violation close", err)
		}
	})

	t.Run("oversized frame", func(t *testing.T) {
		conn, _ := dial(t, c.token("alice"), "https://shop.example")
		_ = conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"subscribe","request_ids":["`+strings.Repeat("a", 10000)+`"]}`))
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		var err error
		for err == nil {
			_, _, err = conn.ReadMessage()
		}
		if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("got %v, want the connection closed for a frame above the read limit", err)
		}
	})

	// The budgets below refill on the wall clock, so each check allows for
	// the time its flood took: on the old code every request was served.
	refilled := func(start time.Time, perSecond int) int {
		return int(math.Ceil(time.Since(start).Seconds() * float64(perSecond)))
	}

	t.Run("connections beyond the per-user cap", func(t *testing.T) {
		for range cfg.Notifier.MaxConnsPerUser {
			if conn, got := dial(t, c.token("hoarder"), "https://shop.example"); conn == nil {
				t.Fatalf("got %d within the cap, want 101", got)
			}
		}
		h := http.Header{"Origin": {"https://shop.example"}}
		_, resp, err := websocket.DefaultDialer.Dial(wsURL(c.token("hoarder")), h)
		if resp == nil {
			t.Fatalf("dial: %v", err)
		}
		defer resp.Body.Close()
		var body struct{ Code string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != http.StatusTooManyRequests || body.Code != "too_many_connections" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("got %d %q (Retry-After %q), want 429 too_many_connections with Retry-After", resp.StatusCode, body.Code, resp.Header.Get("Retry-After"))
		}
	})

	t.Run("subscribe flood across reconnects", func(t *testing.T) {
		start, looked, limited := time.Now(), 0, 0
		for range 6 {
			conn, _ := dial(t, c.token("flooder"), "https://shop.example")
			ids := make([]string, cfg.Notifier.MaxSubscriptionsPerConn)
			for i := range ids {
				ids[i] = fmt.Sprintf("%s.%032x", campaign, 1000+looked+limited+i)
			}
			_ = conn.WriteJSON(map[string]any{"type": "subscribe", "request_ids": ids})
			for f := read(t, conn); f.Type != "subscribed"; f = read(t, conn) {
				switch f.Code {
				case "not_found":
					looked++
				case "rate_limited":
					limited++
				default:
					t.Fatalf("got %+v, want not_found or rate_limited", f)
				}
			}
			conn.Close()
		}
		if bound := cfg.Notifier.SubscribeBurst + refilled(start, cfg.Notifier.SubscribeRate); looked > bound {
			t.Fatalf("got %d ids looked up (%d rate_limited), want at most %d", looked, limited, bound)
		}
	})

	t.Run("invalid frames across reconnects", func(t *testing.T) {
		conn, _ := dial(t, c.token("garbler"), "https://shop.example")
		for range 25 {
			_ = conn.WriteMessage(websocket.TextMessage, []byte("garbage"))
		}
		start := time.Now()
		closeErr := func(conn *websocket.Conn) (errs int, err error) {
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			for err == nil {
				if _, _, err = conn.ReadMessage(); err == nil {
					errs++
				}
			}
			return errs, err
		}
		if _, err := closeErr(conn); !websocket.IsCloseError(err, websocket.ClosePolicyViolation) {
			t.Fatalf("got %v, want a policy-violation close", err)
		}
		// A new connection does not renew the allowance: its first bad
		// frame closes it, unless a frame's allowance (one per 30 s) came
		// back meanwhile.
		again, _ := dial(t, c.token("garbler"), "https://shop.example")
		_ = again.WriteMessage(websocket.TextMessage, []byte("garbage"))
		_ = again.WriteMessage(websocket.TextMessage, []byte("garbage"))
		errs, err := closeErr(again)
		if !websocket.IsCloseError(err, websocket.ClosePolicyViolation) || errs > int(time.Since(start)/(30*time.Second)) {
			t.Fatalf("got %d error frames, then %v; want the close at once", errs, err)
		}
	})

	t.Run("poll flood", func(t *testing.T) {
		start, answered := time.Now(), 0
		for i := range 60 {
			rid := fmt.Sprintf("%s.%032x", campaign, 5000+i)
			req, _ := http.NewRequest("GET", c.base+"/api/v1/purchases/"+rid, nil)
			req.Header.Set("Authorization", "Bearer "+c.token("poller"))
			resp, err := c.http.Do(req)
			if err != nil {
				t.Fatalf("poll: %v", err)
			}
			var body struct{ Code string }
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusNotFound && body.Code == "not_found":
				answered++
			case resp.StatusCode == http.StatusTooManyRequests && body.Code == "rate_limited" && resp.Header.Get("Retry-After") != "":
			default:
				t.Fatalf("poll %d: got %d %q (Retry-After %q), want 404 not_found or 429 rate_limited with Retry-After",
					i, resp.StatusCode, body.Code, resp.Header.Get("Retry-After"))
			}
		}
		if bound := cfg.Notifier.PollBurst + refilled(start, cfg.Notifier.PollRate); answered > bound {
			t.Fatalf("got %d of 60 polls answered, want at most %d", answered, bound)
		}
	})

	after := c.stats(campaign)
	if after.Remaining != before.Remaining || after.Admitted != before.Admitted || after.OrdersInDB != before.OrdersInDB {
		t.Fatalf("hostile clients changed state: before %+v, after %+v", before, after)
	}
	if code, r := c.pollDecided("alice", alicePurchase.RequestID); code != http.StatusOK || r.Status != "success" {
		t.Fatalf("alice's result: got %d %s, want 200 success", code, r.Status)
	}
}
