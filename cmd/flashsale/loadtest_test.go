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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/auth"
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
			if rep.Requests < 400 || rep.AdmitLatency.Max <= 0 || rep.ResultLatency.P50 <= 0 {
				t.Errorf("measurements: got %d requests, admit max %v ms, result p50 %v ms; want >= 400 and positive latencies",
					rep.Requests, rep.AdmitLatency.Max, rep.ResultLatency.P50)
			}
		})
	}
}

// TestLoadtestLifecycle runs the order lifecycle against the in-process
// serve: buyers pay or let their orders expire, waiting shoppers buy the
// units that come back, and every lifecycle invariant holds.
func TestLoadtestLifecycle(t *testing.T) {
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
	paid         []string

	mu       sync.Mutex
	next     atomic.Int64
	admitted int64
	sold     int64
	results  map[string]string // request id -> status
}

func (f *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
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
		n := f.next.Add(1)
		rid := fmt.Sprintf("c.%032x", n)
		status := "sold_out"
		if f.oversell || f.sold < f.stock {
			status = "success"
			f.sold++
		}
		if f.loseOne && n == 1 {
			status = "queued"
		}
		f.admitted++
		f.results[rid] = status
		reply(http.StatusAccepted, map[string]string{"request_id": rid, "status": "queued"})
	case strings.HasPrefix(r.URL.Path, "/api/v1/purchases/"):
		rid := strings.TrimPrefix(r.URL.Path, "/api/v1/purchases/")
		reply(http.StatusOK, finalResult{RequestID: rid, Status: f.results[rid], Quantity: 1, OrderID: "o-" + rid})
	default:
		reply(http.StatusNotFound, map[string]string{"code": "not_found"})
	}
}

// TestLoadtestCatchesBrokenGateway: a gateway that breaks a guarantee makes
// the tool fail, naming the invariant, with the report still printed.
func TestLoadtestCatchesBrokenGateway(t *testing.T) {
	tests := []struct {
		name    string
		gateway *fakeGateway
		want    string
	}{
		{"oversells", &fakeGateway{oversell: true}, "no oversell"},
		{"loses a result", &fakeGateway{loseOne: true}, "one final result per admitted request"},
		{"orders missing from the database", &fakeGateway{noOrders: true}, "orders in the database = successes"},
		{"lifecycle: a unit released twice", &fakeGateway{releaseTwice: true}, "no unit released twice: Redis = MySQL"},
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
		{"unreachable gateway", []string{"--url", "http://127.0.0.1:1"}, "--url http://127.0.0.1:1 unreachable"},
		{"results url without url", []string{"--results-url", "http://127.0.0.1:1"}, "--results-url: goes with --url"},
		{"results url without scheme", []string{"--url", "http://127.0.0.1:1", "--results-url", "notifier:8080"}, "--results-url:"},
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
