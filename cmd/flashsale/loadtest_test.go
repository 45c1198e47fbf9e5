package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// runLoadtestCmd runs `flashsale loadtest args...` as main would, bounded in
// time, and returns its output and error.
func runLoadtestCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, append([]string{"loadtest", "--progress=false"}, args...), &out, map[string]string{}, logTo(io.Discard))
	return out.String(), err
}

// TestLoadtestEmbedded runs small sales against the in-process embedded
// serve and checks the JSON report: every invariant holds, the counts add up
// and the exit status is success.
func TestLoadtestEmbedded(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantWS   bool // some results came over WebSocket
		wantPoll bool // some results were polled
	}{
		{"closed loop, WebSocket results", []string{"--results", "ws", "--concurrency", "32"}, true, false},
		{"open loop, polled results", []string{"--results", "poll", "--rate", "3000"}, false, true},
		// 12 sockets: 6 HTTP connections and 6 WebSockets for up to ~100 waiting shoppers.
		{"socket budget forces polling", []string{"--results", "ws", "--concurrency", "8", "--max-sockets", "12"}, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--json", "--shoppers", "400", "--stock", "60", "--per-user-limit", "1",
				"--repeat", "0.2", "--idempotent-share", "0.2", "--settle", "20s"}, tt.args...)
			out, err := runLoadtestCmd(t, args...)
			if err != nil {
				t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
			}
			var rep report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("report is not JSON: %v\n%s", err, out)
			}
			if !rep.InvariantsHolding || len(rep.Invariants) == 0 {
				t.Errorf("invariants: got ok=%v %+v, want all holding", rep.InvariantsHolding, rep.Invariants)
			}
			if rep.Successes != 60 || rep.Server.OrdersInDB != 60 {
				t.Errorf("successes: got %d (orders in DB %d), want 60 (stock)", rep.Successes, rep.Server.OrdersInDB)
			}
			if rep.Delivered != rep.Admitted || rep.ByChannel["ws"]+rep.ByChannel["poll"] != rep.Delivered {
				t.Errorf("results: got %d delivered (%v) for %d admitted, want one each", rep.Delivered, rep.ByChannel, rep.Admitted)
			}
			if got := rep.ByChannel["ws"] > 0; got != tt.wantWS {
				t.Errorf("results by channel %v: got some over ws %v, want %v", rep.ByChannel, got, tt.wantWS)
			}
			if got := rep.Sockets.WebSocketsOpened > 0; got != tt.wantWS {
				t.Errorf("WebSockets opened: got %d, want some %v", rep.Sockets.WebSocketsOpened, tt.wantWS)
			}
			if got := rep.ByChannel["poll"] > 0; got != tt.wantPoll {
				t.Errorf("results by channel %v: got some polled %v, want %v", rep.ByChannel, got, tt.wantPoll)
			}
			if rep.Polls < rep.ByChannel["poll"] || (rep.Polls > 0) != tt.wantPoll {
				t.Errorf("polls: got %d sent for %d polled results, want at least one each (and none without)", rep.Polls, rep.ByChannel["poll"])
			}
			checkHTTPReport(t, rep, tt.wantWS)
			if rr := rep.Reread; !rr.Done || rr.Successes != 60 || rr.Confirmed != 60 || rr.Retracted != 0 {
				t.Errorf("re-read: got %+v, want 60 successes re-read, all confirmed", rr)
			}
			if u := rep.Unfinished; u.Count != 0 || u.Vanished != 0 {
				t.Errorf("unfinished: got %+v, want none", u)
			}
			if rep.Requests < 400 || rep.AdmitLatency.Max <= 0 || rep.ResultLatency.P50 <= 0 {
				t.Errorf("measurements: got %d requests, admit max %v ms, result p50 %v ms; want >= 400 and positive latencies",
					rep.Requests, rep.AdmitLatency.Max, rep.ResultLatency.P50)
			}
		})
	}
}

