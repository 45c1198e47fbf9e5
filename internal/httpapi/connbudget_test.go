package httpapi

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// budgetServer serves h behind a ConnBudget of opts on a loopback port
// and records the budget's events.
type budgetServer struct {
	b      *ConnBudget
	addr   string
	mu     sync.Mutex
	events map[string]int // "refused/per_ip" -> count
}

func newBudgetServer(t *testing.T, opts ConnBudgetOptions, h http.Handler) *budgetServer {
	t.Helper()
	s := &budgetServer{events: map[string]int{}}
	opts.Observe = func(event, reason string) {
		s.mu.Lock()
		s.events[event+"/"+reason]++
		s.mu.Unlock()
	}
	s.b = NewConnBudget(opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	srv := &http.Server{Handler: s.b.Handler(h), ConnState: s.b.ConnState, ConnContext: s.b.ConnContext, ReadHeaderTimeout: time.Minute}
	go func() { _ = srv.Serve(s.b.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

func (s *budgetServer) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.events[key]
}

// dialFrom opens a connection from local address from (any 127.x.y.z
// works on loopback).
func (s *budgetServer) dialFrom(t *testing.T, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// get sends a keep-alive GET on c and returns the status, or 0 when the
// connection answered nothing (closed).
func get(t *testing.T, c net.Conn, br *bufio.Reader) int {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// refusedAtOnce reads what a connection got without asking: the status of
// a refusal the budget wrote, else 0.
func refusedAtOnce(c net.Conn) int {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if resp.Header.Get("Retry-After") == "" || !resp.Close {
		return -1
	}
	return resp.StatusCode
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })

// TestConnBudgetPerIP: an address at its bound gets 429 at once; another
// address, and an exempt one, still connect; a closed connection frees
// its place.
func TestConnBudgetPerIP(t *testing.T) {
	exempt := netip.MustParseAddr("127.0.0.3")
	s := newBudgetServer(t, ConnBudgetOptions{MaxConns: 100, MaxConnsPerIP: 2, Exempt: func(a netip.Addr) bool { return a == exempt }}, ok)
	first := s.dialFrom(t, "127.0.0.2")
	s.dialFrom(t, "127.0.0.2")
	if got := refusedAtOnce(s.dialFrom(t, "127.0.0.2")); got != http.StatusTooManyRequests {
		t.Fatalf("third from one address: got %d, want 429 written at once", got)
	}
	if n := s.count("refused/per_ip"); n != 1 {
		t.Fatalf("refused per_ip: got %d, want 1", n)
	}
	other := s.dialFrom(t, "127.0.0.4")
	if got := get(t, other, bufio.NewReader(other)); got != http.StatusOK {
		t.Fatalf("another address: got %d, want 200", got)
	}
	for range 3 {
		c := s.dialFrom(t, exempt.String())
		if got := get(t, c, bufio.NewReader(c)); got != http.StatusOK {
			t.Fatalf("an exempt address: got %d, want 200", got)
		}
	}
	_ = first.Close()
	testenv.Eventually(t, 5*time.Second, "the closed connection counted out", func() (bool, string) {
		n := s.b.Open()
		return n == 5, fmt.Sprintf("open %d, want 5", n)
	})
	again := s.dialFrom(t, "127.0.0.2")
	if got := get(t, again, bufio.NewReader(again)); got != http.StatusOK {
		t.Fatalf("after a close, from the address: got %d, want 200", got)
	}
}

// TestConnBudgetMakesRoom: at the bound a new connection takes the place of
// the one idle longest, then of one that has not sent its first request
// within SlowHeader; with neither, it is refused 503 at once.
func TestConnBudgetMakesRoom(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	busy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/busy" {
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	})
	s := newBudgetServer(t, ConnBudgetOptions{MaxConns: 2, SlowHeader: 500 * time.Millisecond}, busy)

	// Two kept-alive connections, idle after a request each: the older
	// makes room for a third.
	older, newer := s.dialFrom(t, "127.0.0.2"), s.dialFrom(t, "127.0.0.2")
	olderR, newerR := bufio.NewReader(older), bufio.NewReader(newer)
	for _, c := range []struct {
		c net.Conn
		r *bufio.Reader
	}{{older, olderR}, {newer, newerR}} {
		if got := get(t, c.c, c.r); got != http.StatusOK {
			t.Fatalf("kept-alive request: got %d, want 200", got)
		}
	}
	third := s.dialFrom(t, "127.0.0.5")
	if got := get(t, third, bufio.NewReader(third)); got != http.StatusOK {
		t.Fatalf("at the bound, with idle connections: got %d, want 200", got)
	}
	if got := get(t, older, olderR); got != 0 {
		t.Fatalf("the connection idle longest: got %d, want it closed", got)
	}
	if got := get(t, newer, newerR); got != http.StatusOK {
		t.Fatalf("the newer idle connection: got %d, want 200", got)
	}
	if n := s.count("closed/idle"); n != 1 {
		t.Fatalf("closed idle: got %d, want 1", n)
	}

	// Both places busy: one in a request, one sending a header slowly.
	_ = newer.Close()
	_ = third.Close()
	testenv.Eventually(t, 5*time.Second, "both closed connections counted out", func() (bool, string) {
		return s.b.Open() == 0, fmt.Sprintf("open %d", s.b.Open())
	})
	inRequest := s.dialFrom(t, "127.0.0.2")
	if _, err := io.WriteString(inRequest, "GET /busy HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	slow := s.dialFrom(t, "127.0.0.6")
	if _, err := io.WriteString(slow, "GET / HTTP/1.1\r\nHost: x\r\n"); err != nil { // never ends its header
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "both connections counted in", func() (bool, string) {
		return s.b.Open() == 2, fmt.Sprintf("open %d", s.b.Open())
	})
	// Within SlowHeader the slow one is not cut: refused (unless 500 ms
	// passed since its accept on a slow machine: then it was cut).
	early := s.dialFrom(t, "127.0.0.7")
	if got := refusedAtOnce(early); got != http.StatusServiceUnavailable && s.count("closed/slow_header") == 0 {
		t.Fatalf("at the bound, nothing to close: got %d, want 503 written at once", got)
	}
	time.Sleep(600 * time.Millisecond) // the slow header's bound passes
	late := s.dialFrom(t, "127.0.0.7")
	if got := get(t, late, bufio.NewReader(late)); got != http.StatusOK {
		t.Fatalf("with a slow header past its bound: got %d, want 200", got)
	}
	if n := s.count("closed/slow_header"); n < 1 {
		t.Fatalf("closed slow_header: got %d, want at least 1", n)
	}
	if _, err := slow.Read(make([]byte, 1)); err == nil {
		t.Fatal("the slow connection: still open, want it closed")
	}
	once.Do(func() { close(release) })
	if resp, err := http.ReadResponse(bufio.NewReader(inRequest), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the request in flight: got %v, %v; want 200 (never cut)", resp, err)
	}
}

// TestConnBudgetRefusalText: the refusals are complete HTTP answers with
// the error body every other refusal has.
func TestConnBudgetRefusalText(t *testing.T) {
	for _, answer := range [][]byte{refusedProcess, refusedPerIP} {
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(answer))), nil)
		if err != nil {
			t.Fatalf("%q: %v", answer, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"code":"`) || resp.ContentLength != int64(len(body)) {
			t.Errorf("%q: want a JSON error body of its Content-Length", answer)
		}
	}
}
