package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// quiet is how long a connection must stay silent to show that a result was
// not sent twice; tests that check it re-check every 20ms or less.
const quiet = 250 * time.Millisecond

// wsFrame is any server frame.
type wsFrame struct {
	Type       string          `json:"type"`
	RequestIDs []string        `json:"request_ids"`
	Code       string          `json:"code"`
	RequestID  string          `json:"request_id"`
	Message    string          `json:"message"`
	RetryAfter int             `json:"retry_after"`
	Result     json.RawMessage `json:"result"`
}

// wsResult is the result object of a result frame.
type wsResult struct {
	RequestID  string `json:"request_id"`
	CampaignID string `json:"campaign_id"`
	UserID     string `json:"user_id"`
	Status     string `json:"status"`
	Quantity   int64  `json:"quantity"`
	OrderID    string `json:"order_id"`
	Reason     string `json:"reason"`
}

func (h *harness) wsURL(query string) string {
	return "ws" + strings.TrimPrefix(h.srv.URL, "http") + "/api/v1/ws" + query
}

func testDialer() *websocket.Dialer { return &websocket.Dialer{HandshakeTimeout: 3 * time.Second} }

// dial opens a WebSocket as user ("" sends no token) with extra headers.
func (h *harness) dial(t testing.TB, d *websocket.Dialer, user string, header http.Header) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	query := ""
	if user != "" {
		query = "?access_token=" + url.QueryEscape(h.token(t, user))
	}
	ws, resp, err := d.DialContext(mustContext(t), h.wsURL(query), header)
	if ws != nil {
		t.Cleanup(func() { _ = ws.Close() })
	}
	return ws, resp, err
}

func mustDial(t testing.TB, h *harness, user string) *websocket.Conn {
	t.Helper()
	ws, _, err := h.dial(t, testDialer(), user, nil)
	if err != nil {
		t.Fatalf("dial as %s: %v", user, err)
	}
	return ws
}

func mustSend(t testing.TB, ws *websocket.Conn, typ int, data string) {
	t.Helper()
	_ = ws.SetWriteDeadline(time.Now().Add(3 * time.Second))
	if err := ws.WriteMessage(typ, []byte(data)); err != nil {
		t.Fatalf("send %q: %v", data, err)
	}
}

func subscribeFrame(ids ...string) string {
	b, _ := json.Marshal(clientFrame{Type: "subscribe", RequestIDs: ids})
	return string(b)
}

func mustRead(t testing.TB, ws *websocket.Conn) wsFrame {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, data, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("read frame: %v", err)
	}
	var f wsFrame
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("frame %q is not JSON: %v", data, err)
	}
	return f
}

// mustSubscribe subscribes to ids and returns the subscribed ids and the error
// frames that came before the acknowledgement.
func mustSubscribe(t *testing.T, ws *websocket.Conn, ids ...string) (subscribed []string, errs []wsFrame) {
	t.Helper()
	mustSend(t, ws, websocket.TextMessage, subscribeFrame(ids...))
	for {
		f := mustRead(t, ws)
		switch f.Type {
		case "subscribed":
			return f.RequestIDs, errs
		case "error":
			errs = append(errs, f)
		default:
			t.Fatalf("got %s frame before the acknowledgement, want error or subscribed", f.Type)
		}
	}
}

func mustReadResult(t *testing.T, ws *websocket.Conn) wsResult {
	t.Helper()
	f := mustRead(t, ws)
	if f.Type != "result" {
		t.Fatalf("got %+v, want a result frame", f)
	}
	var r wsResult
	if err := json.Unmarshal(f.Result, &r); err != nil {
		t.Fatalf("result %s: %v", f.Result, err)
	}
	return r
}

// expectQuiet checks that nothing arrives on ws for d. The connection is
// unusable for reading afterwards.
func expectQuiet(t *testing.T, ws *websocket.Conn, d time.Duration) {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(d))
	_, data, err := ws.ReadMessage()
	var ne net.Error
	switch {
	case err == nil:
		t.Errorf("got frame %s, want none", data)
	case !errors.As(err, &ne) || !ne.Timeout():
		t.Errorf("got read error %v, want a timeout", err)
	}
}

func checkResult(t *testing.T, got wsResult, want model.Result) {
	t.Helper()
	w := wsResult{RequestID: want.RequestID, CampaignID: want.CampaignID, Status: string(want.Status),
		Quantity: want.Quantity, OrderID: want.OrderID, Reason: want.Reason}
	if got != w {
		t.Errorf("got result %+v, want %+v", got, w)
	}
}