// checkHTTPReport checks the answers by route of a run without faults:
// every purchase answered (202 for each admitted request), polls and
// WebSocket upgrades where the run used them, none without an answer.
func checkHTTPReport(t *testing.T, rep report, wantWS bool) {
	t.Helper()
	buy, ok := rep.HTTP[routePurchase]
	if !ok || buy.ByStatus["202"] != rep.Admitted || buy.Answer.Max <= 0 {
		t.Errorf("purchases: got %+v, want 202 %d times and a time to answer", buy, rep.Admitted)
	}
	// The re-read polls in every run.
	if poll := rep.HTTP[routePoll]; poll.ByStatus["200"] < rep.ByChannel["poll"]+rep.Reread.Successes {
		t.Errorf("polls: got %+v, want 200 at least %d times", poll, rep.ByChannel["poll"]+rep.Reread.Successes)
	}
	if got := rep.HTTP[routeWS].ByStatus["101"]; got != rep.Sockets.WebSocketsOpened || (got > 0) != wantWS {
		t.Errorf("WebSocket upgrades: got %d answered 101, want %d (some: %v)", got, rep.Sockets.WebSocketsOpened, wantWS)
	}
	longest := 0.0
	for route, rr := range rep.HTTP {
		longest = max(longest, rr.Answer.Max)
		if len(rr.NoAnswer) > 0 {
			t.Errorf("%s: got requests without an answer %v, want none", route, rr.NoAnswer)
		}
	}
	if rep.NoAnswer != 0 || rep.LongestAnswerMs != longest || longest <= 0 {
		t.Errorf("got longest answer %v ms (routes' max %v), %d without an answer; want the routes' max and none", rep.LongestAnswerMs, longest, rep.NoAnswer)
	}
}

