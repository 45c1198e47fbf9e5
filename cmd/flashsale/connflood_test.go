package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// healthyUnderLoad sends n concurrent health checks and fails the test
// unless every one is answered 200.
func (c *client) healthyUnderLoad(n int) {
	c.t.Helper()
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range codes {
		wg.Go(func() { codes[i] = c.do("GET", "/healthz", "", nil, nil, nil) })
	}
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusOK {
			c.t.Fatalf("healthz %d of %d at once: got %d, want 200", i, n, code)
		}
	}
}

// floodConn opens a connection to addr from the local address from.
func floodConn(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestConnectionFloodKeepsServiceUp is issue 30's attack on a process
// limited to 1,024 descriptors: 1,000 idle keep-alive connections from
// one address, no token, then waves of connections that never finish their
// header from two others. The first address is held at
// http.max_conns_per_ip (the rest refused 429 and counted), the listener at
// its limit less http.fd_reserve, making room by closing idle and slow
// connections; meanwhile another address's /healthz, purchase and poll are
// all answered, and the process never runs out of descriptors.
func TestConnectionFloodKeepsServiceUp(t *testing.T) {
	testenv.SkipShort(t, "a flood of connections")
	t.Parallel() // a process of its own, its flood from addresses of its own
	const fileLimit, idleFlood, slowWave = 1024, 1000, 300
	cfg := realConfig(t, "memqueue")
	// The defaults' bounds (the harness raises them for its one-host
	// crowds).
	perIP := 2 * config.Default().Notifier.MaxConnsPerIP
	env := append(processEnv(cfg), "FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP="+strconv.Itoa(config.Default().Notifier.MaxConnsPerIP))
	c := startRole(t, limitedBinary(t, fileLimit), "serve", env).client(t, cfg)
	campaign := testenv.Name(t, "connflood-")
	c.openCampaign(campaign, 10, 1)
	u, err := url.Parse(c.base)
	if err != nil {
		t.Fatal(err)
	}

	// 1,000 kept-alive connections from 127.0.0.10, idle after a request.
	held, refused := 0, map[int]int{}
	for range idleFlood {
		conn := floodConn(t, u.Host, "127.0.0.10")
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatalf("write: %v", err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("the flood's connection %d: no answer (%v): the process is out of descriptors?", held+len(refused), err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			held++
		} else {
			refused[resp.StatusCode]++
		}
	}
	if held != perIP || refused[http.StatusTooManyRequests] != idleFlood-perIP {
		t.Fatalf("one address: held %d, refused %v; want %d held (http.max_conns_per_ip), the other %d refused 429", held, refused, perIP, idleFlood-perIP)
	}

	// Waves of headers never finished, from 127.0.0.11 and 127.0.0.12:
	// with the idle ones they pass the listener's bound, so the slow ones
	// take the place of idle ones.
	for _, from := range []string{"127.0.0.11", "127.0.0.12"} {
		for range slowWave {
			conn := floodConn(t, u.Host, from)
			if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
				t.Fatalf("write: %v", err)
			}
		}
	}

	// Another address is answered throughout.
	c.healthyUnderLoad(32)
	code, rid := c.tryBuy(campaign, "shopper")
	if code != http.StatusAccepted {
		t.Fatalf("purchase during the flood: got %d, want 202", code)
	}
	if r := c.waitFinal("shopper", rid, 20*time.Second); r.Status != "success" {
		t.Fatalf("poll during the flood: got %+v, want success", r)
	}
	perIPRefused := c.metricSum("flashsale_http_connections_refused_total", `reason="per_ip"`)
	closedIdle := c.metricSum("flashsale_http_connections_closed_total", `reason="idle"`)
	if perIPRefused != float64(idleFlood-perIP) || closedIdle < 1 || c.metricSum("flashsale_http_connections_refused_total", `reason="fd_limit"`) != 0 {
		t.Errorf("metrics: refused per_ip %v, closed idle %v, refused fd_limit %v; want %d, at least 1, 0",
			perIPRefused, closedIdle, c.metricSum("flashsale_http_connections_refused_total", `reason="fd_limit"`), idleFlood-perIP)
	}
	t.Logf("held %d of %d idle, refused %v; closed idle %v, slow_header %v; open %v", held, idleFlood, refused, closedIdle,
		c.metricSum("flashsale_http_connections_closed_total", `reason="slow_header"`), c.metricSum("flashsale_http_connections", `listener="main"`))
}

// TestHeaderLimit: a request's line and headers may take 16 KiB, as
// documented; one more kilobyte is 431.
func TestHeaderLimit(t *testing.T) {
	t.Parallel()
	c := startSystem(t, realConfig(t, "memqueue"))
	u, err := url.Parse(c.base)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		size int // of the whole request head
		want int
	}{{maxHeaderBytes - 512, http.StatusOK}, {maxHeaderBytes + 1024, http.StatusRequestHeaderFieldsTooLarge}} {
		head := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: "
		head += strings.Repeat("p", tc.size-len(head)-4) + "\r\n\r\n"
		conn := floodConn(t, u.Host, "127.0.0.1")
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, head); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != tc.want {
			t.Fatalf("a request head of %d bytes: got %v, %v; want %d", len(head), resp, err, tc.want)
		}
		_ = resp.Body.Close()
	}
}