func TestWSDelivery(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		tabs         int  // connections of the same shopper
		decideBefore bool // the result is final before the subscription
		decideAfter  bool // the result becomes final after the subscription
		publishes    int  // publications after the subscription
	}{
		{name: "already final", tabs: 1, decideBefore: true, publishes: 1},
		{name: "published after subscribe", tabs: 1, decideAfter: true, publishes: 1},
		{name: "published twice", tabs: 1, decideAfter: true, publishes: 2},
		{name: "publication lost, re-check delivers", tabs: 1, decideAfter: true, publishes: 0},
		{name: "two tabs", tabs: 2, decideAfter: true, publishes: 1},
	}
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			t.Parallel()
			e := impl.make(t)
			h := newHarness(t, e.src, Options{RecheckInterval: 20 * time.Millisecond})
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					id := e.newRequest(t, "alice")
					var r model.Result
					if tt.decideBefore {
						r = e.decide(t, id, "alice")
					}
					delivered := h.m.ResultsDelivered.WithLabelValues("ws")
					before := counterValue(delivered)
					tabs := make([]*websocket.Conn, tt.tabs)
					for i := range tabs {
						tabs[i] = mustDial(t, h, "alice")
						subscribed, errs := mustSubscribe(t, tabs[i], id)
						if !slices.Equal(subscribed, []string{id}) || len(errs) != 0 {
							t.Fatalf("got subscribed %v and errors %+v, want [%s] and none", subscribed, errs, id)
						}
					}
					if tt.decideAfter {
						r = e.decide(t, id, "alice")
					}
					for range tt.publishes {
						e.publish(t, r)
					}
					for _, ws := range tabs {
						checkResult(t, mustReadResult(t, ws), r)
					}
					for _, ws := range tabs {
						expectQuiet(t, ws, quiet)
					}
					want := before + float64(tt.tabs)
					testenv.Eventually(t, 3*time.Second, fmt.Sprintf("%v ws deliveries", want), func() (bool, string) {
						got := counterValue(delivered)
						return got == want, fmt.Sprintf("%v delivered", got)
					})
				})
			}
		})
	}
}

// TestWSResultDuringCheck makes the result final right after the stored read
// that a subscription starts with, the window a naive "read, then subscribe"
// would lose.
func TestWSResultDuringCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		publish bool
		recheck time.Duration
	}{
		// The re-check is off in effect: the hub must hand over what was
		// published while the subscription was pending.
		{name: "published during the read", publish: true, recheck: time.Hour},
		{name: "stored during the read, publication lost", publish: false, recheck: 20 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, f := fakeEnv(t)
			h := newHarness(t, f, Options{RecheckInterval: tt.recheck})
			id := e.newRequest(t, "alice")
			final := successResult(id, "alice")
			var once sync.Once
			f.setAfterRead(func(requestID string) {
				if requestID != id {
					return
				}
				once.Do(func() {
					f.store(final)
					if tt.publish {
						f.announce(final)
					}
				})
			})
			ws := mustDial(t, h, "alice")
			if subscribed, _ := mustSubscribe(t, ws, id); !slices.Equal(subscribed, []string{id}) {
				t.Fatalf("got subscribed %v, want [%s]", subscribed, id)
			}
			checkResult(t, mustReadResult(t, ws), final)
			f.announce(final)
			expectQuiet(t, ws, quiet)
		})
	}
}

// TestWSExactlyOnceUnderConcurrency races subscriptions against results that
// are stored and published several times each, while the re-check runs.
func TestWSExactlyOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	// The send buffer holds every result at once: a writer starved of CPU
	// must not get this client dropped as slow (TestWSSlowClientDropped
	// tests that), only never send a result twice.
	const n = 100
	h := newHarness(t, f, Options{RecheckInterval: 5 * time.Millisecond, ReadLimit: 1 << 16, MaxSubscriptionsPerConn: 1000,
		SendBuffer: 2 * n})
	ids := make([]string, n)
	for i := range ids {
		ids[i] = e.newRequest(t, "alice")
	}
	ws := mustDial(t, h, "alice")
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			<-start
			r := successResult(id, "alice")
			f.store(r)
			for range 3 {
				f.announce(r)
			}
		})
	}
	mustSend(t, ws, websocket.TextMessage, subscribeFrame(ids...))
	close(start)
	ack := mustRead(t, ws)
	if ack.Type != "subscribed" || len(ack.RequestIDs) != n {
		t.Fatalf("got first frame %s with %d ids, want subscribed with %d", ack.Type, len(ack.RequestIDs), n)
	}
	seen := map[string]bool{}
	for len(seen) < n {
		r := mustReadResult(t, ws)
		if seen[r.RequestID] {
			t.Errorf("got result of %s twice, want once", r.RequestID)
		}
		seen[r.RequestID] = true
	}
	wg.Wait()
	expectQuiet(t, ws, quiet)
	if got := h.n.hub.size(); got != 0 {
		t.Errorf("got %d request ids left in the hub, want 0", got)
	}
}