// TestLoadtestCrowd: with --ws-per-shopper against the in-process serve,
// every shopper connects within the window before the sale and waits on
// that one socket for all its results; the sale keeps every invariant,
// the notifier saw one upgrade per shopper, and the report carries the
// connect times and the notifier's figures.
func TestLoadtestCrowd(t *testing.T) {
	testenv.SkipShort(t, "a load test")
	const shoppers = 300
	out, err := runLoadtestCmd(t, "--json", "--shoppers", strconv.Itoa(shoppers), "--stock", "60", "--per-user-limit", "1",
		"--repeat", "0.2", "--idempotent-share", "0.2", "--concurrency", "16", "--settle", "20s",
		"--ws-per-shopper", "--connect-window", "300ms", "--hold", "500ms")
	if err != nil {
		t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	if !rep.OK || rep.Successes != 60 || rep.Server.OrdersInDB != 60 {
		t.Errorf("got ok %v, %d successes, %d orders in DB; want ok, 60 and 60: %+v", rep.OK, rep.Successes, rep.Server.OrdersInDB, rep.Invariants)
	}
	c := rep.Crowd
	if c == nil {
		t.Fatalf("report has no crowd section:\n%s", out)
	}
	if rep.ByChannel["ws"] != rep.Delivered || rep.Delivered != rep.Admitted {
		t.Errorf("results: got %d delivered (%v) for %d admitted, want every one over WebSocket (fallbacks %v)",
			rep.Delivered, rep.ByChannel, rep.Admitted, rep.WSFallbacks)
	}
	if c.Connected != shoppers || c.ConnectFailed.TooMany+c.ConnectFailed.Unavailable+c.ConnectFailed.Other != 0 {
		t.Errorf("connects: got %d connected, failures %+v; want %d, none", c.Connected, c.ConnectFailed, shoppers)
	}
	// One socket per shopper, and more only for a redial.
	if got, want := rep.Sockets.WebSocketsOpened, shoppers+c.Reconnects; got != want {
		t.Errorf("WebSockets opened: got %d, want %d (shoppers + reconnects %d)", got, want, c.Reconnects)
	}
	q := c.ConnectTime
	if q.P50 <= 0 || q.P90 < q.P50 || q.P99 < q.P90 || q.Max < q.P99 {
		t.Errorf("connect time: got %+v, want positive, ordered percentiles", q)
	}
	n := c.Notifier
	if n.Unavailable != "" || !n.SharedWithLoadtest {
		t.Fatalf("notifier figures: got unavailable %q, shared %v; want figures of this very process", n.Unavailable, n.SharedWithLoadtest)
	}
	if n.ClientsHerd != shoppers || n.Upgrades < shoppers || n.Upgrades > shoppers+c.Reconnects || n.ClientsAfterLeave != 0 {
		t.Errorf("server side: got %d clients with the crowd, %d upgrade requests, %d clients after it left; want %d, %d to %d, 0",
			n.ClientsHerd, n.Upgrades, n.ClientsAfterLeave, shoppers, shoppers, shoppers+c.Reconnects)
	}
	const sane = 64 << 30
	for name, v := range map[string]int64{"before": n.RSSBefore, "herd": n.RSSHerd, "connected": n.RSSConnected, "after leave": n.RSSAfterLeave} {
		if v < 1<<20 || v > sane {
			t.Errorf("RSS %s: got %d bytes, want between 1 MiB and 64 GiB", name, v)
		}
	}
	if n.BytesPerConnection == nil || n.IdleCPUSeconds == nil || *n.IdleCPUSeconds < 0 || n.AfterLeaveWaitMs <= 0 {
		t.Errorf("notifier: got bytes per connection %v, idle CPU %v, after-leave wait %v ms; want all measured",
			n.BytesPerConnection, n.IdleCPUSeconds, n.AfterLeaveWaitMs)
	}
}

// TestLoadtestCrowdRedials: a notifier that drops every shopper's first
// socket once it subscribes; each shopper redials, subscribes again and
// gets its result on the new socket, and the report counts the redials.
// Without a /metrics the run goes on and says why the figures are
// missing; an explicit --metrics-url that does not answer stops it.
func TestLoadtestCrowdRedials(t *testing.T) {
	const shoppers = 20
	gw := &fakeGateway{stock: 5, results: map[string]string{}, dropFirstSocket: true}
	srv := httptest.NewServer(gw)
	defer srv.Close()
	args := []string{"--url", srv.URL, "--stock", "5", "--shoppers", strconv.Itoa(shoppers), "--concurrency", "4",
		"--repeat", "0", "--idempotent-share", "0", "--settle", "5s", "--ws-per-shopper", "--connect-window", "0"}
	out, err := runLoadtestCmd(t, append(args, "--json")...)
	if err != nil {
		t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	c := rep.Crowd
	if c == nil || c.Connected != shoppers || c.Reconnects != shoppers || c.Lost != 0 {
		t.Fatalf("crowd: got %+v, want %d connected, %d reconnects, none lost", c, shoppers, shoppers)
	}
	if rep.ByChannel["ws"] != shoppers || rep.Sockets.WebSocketsOpened != 2*shoppers {
		t.Errorf("got %v results, %d sockets opened; want %d over WebSocket, %d sockets", rep.ByChannel, rep.Sockets.WebSocketsOpened, shoppers, 2*shoppers)
	}
	if !strings.Contains(c.Notifier.Unavailable, "status 404") {
		t.Errorf("notifier figures: got unavailable %q, want the metrics' 404", c.Notifier.Unavailable)
	}

	_, err = runLoadtestCmd(t, append(args, "--metrics-url", srv.URL+"/nowhere")...)
	if want := "--metrics-url " + srv.URL + "/nowhere: GET"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("explicit --metrics-url without metrics: got error %v, want one containing %q", err, want)
	}
}

func TestParseNotifierMetrics(t *testing.T) {
	text := `# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 3.4668544e+07
process_cpu_seconds_total 12.5
flashsale_websocket_clients 10000
flashsale_websocket_subscriptions 9990
flashsale_http_requests_total{code="200",route="/api/v1/ws"} 10001
flashsale_http_requests_total{code="429",route="/api/v1/ws"} 4
flashsale_http_requests_total{code="200",route="/api/v1/purchases/:request_id"} 77
flashsale_build_info{role="notifier",version="dev {x} y"} 1
`
	got, err := parseNotifierMetrics(text)
	want := notifierReading{rss: 34668544, cpuSeconds: 12.5, clients: 10000, subscriptions: 9990, upgrades: 10005}
	if err != nil || got != want {
		t.Errorf("got %+v, %v; want %+v", got, err, want)
	}
	if _, err := parseNotifierMetrics("process_resident_memory_bytes 1\n"); err == nil || !strings.Contains(err.Error(), "not a notifier") {
		t.Errorf("a gateway's metrics: got error %v, want one saying it is not a notifier's", err)
	}
}

// TestLoadtestLifecycle runs the order lifecycle against the in-process
// serve: buyers pay or let their orders expire, waiting shoppers buy the
// units that come back, and every lifecycle invariant holds.
func TestLoadtestLifecycle(t *testing.T) {
	testenv.SkipShort(t, "a load test")
	out, err := runLoadtestCmd(t, "--json", "--shoppers", "400", "--stock", "40", "--per-user-limit", "1",
		"--pay-ratio", "0.7", "--payment-window", "2s", "--results", "poll", "--settle", "20s")
	if err != nil {
		t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	if !rep.InvariantsHolding || len(rep.Invariants) == 0 || rep.Lifecycle == nil {
		t.Fatalf("invariants: got ok=%v %+v, lifecycle %+v; want all holding", rep.InvariantsHolding, rep.Invariants, rep.Lifecycle)
	}
	lc := rep.Lifecycle
	if lc.Paid != 40 || lc.UnitsResold <= 0 || lc.Orders != rep.Server.OrdersInDB || lc.Orders != lc.Paid+lc.Ended {
		t.Errorf("lifecycle: got %+v (orders in DB %d), want 40 paid, units resold, every order paid or ended", lc, rep.Server.OrdersInDB)
	}
	if rep.Server.Sold != 40 || rep.Server.Remaining != 0 {
		t.Errorf("server: got sold %d, remaining %d; want 40, 0", rep.Server.Sold, rep.Server.Remaining)
	}
}

// fakeGateway is a gateway that answers the loadtest's API with a chosen
// defect, so the invariant checks can be seen to fail.
type fakeGateway struct {
	stock        int64
	oversell     bool // every request succeeds, whatever the stock
	loseOne      bool // one admitted request never gets a final result
	noOrders     bool // the database never holds the orders
	releaseTwice bool // lifecycle: Redis counts one unit fewer sold than paid
	// dropFirstSocket: a WebSocket notifier that drops each shopper's first
	// socket when it subscribes and answers on the next.
	dropFirstSocket bool
	// forgetSuccess: the first request, a success, reads 404 once it was
	// polled (a store that lost it); vanishOne: the first request reads
	// queued once, then 404.
	forgetSuccess bool
	vanishOne     bool
	polled        map[string]int // request id -> polls
	// loseAnswers: a purchase with an Idempotency-Key is admitted, but its
	// first answer is lost (the connection closes); the replay answers 200
	// with the request, as the real idempotency does.
	loseAnswers bool
	keys        map[string]string // token and key -> request id
	paid        []string
	sockets     map[string]int // access token → sockets opened

	mu       sync.Mutex
	next     atomic.Int64
	admitted int64
	sold     int64
	results  map[string]string // request id -> status
}

func (f *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.dropFirstSocket && r.URL.Path == "/api/v1/ws" && r.URL.Query().Get("access_token") != "" {
		f.serveWS(w, r)
		return
	}
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.polled == nil {
		f.polled, f.keys = map[string]int{}, map[string]string{}
	}
	switch {
	case strings.HasPrefix(r.URL.Path, "/api/") && r.Header.Get("Authorization") == "":
		reply(http.StatusUnauthorized, map[string]string{"code": "unauthorized"})
	case r.URL.Path == "/healthz":
		reply(http.StatusOK, map[string]string{"status": "ok"})
	case r.Method == http.MethodPost && r.URL.Path == "/admin/v1/campaigns":
		reply(http.StatusCreated, map[string]string{})
	case strings.HasSuffix(r.URL.Path, "/preload"):
		reply(http.StatusOK, map[string]string{"outcome": "loaded"})
	case strings.HasSuffix(r.URL.Path, "/stats"):
		orders, sold := f.sold, f.sold
		if f.noOrders {
			orders = 0
		}
		if f.releaseTwice {
			sold--
		}
		reply(http.StatusOK, serverStats{Stock: f.stock, Sold: sold, Remaining: f.stock - sold, Admitted: f.admitted, OrdersInDB: orders,
			UnitsInDB: f.sold, FinishedByStatus: map[string]int64{"success": f.sold, "sold_out": f.admitted - f.sold}})
	case strings.HasSuffix(r.URL.Path, "/pay"):
		f.paid = append(f.paid, r.URL.Path)
		reply(http.StatusOK, map[string]string{"status": "paid"})
	case strings.HasSuffix(r.URL.Path, "/orders"):
		var page orderListing
		if r.URL.Query().Get("status") == "paid" {
			for range f.paid {
				page.Orders = append(page.Orders, struct {
					UserID   string `json:"user_id"`
					Quantity int64  `json:"quantity"`
				}{UserID: fmt.Sprintf("u%d", len(page.Orders)), Quantity: 1})
			}
		}
		reply(http.StatusOK, page)
	case strings.HasSuffix(r.URL.Path, "/purchases"):
		key := r.Header.Get("Authorization") + "|" + r.Header.Get("Idempotency-Key")
		if rid, ok := f.keys[key]; ok && f.loseAnswers {
			reply(http.StatusOK, map[string]string{"request_id": rid, "status": f.results[rid]})
			return
		}
		n := f.next.Add(1)
		rid := fmt.Sprintf("c.%032x", n)
		status := "sold_out"
		if f.oversell || f.sold < f.stock {
			status = "success"
			f.sold++
		}
		if (f.loseOne || f.vanishOne) && n == 1 {
			status = "queued"
		}
		f.admitted++
		f.results[rid] = status
		if f.loseAnswers && r.Header.Get("Idempotency-Key") != "" {
			f.keys[key] = rid
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		reply(http.StatusAccepted, map[string]string{"request_id": rid, "status": "queued"})
	case strings.HasPrefix(r.URL.Path, "/api/v1/purchases/"):
		rid := strings.TrimPrefix(r.URL.Path, "/api/v1/purchases/")
		f.polled[rid]++
		if (f.forgetSuccess || f.vanishOne) && rid == fmt.Sprintf("c.%032x", 1) && f.polled[rid] > 1 {
			reply(http.StatusNotFound, map[string]string{"code": "not_found"})
			return
		}
		reply(http.StatusOK, finalResult{RequestID: rid, Status: f.results[rid], Quantity: 1, OrderID: "o-" + rid})
	default:
		reply(http.StatusNotFound, map[string]string{"code": "not_found"})
	}
}

func (f *fakeGateway) serveWS(w http.ResponseWriter, r *http.Request) {
	ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer ws.Close()
	f.mu.Lock()
	if f.sockets == nil {
		f.sockets = map[string]int{}
	}
	token := r.URL.Query().Get("access_token")
	f.sockets[token]++
	first := f.sockets[token] == 1
	f.mu.Unlock()
	for {
		var frame struct {
			RequestIDs []string `json:"request_ids"`
		}
		if err := ws.ReadJSON(&frame); err != nil {
			return
		}
		if first {
			return // dropped without a close frame
		}
		for _, rid := range frame.RequestIDs {
			f.mu.Lock()
			res := finalResult{RequestID: rid, Status: f.results[rid], Quantity: 1, OrderID: "o-" + rid}
			f.mu.Unlock()
			if err := ws.WriteJSON(map[string]any{"type": "result", "result": res}); err != nil {
				return
			}
		}
	}
}

// TestLoadtestCatchesBrokenGateway: a gateway that breaks a guarantee makes
// the tool fail, naming the invariant, with the report still printed.
func TestLoadtestCatchesBrokenGateway(t *testing.T) {
	tests := []struct {
		name    string
		gateway *fakeGateway
		want    string
		wantOut string // a line of the report
	}{
		{"oversells", &fakeGateway{oversell: true}, "no oversell", ""},
		{"loses a result", &fakeGateway{loseOne: true}, "one final result per admitted request",
			"unfinished      1 admitted requests never final (c.00000000000000000000000000000001); vanished (404 after queued) 0"},
		{"a request vanishes", &fakeGateway{vanishOne: true}, "one final result per admitted request",
			"vanished (404 after queued) 1 (c.00000000000000000000000000000001)"},
		{"forgets a success", &fakeGateway{forgetSuccess: true}, "no success retracted",
			"!!! RETRACTED SUCCESS: 1 shopper(s) told success were told otherwise later: c.00000000000000000000000000000001 (success, order o-c.00000000000000000000000000000001; then 404)"},
		{"orders missing from the database", &fakeGateway{noOrders: true}, "orders in the database = successes", ""},
		{"lifecycle: a unit released twice", &fakeGateway{releaseTwice: true}, "no unit released twice: Redis = MySQL", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.gateway.stock, tt.gateway.results = 5, map[string]string{}
			srv := httptest.NewServer(tt.gateway)
			defer srv.Close()
			args := []string{"--url", srv.URL, "--results", "poll", "--stock", "5", "--shoppers", "20",
				"--concurrency", "4", "--repeat", "0", "--idempotent-share", "0", "--settle", "1s"}
			if tt.gateway.releaseTwice {
				args = append(args, "--pay-ratio", "1")
			}
			out, err := runLoadtestCmd(t, args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("loadtest: got error %v, want one naming %q", err, tt.want)
			}
			if !strings.Contains(out, "FAIL "+tt.want) {
				t.Errorf("report: got\n%s\nwant a FAIL line for %q", out, tt.want)
			}
			if !strings.Contains(out, tt.wantOut) {
				t.Errorf("report: got\n%s\nwant a line containing %q", out, tt.wantOut)
			}
		})
	}
}

// TestLoadtestLostAnswers: a gateway that admits every keyed purchase but
// loses its answer. Each shopper resends with its Idempotency-Key, learns
// its request from the 200 and waits for its result; the report counts
// the purchases without an answer apart from the answers by status.
func TestLoadtestLostAnswers(t *testing.T) {
	const shoppers = 20
	srv := httptest.NewServer(&fakeGateway{stock: 5, results: map[string]string{}, loseAnswers: true})
	defer srv.Close()
	out, err := runLoadtestCmd(t, "--url", srv.URL, "--results", "poll", "--stock", "5", "--shoppers", strconv.Itoa(shoppers),
		"--concurrency", "4", "--repeat", "0", "--idempotent-share", "1", "--settle", "5s", "--json")
	if err != nil {
		t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	buy := rep.HTTP[routePurchase]
	lost := 0
	for _, n := range buy.NoAnswer {
		lost += n
	}
	if lost != shoppers || buy.ByStatus["200"] != shoppers || rep.NoAnswer != shoppers {
		t.Errorf("purchases: got %+v (%d without an answer in all), want %d without an answer and %d answered 200", buy, rep.NoAnswer, shoppers, shoppers)
	}
	if rep.Delivered != shoppers || rep.Successes != 5 || rep.Unfinished.Count != 0 || rep.Reread.Confirmed != 5 {
		t.Errorf("got %d results, %d successes, unfinished %+v, re-read %+v; want %d, 5, none, 5 confirmed",
			rep.Delivered, rep.Successes, rep.Unfinished, rep.Reread, shoppers)
	}
}

// TestLoadtestRetractedSuccess: a system on the test Redis takes back a
// success after its shopper was told it. A proxy in front of the system
// overwrites the request's stored result with a rejection as the success's
// poll answer passes through; the final re-read finds it, and the run
// fails naming the request.
func TestLoadtestRetractedSuccess(t *testing.T) {
	campaign := testenv.Name(t, "ltretract-")
	c := startSystem(t, realConfig(t, "redisstream"))
	rdb := testenv.Redis(t)
	var forgotten atomic.Value // the request id whose result was deleted
	target, _ := url.Parse(c.base)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		rid, ok := strings.CutPrefix(resp.Request.URL.Path, "/api/v1/purchases/")
		if !ok || resp.StatusCode != http.StatusOK {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var r finalResult
		if json.Unmarshal(body, &r) != nil || r.Status != "success" || !forgotten.CompareAndSwap(nil, rid) {
			return nil
		}
		// Deleting it would not do: the poll finds a durable success in
		// MySQL. The system is made to say otherwise instead.
		tag, _ := model.TagOfRequest(rid)
		key := "fs:{" + tag + "}:results"
		v, err := rdb.HGet(resp.Request.Context(), key, rid).Result()
		if err != nil {
			return err
		}
		f := strings.SplitN(v, "|", 5)
		if len(f) != 5 {
			return fmt.Errorf("stored result %q", v)
		}
		return rdb.HSet(resp.Request.Context(), key, rid, "rejected|"+f[1]+"||forgotten|"+f[4]).Err()
	}
	srv := httptest.NewServer(proxy)
	defer srv.Close()

	out, err := runLoadtestCmd(t, "--url", srv.URL, "--admin-token", testAdminToken, "--jwt-secret", testJWTSecret,
		"--campaign", campaign, "--results", "poll", "--shoppers", "60", "--stock", "10", "--concurrency", "8",
		"--repeat", "0", "--idempotent-share", "0", "--settle", "20s")
	rid, _ := forgotten.Load().(string)
	if rid == "" {
		t.Fatalf("no success was polled through the proxy; output:\n%s", out)
	}
	if err == nil || !strings.Contains(err.Error(), "no success retracted") || !strings.Contains(err.Error(), rid) {
		t.Fatalf("loadtest: got error %v, want one naming the retracted success %s; output:\n%s", err, rid, out)
	}
	if want := "!!! RETRACTED SUCCESS: 1 shopper(s) told success were told otherwise later: " + rid; !strings.Contains(out, want) {
		t.Errorf("report: got\n%s\nwant a line containing %q", out, want)
	}
}

// TestLoadtestMarkedSpan: the report gives apart the answers recorded
// within --mark-after and --mark-for of the sale's start, those without an
// answer included, and leaves out the rest.
func TestLoadtestMarkedSpan(t *testing.T) {
	tests := []struct {
		name        string
		startedAgo  time.Duration
		after, span time.Duration
		wantMarked  bool
	}{
		{"within the span", time.Minute, 30 * time.Second, time.Hour, true},
		{"before the span", time.Minute, time.Hour, time.Hour, false},
		{"after the span", time.Hour, 0, time.Minute, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRecorder(loadtestOptions{markAfter: tt.after, markFor: tt.span}, 1, 0)
			r.start(time.Now().Add(-tt.startedAgo))
			r.call(routePurchase, http.StatusServiceUnavailable, 2*time.Second, nil)
			r.call(routePurchase, 0, 0, errors.New("dial tcp 127.0.0.1:1: i/o timeout"))
			rep := r.report(serverStats{}, nil)
			// The histograms keep 3 significant digits.
			twoSeconds := func(ms float64) bool { return ms >= 2000 && ms < 2002 }
			if all := rep.HTTP[routePurchase]; all.ByStatus["503"] != 1 || all.NoAnswer["i/o timeout"] != 1 || !twoSeconds(rep.LongestAnswerMs) {
				t.Errorf("all answers: got %+v, longest %v ms; want one 503, one i/o timeout, 2000 ms", all, rep.LongestAnswerMs)
			}
			m := rep.Marked
			if m == nil || m.FromMs != float64(tt.after.Milliseconds()) || m.ToMs != float64((tt.after+tt.span).Milliseconds()) {
				t.Fatalf("marked: got %+v, want the span %v from %v", m, tt.span, tt.after)
			}
			got := m.HTTP[routePurchase].ByStatus["503"] == 1 && m.NoAnswer == 1 && twoSeconds(m.LongestAnswerMs)
			if empty := len(m.HTTP) == 0 && m.NoAnswer == 0; got != tt.wantMarked || empty == tt.wantMarked {
				t.Errorf("marked: got %+v, want the two answers in it: %v", m, tt.wantMarked)
			}
		})
	}
}

// TestLoadtestBadInvocation: bad flags and an unreachable gateway give one
// line, no stack trace and no report.
func TestLoadtestBadInvocation(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--stok", "5"}, "flag provided but not defined: -stok"},
		{"not a number", []string{"--stock", "many"}, `invalid value "many" for flag -stock`},
		{"zero stock", []string{"--stock", "0"}, "--stock: must be at least 1"},
		{"share above one", []string{"--repeat", "1.5"}, "--repeat: must be a share between 0 and 1"},
		{"unknown results channel", []string{"--results", "sms"}, `--results: must be "ws" or "poll"`},
		{"bad settle", []string{"--settle", "soon"}, "want seconds (30) or a duration (30s)"},
		{"url without scheme", []string{"--url", "localhost:8080"}, "--url:"},
		{"config with url", []string{"--url", "http://127.0.0.1:1", "--config", "x.yaml"}, "--config:"},
		{"stray argument", []string{"now"}, `unexpected argument "now"`},
		{"pay ratio above one", []string{"--pay-ratio", "1.5"}, "--pay-ratio: must be a share between 0 and 1"},
		{"payment window too short", []string{"--payment-window", "500ms"}, "--payment-window: must be between 1s and 24h"},
		{"crowd flag without the crowd", []string{"--hold", "30s"}, "--hold: goes with --ws-per-shopper"},
		{"crowd with polled results", []string{"--ws-per-shopper", "--results", "poll"}, "--ws-per-shopper: goes with --results ws"},
		{"crowd in a lifecycle run", []string{"--ws-per-shopper", "--pay-ratio", "0.5"}, "--ws-per-shopper: not with --pay-ratio"},
		{"negative connect window", []string{"--ws-per-shopper", "--connect-window", "-1s"}, "--connect-window: must not be negative"},
		{"metrics url without scheme", []string{"--ws-per-shopper", "--metrics-url", "notifier:8080/metrics"}, "--metrics-url:"},
		{"unreachable gateway", []string{"--url", "http://127.0.0.1:1"}, "--url http://127.0.0.1:1 unreachable"},
		{"results url without url", []string{"--results-url", "http://127.0.0.1:1"}, "--results-url: goes with --url"},
		{"mark after without a span", []string{"--mark-after", "10s"}, "--mark-after: goes with --mark-for"},
		{"negative span", []string{"--mark-for", "-1s"}, "--mark-for: must not be negative"},
		{"results url without scheme", []string{"--url", "http://127.0.0.1:1", "--results-url", "notifier:8080"}, "--results-url:"},
		{"existing without a campaign", []string{"--existing", "--url", "http://127.0.0.1:1"}, "--existing: goes with --campaign and --url"},
		{"existing in-process", []string{"--existing", "--campaign", "c1"}, "--existing: goes with --campaign and --url"},
		{"existing with a stock", []string{"--existing", "--campaign", "c1", "--url", "http://127.0.0.1:1", "--stock", "5"}, "--stock: not with --existing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runLoadtestCmd(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "loadtest: ") {
				t.Errorf("got error %q, want one line starting with \"loadtest: \"", msg)
			}
			if out != "" {
				t.Errorf("got output %q, want none", out)
			}
		})
	}
}

