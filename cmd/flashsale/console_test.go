package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestConsole drives the admin console (web/admin) in headless Chromium: a
// wrong token is refused; the admin signs in, creates and preloads a
// campaign through the page, watches it, and sees the counters move over
// the stats stream while purchases arrive through the API; then pauses and
// resumes it from its row.
func TestConsole(t *testing.T) {
	browser := startBrowser(t)
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	id := testenv.Name(t, "console-")

	tab := openPage(t, browser, c.base+"/admin/", "")
	evalJS[bool](t, tab, `(document.getElementById("token").value = "wrong-token", document.getElementById("signin").requestSubmit(), true)`)
	waitJS(t, tab, 10*time.Second, "the refusal", `document.getElementById("error").textContent.includes("wrong admin token")`)
	if shown := evalJS[bool](t, tab, `!document.getElementById("console").hidden`); shown {
		t.Errorf("a wrong token shows the console")
	}

	tab = openPage(t, browser, c.base+"/admin/", c.admin)
	if err := chromedp.Do(tab, chromedp.EmulateViewport(1100, 900)); err != nil {
		t.Fatal(err)
	}
	fields, _ := json.Marshal(map[string]string{"id": id, "name": "Console sale", "stock": "20", "per_user_limit": "1",
		"price": "500", "payment_window": "5m", "start_at": time.Now().Add(-time.Second).UTC().Format(time.RFC3339),
		"end_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
	evalJS[bool](t, tab, fmt.Sprintf(`(() => { const f = document.getElementById("create");
		for (const [k, v] of Object.entries(%s)) f.elements[k].value = v;
		f.requestSubmit(); return true; })()`, fields))
	row := fmt.Sprintf(`document.querySelector('tr[data-campaign=%q]')`, id)
	waitJS(t, tab, 10*time.Second, "the new campaign listed", "!!"+row)
	evalJS[bool](t, tab, row+`.querySelector('[data-action="preload"]').click(), true`)
	waitJS(t, tab, 10*time.Second, "preloaded", `!`+row+`.textContent.includes("not loaded")`)
	evalJS[bool](t, tab, row+`.querySelector('[data-action="watch"]').click(), true`)
	waitJS(t, tab, 10*time.Second, "the first event", `window.flashsaleConsole.last && window.flashsaleConsole.last.remaining === 20`)

	for i := range 5 {
		c.buy(fmt.Sprintf("shopper-%d", i), id)
	}
	waitJS(t, tab, 10*time.Second, "the counters move over the stream", `(() => { const l = window.flashsaleConsole.last;
		return l.remaining === 15 && l.decided === 5 && l.orders_in_db === 5
			&& document.getElementById("remaining").textContent === "15"; })()`)
	waitJS(t, tab, 10*time.Second, "the charts drawn", `document.querySelectorAll("#chart-decided polyline").length === 1
		&& document.querySelector("#chart-decided polyline").getAttribute("points").split(" ").length >= 3`)
	screenshot(t, tab, "admin-console.png")
	for _, step := range []struct{ action, state string }{{"pause", "paused"}, {"resume", "running"}} {
		evalJS[bool](t, tab, row+`.querySelector('[data-action="`+step.action+`"]').click(), true`)
		waitJS(t, tab, 10*time.Second, step.state, row+`.dataset.state === "`+step.state+`"`)
	}
	if polls := evalJS[int](t, tab, `performance.getEntriesByType("resource").filter((e) => e.name.includes("/stats")).length`); polls != 0 {
		t.Errorf("the page read /stats %d times; want the stream only", polls)
	}
}

// TestConsoleStream checks the stream's answer itself: admin auth, the
// event-stream type, an unknown campaign a 404.
func TestConsoleStream(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	id := testenv.Name(t, "console-")
	c.openCampaign(id, 3, 1)
	for _, tc := range []struct {
		name, path, bearer string
		want               int
	}{
		{"no token", "/admin/v1/campaigns/" + id + "/stream", "", http.StatusUnauthorized},
		{"wrong token", "/admin/v1/campaigns/" + id + "/stream", "nope", http.StatusForbidden},
		{"unknown campaign", "/admin/v1/campaigns/" + id + "-none/stream", c.admin, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.do("GET", tc.path, tc.bearer, nil, nil, nil); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// open opens a stream from the local address from.
	open := func(from string) *http.Response {
		t.Helper()
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		client := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
		t.Cleanup(client.CloseIdleConnections)
		req, _ := http.NewRequestWithContext(ctx, "GET", c.base+"/admin/v1/campaigns/"+id+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+c.admin)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = res.Body.Close() })
		return res
	}
	// The bounds: an address's, then the process's, the streams open at
	// once, each past its first event.
	for i := range maxStatsStreams + 1 {
		from := "127.0.0.2"
		if i > maxStatsStreamsPerIP {
			from = fmt.Sprintf("127.0.0.%d", 3+i)
		}
		res := open(from)
		if i == maxStatsStreamsPerIP {
			if res.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("stream beyond %d from one address: got %d, want 429", maxStatsStreamsPerIP, res.StatusCode)
			}
			continue
		}
		if ct := res.Header.Get("Content-Type"); res.StatusCode != http.StatusOK || ct != "text/event-stream" {
			t.Fatalf("stream %d from %s: got %d %q, want 200 text/event-stream", i, from, res.StatusCode, ct)
		}
		line, err := bufio.NewReader(res.Body).ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		var ev statsBody
		if !strings.HasPrefix(line, "data: ") || json.Unmarshal([]byte(line[6:]), &ev) != nil || ev.Remaining != 3 {
			t.Errorf("first event %q, want data: {…remaining 3…}", line)
		}
	}
	if res := open("127.0.0.99"); res.StatusCode != http.StatusTooManyRequests {
		t.Errorf("stream beyond %d: got %d, want 429", maxStatsStreams, res.StatusCode)
	}
}

// gateway's bounds on the streams of a process, and of one address.
const maxStatsStreams, maxStatsStreamsPerIP = 16, 4