func TestWSRefusals(t *testing.T) {
	t.Parallel()
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			t.Parallel()
			e := impl.make(t)
			h := newHarness(t, e.src, Options{RecheckInterval: 20 * time.Millisecond})
			bobs := e.newRequest(t, "bob")
			tests := []struct {
				name      string
				requestID string
			}{
				{name: "other user's request", requestID: bobs},
				{name: "unknown request", requestID: newRequestID(t, e.campaign)},
				{name: "malformed request id", requestID: "nope"},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					ws := mustDial(t, h, "alice")
					subscribed, errs := mustSubscribe(t, ws, tt.requestID)
					if len(subscribed) != 0 {
						t.Errorf("got subscribed %v, want none", subscribed)
					}
					if len(errs) != 1 || errs[0].Code != "not_found" || errs[0].RequestID != tt.requestID {
						t.Errorf("got errors %+v, want one not_found for %s", errs, tt.requestID)
					}
				})
			}
			t.Run("other user's result is not pushed", func(t *testing.T) {
				ws := mustDial(t, h, "alice")
				own := e.newRequest(t, "alice")
				if subscribed, _ := mustSubscribe(t, ws, bobs, own); !slices.Equal(subscribed, []string{own}) {
					t.Fatalf("got subscribed %v, want [%s]", subscribed, own)
				}
				e.publish(t, e.decide(t, bobs, "bob"))
				r := e.decide(t, own, "alice")
				e.publish(t, r)
				checkResult(t, mustReadResult(t, ws), r)
				expectQuiet(t, ws, quiet)
			})
		})
	}
}

func TestWSSubscriptionCap(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{MaxSubscriptionsPerConn: 2})
	a, b, c, d := e.newRequest(t, "alice"), e.newRequest(t, "alice"), e.newRequest(t, "alice"), e.newRequest(t, "alice")
	ws := mustDial(t, h, "alice")
	steps := []struct {
		name           string
		publish        string // request id made final and published first
		subscribe      []string
		wantSubscribed []string
		wantRefused    []string // too_many_subscriptions
	}{
		{name: "over the cap in one frame", subscribe: []string{a, b, c}, wantSubscribed: []string{a, b}, wantRefused: []string{c}},
		{name: "existing id counts once", subscribe: []string{a, d}, wantSubscribed: []string{a}, wantRefused: []string{d}},
		{name: "delivery frees a slot", publish: a, subscribe: []string{d}, wantSubscribed: []string{d}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.publish != "" {
				r := e.decide(t, st.publish, "alice")
				e.publish(t, r)
				checkResult(t, mustReadResult(t, ws), r)
			}
			subscribed, errs := mustSubscribe(t, ws, st.subscribe...)
			if !slices.Equal(subscribed, st.wantSubscribed) {
				t.Errorf("got subscribed %v, want %v", subscribed, st.wantSubscribed)
			}
			var refused []string
			for _, f := range errs {
				if f.Code != "too_many_subscriptions" {
					t.Errorf("got error code %s, want too_many_subscriptions", f.Code)
				}
				refused = append(refused, f.RequestID)
			}
			if !slices.Equal(refused, st.wantRefused) {
				t.Errorf("got refused %v, want %v", refused, st.wantRefused)
			}
		})
	}
}