func TestLoadtestHelp(t *testing.T) {
	out, err := runLoadtestCmd(t, "--help")
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("got error %v, want %v", err, flag.ErrHelp)
	}
	for _, want := range []string{"Usage: flashsale loadtest", "-shoppers", "-results"} {
		if !strings.Contains(out, want) {
			t.Errorf("usage: got\n%s\nwant it to contain %q", out, want)
		}
	}
}

// TestLoadtestTokensCarryIssuerAndAudience: against a server that checks
// iss and aud (auth.issuer, auth.audience), the shoppers' tokens pass only
// when --issuer and --audience (or their FLASHSALE_AUTH_ variables) name
// them.
func TestLoadtestTokensCarryIssuerAndAudience(t *testing.T) {
	server, err := auth.New(t.Context(), []byte(testJWTSecret), auth.Options{Issuer: "https://idp.example/", Audience: "shop-api"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		pass bool
	}{
		{"flags", []string{"--issuer", "https://idp.example/", "--audience", "shop-api"}, nil, true},
		{"environment", nil, map[string]string{"FLASHSALE_AUTH_ISSUER": "https://idp.example/", "FLASHSALE_AUTH_AUDIENCE": "shop-api"}, true},
		{"neither", nil, nil, false},
		{"another audience", []string{"--issuer", "https://idp.example/", "--audience", "other"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseLoadtestFlags(append([]string{"--jwt-secret", testJWTSecret}, tt.args...), io.Discard, tt.env)
			if err != nil {
				t.Fatalf("flags: %v", err)
			}
			tok, err := minter(o).Mint("alice", time.Minute)
			if err != nil {
				t.Fatalf("mint: %v", err)
			}
			if user, err := server.Verify(tok); (err == nil) != tt.pass || (tt.pass && user != "alice") {
				t.Errorf("verify: got %q, %v; want it to pass: %v", user, err, tt.pass)
			}
		})
	}
}