func TestWSHandshake(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		allowed    []string
		origin     string // "self" is the test server's own origin
		user       string
		bearer     bool // token in the Authorization header instead of the query
		wantStatus int
		wantCode   string
	}{
		{name: "same origin by default", origin: "self", user: "alice", wantStatus: http.StatusSwitchingProtocols},
		{name: "no origin header", user: "alice", wantStatus: http.StatusSwitchingProtocols},
		{name: "foreign origin by default", origin: "https://evil.example", user: "alice", wantStatus: http.StatusForbidden, wantCode: "forbidden"},
		{name: "listed origin", allowed: []string{"https://shop.example/"}, origin: "https://shop.example", user: "alice", wantStatus: http.StatusSwitchingProtocols},
		{name: "unlisted origin", allowed: []string{"https://shop.example"}, origin: "https://evil.example", user: "alice", wantStatus: http.StatusForbidden, wantCode: "forbidden"},
		{name: "own origin not listed", allowed: []string{"https://shop.example"}, origin: "self", user: "alice", wantStatus: http.StatusForbidden, wantCode: "forbidden"},
		{name: "wildcard", allowed: []string{"*"}, origin: "https://evil.example", user: "alice", wantStatus: http.StatusSwitchingProtocols},
		{name: "no token", wantStatus: http.StatusUnauthorized, wantCode: "unauthorized"},
		{name: "bearer header", user: "alice", bearer: true, wantStatus: http.StatusSwitchingProtocols},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, newFakeSource(), Options{AllowedOrigins: tt.allowed})
			header := http.Header{}
			switch tt.origin {
			case "":
			case "self":
				header.Set("Origin", h.srv.URL)
			default:
				header.Set("Origin", tt.origin)
			}
			user := tt.user
			if tt.bearer {
				header.Set("Authorization", "Bearer "+h.token(t, tt.user))
				user = ""
			}
			_, resp, err := h.dial(t, testDialer(), user, header)
			if resp == nil {
				t.Fatalf("dial: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("got status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if tt.wantCode != "" {
				var body struct{ Code string }
				if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Code != tt.wantCode {
					t.Errorf("got code %q (%v), want %s", body.Code, err, tt.wantCode)
				}
			}
		})
	}
}

func TestWSInvalidFrames(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{})
	tests := []struct {
		name string
		typ  int
		data string
	}{
		{name: "binary frame", typ: websocket.BinaryMessage, data: subscribeFrame(newRequestID(t, e.campaign))},
		{name: "not JSON", typ: websocket.TextMessage, data: "hello"},
		{name: "unknown type", typ: websocket.TextMessage, data: `{"type":"unsubscribe","request_ids":["x"]}`},
		{name: "no request ids", typ: websocket.TextMessage, data: `{"type":"subscribe","request_ids":[]}`},
		{name: "empty request id", typ: websocket.TextMessage, data: `{"type":"subscribe","request_ids":[""]}`},
		{name: "unknown field", typ: websocket.TextMessage, data: `{"type":"subscribe","request_ids":["x"],"extra":1}`},
		{name: "wrong type", typ: websocket.TextMessage, data: `{"type":"subscribe","request_ids":"x"}`},
		{name: "trailing data", typ: websocket.TextMessage, data: `{"type":"subscribe","request_ids":["x"]} {}`},
		// {id} stands for a request of alice's, which encoding/json would
		// subscribe to.
		{name: "key in another case", typ: websocket.TextMessage, data: `{"type":"subscribe","Request_IDs":["{id}"]}`},
		{name: "repeated key", typ: websocket.TextMessage, data: `{"type":"subscribe","request_ids":[],"request_ids":["{id}"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := mustDial(t, h, "alice")
			mustSend(t, ws, tt.typ, strings.ReplaceAll(tt.data, "{id}", e.newRequest(t, "alice")))
			got := mustRead(t, ws)
			if got.Type != "error" || got.Code != "invalid_request" || got.Message == "" {
				t.Errorf("got %+v, want an invalid_request error with a message", got)
			}
			// The connection stays usable.
			id := e.newRequest(t, "alice")
			if subscribed, _ := mustSubscribe(t, ws, id); !slices.Equal(subscribed, []string{id}) {
				t.Errorf("got subscribed %v, want [%s]", subscribed, id)
			}
		})
	}
}

// TestWSInvalidFrameFlood: a user's bad frames are answered until its
// allowance is spent, then the connection is closed (1008); the allowance is
// the user's, so a new connection does not renew it, and comes back only
// with time. The limits' clock is stopped, so the counts are exact.
func TestWSInvalidFrameFlood(t *testing.T) {
	t.Parallel()
	clock := newStoppedClock()
	h := newHarness(t, newFakeSource(), Options{now: clock.now})
	steps := []struct {
		name       string
		advance    time.Duration
		user       string
		frames     int
		wantErrors int
		wantClose  bool
	}{
		{name: "a flood closes the connection", user: "alice", frames: maxInvalidFrames + 5, wantErrors: maxInvalidFrames - 1, wantClose: true},
		{name: "reconnecting does not renew the allowance", user: "alice", frames: 1, wantClose: true},
		{name: "another user has its own", user: "bob", frames: 1, wantErrors: 1},
		{name: "time gives one frame back", advance: invalidFrameRefill, user: "alice", frames: 2, wantErrors: 1, wantClose: true},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clock.advance(st.advance)
			ws := mustDial(t, h, st.user)
			for range st.frames {
				mustSend(t, ws, websocket.TextMessage, "garbage")
			}
			errs := 0
			for errs < st.frames {
				_ = ws.SetReadDeadline(time.Now().Add(3 * time.Second))
				_, data, err := ws.ReadMessage()
				if err != nil {
					if !st.wantClose || !websocket.IsCloseError(err, websocket.ClosePolicyViolation) {
						t.Errorf("got %v, want close %d (policy violation): %v", err, websocket.ClosePolicyViolation, st.wantClose)
					}
					st.wantClose = false
					break
				}
				if !strings.Contains(string(data), `"invalid_request"`) {
					t.Errorf("got frame %s, want invalid_request errors", data)
				}
				errs++
			}
			if errs != st.wantErrors || st.wantClose {
				t.Errorf("got %d error frames (and still open: %v), want %d", errs, st.wantClose, st.wantErrors)
			}
			_ = ws.Close()
		})
	}
	testenv.Eventually(t, 3*time.Second, "no WebSocket clients", func() (bool, string) {
		n := gaugeValue(h.m.WebSocketClients)
		return n == 0, fmt.Sprintf("%v clients", n)
	})
}

// TestWSConnectionCaps: upgrades beyond a user's or an address's cap are
// refused with 429 too_many_connections, beyond the process's budget with
// 503 unavailable, each with Retry-After and without keeping the refused
// connection; the connections already open and other users are unaffected.
func TestWSConnectionCaps(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{MaxConnsPerUser: 2, MaxConnsPerIP: 3, MaxConns: 6})
	// Connections are the whole test's, not a step's: they stay open.
	outer := t
	dialFrom := func(user, ip string) (*websocket.Conn, *http.Response, error) {
		return h.dial(outer, testDialer(), user, http.Header{"X-Forwarded-For": {ip}})
	}
	var open []*websocket.Conn
	steps := []struct {
		name       string
		user, ip   string
		wantStatus int
		wantCode   string
	}{
		{name: "alice's first", user: "alice", ip: "10.0.0.1", wantStatus: http.StatusSwitchingProtocols},
		{name: "alice's second", user: "alice", ip: "10.0.0.1", wantStatus: http.StatusSwitchingProtocols},
		{name: "alice over her cap", user: "alice", ip: "10.0.0.1", wantStatus: http.StatusTooManyRequests, wantCode: "too_many_connections"},
		{name: "alice over her cap from elsewhere", user: "alice", ip: "10.0.0.2", wantStatus: http.StatusTooManyRequests, wantCode: "too_many_connections"},
		{name: "bob on alice's address", user: "bob", ip: "10.0.0.1", wantStatus: http.StatusSwitchingProtocols},
		{name: "carol over the address's cap", user: "carol", ip: "10.0.0.1", wantStatus: http.StatusTooManyRequests, wantCode: "too_many_connections"},
		{name: "carol elsewhere", user: "carol", ip: "10.0.0.2", wantStatus: http.StatusSwitchingProtocols},
		{name: "dave", user: "dave", ip: "10.0.0.3", wantStatus: http.StatusSwitchingProtocols},
		{name: "erin fills the budget", user: "erin", ip: "10.0.0.4", wantStatus: http.StatusSwitchingProtocols},
		{name: "frank over the process's budget", user: "frank", ip: "10.0.0.5", wantStatus: http.StatusServiceUnavailable, wantCode: "unavailable"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			ws, resp, err := dialFrom(st.user, st.ip)
			if resp == nil {
				t.Fatalf("dial: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != st.wantStatus {
				t.Fatalf("got status %d, want %d", resp.StatusCode, st.wantStatus)
			}
			if ws != nil {
				open = append(open, ws)
				return
			}
			var body struct{ Code string }
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Code != st.wantCode {
				t.Errorf("got code %q (%v), want %s", body.Code, err, st.wantCode)
			}
			if got := resp.Header.Get("Retry-After"); got != "5" {
				t.Errorf("got Retry-After %q, want 5", got)
			}
			if !resp.Close {
				t.Error("got a refused connection kept alive, want Connection: close")
			}
		})
	}
	if len(open) != 6 {
		t.Fatalf("dialled %d WebSocket clients, want 6", len(open))
	}
	// A connection is counted once its 101 is written (track), which
	// the client may read first.
	testenv.Eventually(t, 3*time.Second, "6 WebSocket clients counted", func() (bool, string) {
		got := gaugeValue(h.m.WebSocketClients)
		return got == 6, fmt.Sprintf("%v clients", got)
	})

	t.Run("open connections keep working", func(t *testing.T) {
		id := e.newRequest(t, "alice")
		if subscribed, _ := mustSubscribe(t, open[0], id); !slices.Equal(subscribed, []string{id}) {
			t.Fatalf("got subscribed %v, want [%s]", subscribed, id)
		}
		r := e.decide(t, id, "alice")
		e.publish(t, r)
		checkResult(t, mustReadResult(t, open[0]), r)
		if status, body := mustGet(t, h, "alice", "/api/v1/purchases/"+id); status != http.StatusOK {
			t.Errorf("poll at the cap: got %d %v, want 200", status, body)
		}
	})

	t.Run("a closed connection frees its slot", func(t *testing.T) {
		_ = open[0].Close()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ws, resp, err := dialFrom("frank", "10.0.0.5")
			if ws != nil {
				return
			}
			if resp == nil {
				t.Fatalf("dial: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("got status %d, want 503 until the slot frees, then 101", resp.StatusCode)
			}
			if time.Now().After(deadline) {
				t.Fatal("no slot 10s after a connection closed")
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// TestWSSubscribeBudget: the request ids a user subscribes to come out of
// one budget shared by its connections (each costs a stored-result read);
// ids beyond it are refused with rate_limited before any read, reconnecting
// does not renew it, and other users are unaffected. The limits' clock is
// stopped, so the counts are exact.
func TestWSSubscribeBudget(t *testing.T) {
	t.Parallel()
	const burst = 10
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			t.Parallel()
			e := impl.make(t)
			clock := newStoppedClock()
			h := newHarness(t, e.src, Options{SubscribeRate: 1, SubscribeBurst: burst, now: clock.now})
			unknown := func(n int) []string {
				ids := make([]string, n)
				for i := range ids {
					ids[i] = newRequestID(t, e.campaign)
				}
				return ids
			}
			outer := t // connections outlive the step that opens them
			ws := mustDial(outer, h, "mallory")
			steps := []struct {
				name          string
				advance       time.Duration
				reconnect     bool // a new connection, the previous one closed
				ids           int
				wantNotFound  int // looked up: unknown
				wantRateLimit int // refused before any read
			}{
				{name: "within the budget", ids: 8, wantNotFound: 8},
				{name: "a new connection shares it", reconnect: true, ids: 8, wantNotFound: 2, wantRateLimit: 6},
				{name: "spent", ids: 5, wantRateLimit: 5},
				{name: "a second refills one id", advance: time.Second, ids: 5, wantNotFound: 1, wantRateLimit: 4},
			}
			for _, st := range steps {
				t.Run(st.name, func(t *testing.T) {
					clock.advance(st.advance)
					if st.reconnect {
						_ = ws.Close()
						ws = mustDial(outer, h, "mallory")
					}
					before := e.reads()
					subscribed, errs := mustSubscribe(t, ws, unknown(st.ids)...)
					codes := map[string]int{}
					for _, f := range errs {
						codes[f.Code]++
						if f.Code == "rate_limited" && f.RetryAfter != 1 {
							t.Errorf("got retry_after %d, want 1", f.RetryAfter)
						}
					}
					if len(subscribed) != 0 || len(errs) != st.ids || codes["not_found"] != st.wantNotFound || codes["rate_limited"] != st.wantRateLimit {
						t.Errorf("got subscribed %v and errors %v, want %d not_found and %d rate_limited", subscribed, codes, st.wantNotFound, st.wantRateLimit)
					}
					if got := e.reads() - before; got != int64(st.wantNotFound) {
						t.Errorf("got %d stored-result reads, want %d", got, st.wantNotFound)
					}
				})
			}
			t.Run("other users are unaffected", func(t *testing.T) {
				id := e.newRequest(t, "alice")
				ws := mustDial(t, h, "alice")
				if subscribed, errs := mustSubscribe(t, ws, id); !slices.Equal(subscribed, []string{id}) || len(errs) != 0 {
					t.Fatalf("got subscribed %v and errors %+v, want [%s]", subscribed, errs, id)
				}
				r := e.decide(t, id, "alice")
				e.publish(t, r)
				checkResult(t, mustReadResult(t, ws), r)
			})
		})
	}
}

// smallBuffers keeps TCP buffers small so that a client that stops reading
// backs up into the server's send queue quickly.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

func TestWSSlowClientDropped(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	srv := httptest.NewUnstartedServer(nil)
	srv.Listener = smallBuffers{srv.Listener}
	h := startHarness(t, f, Options{SendBuffer: 4, MaxSubscriptionsPerConn: 1000, SubscribeBurst: 1000, ReadLimit: 1 << 20,
		RecheckInterval: time.Hour}, srv)

	const n = 300
	slowIDs := make([]string, n)
	for i := range slowIDs {
		slowIDs[i] = e.newRequest(t, "sam")
	}
	slowDialer := testDialer()
	slowDialer.NetDialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4096)
		}
		return c, err
	}
	slow, _, err := h.dial(t, slowDialer, "sam", nil)
	if err != nil {
		t.Fatalf("dial slow client: %v", err)
	}
	if subscribed, _ := mustSubscribe(t, slow, slowIDs...); len(subscribed) != n {
		t.Fatalf("got %d subscribed, want %d", len(subscribed), n)
	}
	fastID := e.newRequest(t, "fay")
	fast := mustDial(t, h, "fay")
	if subscribed, _ := mustSubscribe(t, fast, fastID); !slices.Equal(subscribed, []string{fastID}) {
		t.Fatalf("got subscribed %v, want [%s]", subscribed, fastID)
	}

	// The slow client stops reading; its results are big.
	published := make(chan struct{})
	go func() {
		defer close(published)
		big := strings.Repeat("x", 16<<10)
		for _, id := range slowIDs {
			r := model.Result{RequestID: id, CampaignID: e.campaign, UserID: "sam", Status: model.StatusRejected, Quantity: 1, Reason: big}
			f.store(r)
			f.announce(r)
		}
		r := successResult(fastID, "fay")
		f.store(r)
		f.announce(r)
	}()
	select {
	case <-published:
	case <-time.After(5 * time.Second):
		t.Fatal("publishing blocked on a slow client for 5s")
	}
	checkResult(t, mustReadResult(t, fast), successResult(fastID, "fay"))
	testenv.Eventually(t, 30*time.Second, "the slow client dropped", func() (bool, string) {
		n := gaugeValue(h.m.WebSocketClients)
		return n == 1, fmt.Sprintf("%v clients", n)
	})

	got := 0
	for {
		_ = slow.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, _, err := slow.ReadMessage(); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("slow client still open after %d results, want it closed", got)
			}
			break
		}
		got++
	}
	t.Logf("slow client got %d results before the drop", got)
	if got >= n {
		t.Errorf("slow client got %d results, want fewer than %d (dropped)", got, n)
	}
}

func TestShutdown(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{})
	users := []string{"alice", "bob"}
	closed := make(chan error, len(users))
	for _, u := range users {
		ws := mustDial(t, h, u)
		mustSubscribe(t, ws, e.newRequest(t, u))
		go func() {
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					closed <- err
					return
				}
			}
		}()
	}
	if got := gaugeValue(h.m.WebSocketClients); got != 2 {
		t.Fatalf("got %v WebSocket clients, want 2", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	h.n.Shutdown(ctx)
	if d := time.Since(start); d > time.Second {
		t.Errorf("Shutdown took %v, want well under a second when clients answer the close", d)
	}
	for range users {
		select {
		case err := <-closed:
			if !websocket.IsCloseError(err, websocket.CloseGoingAway) {
				t.Errorf("got %v, want close %d (going away)", err, websocket.CloseGoingAway)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("client not closed 3s after Shutdown")
		}
	}
	if got := gaugeValue(h.m.WebSocketClients); got != 0 {
		t.Errorf("got %v WebSocket clients after Shutdown, want 0", got)
	}
	_, resp, err := h.dial(t, testDialer(), "alice", nil)
	if resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("got response %v (%v) after Shutdown, want 503", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}
