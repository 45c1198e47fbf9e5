package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// screenshotsEnv names the directory (relative to the module's root) where
// the browser tests write their screenshots of the shopper page; unset,
// they write none. README.md and docs/OPERATIONS.md show the ones
// committed under docs/.
const screenshotsEnv = "FLASHSALE_TEST_SCREENSHOTS"

// TestBrowser drives the shopper page (web/) and flashsale.js in a real
// headless Chromium, one process shared by the subtests, each in a browser
// context of its own (no shared storage). Under CI=true a missing Chromium
// fails the test; on a laptop it skips.
func TestBrowser(t *testing.T) {
	browser := startBrowser(t)
	t.Run("buy: countdown, queued, success over WebSocket, pay", func(t *testing.T) { testBrowserBuy(t, browser) })
	t.Run("WebSocket blocked: the result by polling", func(t *testing.T) { testBrowserPolling(t, browser) })
	t.Run("sold out", func(t *testing.T) { testBrowserSoldOut(t, browser) })
	t.Run("flashsale.js reconnects after the socket is dropped", func(t *testing.T) { testBrowserReconnect(t, browser) })
	t.Run("flashsale.js: a retried purchase, typed errors", func(t *testing.T) { testBrowserClientAPI(t, browser) })
	t.Run("embedded default: dev token, a purchase", func(t *testing.T) { testBrowserEmbedded(t, browser) })
	t.Run("bot gate: the page solves the challenge", func(t *testing.T) { testBrowserChallenge(t, browser) })
}

// testBrowserEmbedded: the one-command run (embedded default, development
// mode, the WebSocket's same-host origin rule) signs in with the page's
// "Dev token" button and buys, the result pushed over the WebSocket.
func testBrowserEmbedded(t *testing.T, browser context.Context) {
	cfg := config.Default()
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.Log.Level = "warn"
	addr, _ := startRoles(t, cfg, roleSet{gateway: true, worker: true, notifier: true})
	c := newClient(t, "http://"+addr, cfg.Auth)
	c.openCampaign("embedded-page", 3, 1)

	tab := openPage(t, browser, c.base+"/", "")
	evalJS[bool](t, tab, `(document.getElementById("dev-user").value = "zoe", document.getElementById("dev-signin").requestSubmit(), true)`)
	waitJS(t, tab, 10*time.Second, "signed in as zoe", `document.getElementById("who").textContent === "signed in as zoe"`)
	showCampaign(t, tab, "embedded-page")
	waitJS(t, tab, 30*time.Second, "the buy button opens", `!document.getElementById("buy").disabled`)
	evalJS[bool](t, tab, `(document.getElementById("buy").click(), true)`)
	waitJS(t, tab, 30*time.Second, "success", `document.getElementById("status").dataset.state === "success"`)
	if via := evalJS[string](t, tab, `document.getElementById("status").dataset.via`); via != "websocket" {
		t.Errorf("result arrived by %q, want websocket", via)
	}
}

// testBrowserClientAPI drives flashsale.js as a shop's own frontend would:
// a purchase sent again names the same request (its kept key), refusals
// are the typed errors of their codes, with Retry-After.
func testBrowserClientAPI(t *testing.T, browser context.Context) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	id := testenv.Name(t, "web-")
	c.openCampaign(id, 50, 1)
	tab := openPage(t, browser, c.base+"/", c.token("gina"))
	got := evalJS[struct {
		First, Again   string
		Replay         bool
		Result         string
		NotFound       bool
		RateLimited    bool
		RetryAfter     float64
		KeyedDifferent bool
	}](t, tab, fmt.Sprintf(`(async () => {
		const m = await import("/web/flashsale.js");
		const fs = m.createClient({ token: window.flashsaleClient.token });
		const id = %q;
		const a = await fs.purchase(id), b = await fs.purchase(id);
		const r = await fs.waitForResult(a.requestId);
		let notFound = false;
		try { await fs.purchase(id + "-none"); } catch (e) { notFound = e instanceof m.NotFoundError && e.code === "not_found" && e.status === 404; }
		let limited = null, keys = new Set();
		for (let i = 0; i < 50 && !limited; i++) {
			fs.forgetKey(id);
			try { keys.add((await fs.purchase(id)).idempotencyKey); } catch (e) { if (e instanceof m.RateLimitedError) limited = e; else throw e; }
		}
		return { First: a.requestId, Again: b.requestId, Replay: !a.replay && b.replay, Result: r.status,
			NotFound: notFound, RateLimited: !!limited, RetryAfter: limited ? limited.retryAfter : 0, KeyedDifferent: keys.size > 1 };
	})()`, id), chromedp.EvalAwaitPromise)
	if got.First == "" || got.Again != got.First || !got.Replay {
		t.Errorf("purchase sent twice: requests %q and %q (replay %v); want the same request, the second a replay", got.First, got.Again, got.Replay)
	}
	if got.Result != "success" {
		t.Errorf("result: got %q, want success", got.Result)
	}
	if !got.NotFound {
		t.Errorf("an unknown campaign: want a NotFoundError (code not_found, status 404)")
	}
	if !got.RateLimited || got.RetryAfter <= 0 || !got.KeyedDifferent {
		t.Errorf("purchases beyond the user's rate: RateLimitedError %v with retryAfter %v (new keys after forgetKey: %v); want one with retryAfter > 0",
			got.RateLimited, got.RetryAfter, got.KeyedDifferent)
	}
}

// testBrowserBuy: the button stays disabled during the countdown and opens
// at the start (server time); a purchase shows queued while no worker runs,
// then success pushed over the WebSocket once one starts, then the order,
// which the shopper pays.
func testBrowserBuy(t *testing.T, browser context.Context) {
	cfg := realConfig(t, "redisstream")
	front, _ := startRoles(t, cfg, roleSet{gateway: true, notifier: true})
	c := newClient(t, "http://"+front, cfg.Auth)
	c.db = cfg.Database
	id := testenv.Name(t, "web-")
	start := time.Now().Add(4 * time.Second).Truncate(time.Millisecond)
	c.openCampaignOf(campaignBody{ID: id, Name: "Spring sale: ceramic mug", Stock: 10, PerUserLimit: 2, Price: 1999,
		PaymentWindow: "10m", StartAt: start, EndAt: start.Add(time.Hour)})

	tab := openPage(t, browser, c.base+"/", c.token("alice"))
	showCampaign(t, tab, id)
	// Record when the button opens, on the page's server clock.
	evalJS[bool](t, tab, `(() => { const b = document.getElementById("buy");
		new MutationObserver(() => { if (!b.disabled && !window.enabledAt) window.enabledAt = window.flashsaleClock.now(); })
			.observe(b, { attributes: true }); return true; })()`)
	before := evalJS[struct {
		Disabled  bool    `json:"disabled"`
		Countdown string  `json:"countdown"`
		Now       float64 `json:"now"`
	}](t, tab, `({ disabled: document.getElementById("buy").disabled, countdown: document.getElementById("countdown").textContent,
		now: window.flashsaleClock.now() })`)
	if before.Now < float64(start.UnixMilli()) {
		if !before.Disabled || !strings.HasPrefix(before.Countdown, "Starts in") {
			t.Errorf("before the start: button disabled %v, countdown %q; want disabled, \"Starts in …\"", before.Disabled, before.Countdown)
		}
		screenshot(t, tab, "shopper-countdown.png")
	} else {
		t.Logf("the page loaded after the start (slow machine): countdown not checked")
	}
	waitJS(t, tab, 30*time.Second, "the buy button opens", `!document.getElementById("buy").disabled`)
	if at := evalJS[float64](t, tab, `window.enabledAt || window.flashsaleClock.now()`); at < float64(start.UnixMilli()) {
		t.Errorf("buy button opened at %v, %v ms before the start", at, float64(start.UnixMilli())-at)
	}

	evalJS[bool](t, tab, `(() => { document.getElementById("quantity").value = "5"; document.getElementById("buy").click(); return true; })()`)
	waitJS(t, tab, 30*time.Second, "queued", `document.getElementById("status").dataset.state === "queued"`)
	if q := evalJS[string](t, tab, `document.getElementById("quantity").value`); q != "2" {
		t.Errorf("quantity 5 with a limit of 2: sent %s, want 2", q)
	}
	waitJS(t, tab, 30*time.Second, "subscribed over the WebSocket",
		`[...window.flashsaleClient.waits.values()].every((w) => w.subscribed)`)
	screenshot(t, tab, "shopper-queued.png")

	startRoles(t, cfg, roleSet{worker: true})
	waitJS(t, tab, 30*time.Second, "success", `document.getElementById("status").dataset.state === "success"`)
	if via := evalJS[string](t, tab, `document.getElementById("status").dataset.via`); via != "websocket" {
		t.Errorf("result arrived by %q, want websocket", via)
	}
	waitJS(t, tab, 30*time.Second, "the order, pending payment", `document.getElementById("order").dataset.status === "pending_payment"`)
	if left := evalJS[string](t, tab, `document.getElementById("order-left").textContent`); !strings.HasPrefix(left, "Pay within 00:") {
		t.Errorf("time left to pay: %q, want \"Pay within 00:…\"", left)
	}
	screenshot(t, tab, "shopper-success.png")
	evalJS[bool](t, tab, `(document.getElementById("pay").click(), true)`)
	waitJS(t, tab, 30*time.Second, "paid", `document.getElementById("order").dataset.status === "paid"`)

	orders := c.ordersInDB(id)
	if len(orders) != 1 {
		t.Errorf("orders in the database: got %d, want 1", len(orders))
	}
}

// testBrowserChallenge: on a campaign with challenge_bits the page fetches
// the puzzle, solves it in Web Workers (pow.js) and buys; the same purchase
// without a solution is refused with 403 challenge_failed.
func testBrowserChallenge(t *testing.T, browser context.Context) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	id := testenv.Name(t, "web-gate-")
	c.openCampaignOf(campaignBody{ID: id, Name: "gated", Stock: 5, PerUserLimit: 1, ChallengeBits: 12,
		StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)})

	var refused purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/"+id+"/purchases", c.token("mallory"), `{"quantity":1}`, nil, &refused); code != http.StatusForbidden || refused.Code != "challenge_failed" {
		t.Fatalf("a purchase without a solution: got %d %q, want 403 challenge_failed", code, refused.Code)
	}
	tab := openPage(t, browser, c.base+"/", c.token("grace"))
	showCampaign(t, tab, id)
	waitJS(t, tab, 30*time.Second, "the buy button opens", `!document.getElementById("buy").disabled`)
	evalJS[bool](t, tab, `(document.getElementById("buy").click(), true)`)
	waitJS(t, tab, 60*time.Second, "success", `document.getElementById("status").dataset.state === "success"`)
	if orders := c.ordersInDB(id); len(orders) != 1 {
		t.Errorf("orders in the database: got %d, want 1 (grace's)", len(orders))
	}
}

// testBrowserPolling: the page's WebSocket cannot connect (a port nobody
// listens on), so flashsale.js polls and the result still arrives.
func testBrowserPolling(t *testing.T, browser context.Context) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	id := testenv.Name(t, "web-")
	c.openCampaign(id, 5, 1)

	tab := openPage(t, browser, c.base+"/?ws="+deadAddr(t), c.token("bob"))
	showCampaign(t, tab, id)
	waitJS(t, tab, 30*time.Second, "the buy button opens", `!document.getElementById("buy").disabled`)
	evalJS[bool](t, tab, `(document.getElementById("buy").click(), true)`)
	waitJS(t, tab, 30*time.Second, "success", `document.getElementById("status").dataset.state === "success"`)
	if via := evalJS[string](t, tab, `document.getElementById("status").dataset.via`); via != "poll" {
		t.Errorf("result arrived by %q, want poll", via)
	}
	if opened := evalJS[int](t, tab, `window.flashsaleClient.stats.socketsOpened`); opened != 0 {
		t.Errorf("sockets opened: got %d, want 0", opened)
	}
}

// testBrowserSoldOut: a shopper who comes after the last unit is sold sees
// "Sold out", whether the page learns it from the campaign, the gateway's
// refusal or the result.
func testBrowserSoldOut(t *testing.T, browser context.Context) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	id := testenv.Name(t, "web-")
	c.openCampaign(id, 1, 1)
	c.buy("dave", id)
	c.settle(id, 30*time.Second)

	tab := openPage(t, browser, c.base+"/", c.token("erin"))
	showCampaign(t, tab, id)
	waitJS(t, tab, 30*time.Second, "sold out", `(() => {
		const s = document.getElementById("status"), b = document.getElementById("buy");
		if (s.dataset.state === "sold_out") return true;
		if (!b.disabled) b.click();
		return false; })()`)
	if text := evalJS[string](t, tab, `document.getElementById("status").textContent`); text != "Sold out" {
		t.Errorf("status %q, want Sold out", text)
	}
	screenshot(t, tab, "shopper-sold-out.png")
	// The list says so too (once the gateway's cache has seen it).
	evalJS[bool](t, tab, `(location.hash = "#/", true)`)
	waitJS(t, tab, 30*time.Second, "the list's sold-out badge",
		fmt.Sprintf(`!!document.querySelector('a[data-campaign=%q] .badge.sold_out')`, id))
}

// testBrowserReconnect: flashsale.js's socket goes through a proxy that
// drops every connection while the purchase is queued; the client opens a
// new socket, subscribes again, and gets the result pushed there, without
// polling.
func testBrowserReconnect(t *testing.T, browser context.Context) {
	cfg := realConfig(t, "redisstream")
	front, _ := startRoles(t, cfg, roleSet{gateway: true, notifier: true})
	c := newClient(t, "http://"+front, cfg.Auth)
	id := testenv.Name(t, "web-")
	c.openCampaign(id, 5, 1)
	proxy := newDropProxy(t, front)

	tab := openPage(t, browser, c.base+"/?ws=ws://"+proxy.addr()+"/api/v1/ws", c.token("frank"))
	showCampaign(t, tab, id)
	waitJS(t, tab, 30*time.Second, "the buy button opens", `!document.getElementById("buy").disabled`)
	evalJS[bool](t, tab, `(document.getElementById("buy").click(), true)`)
	subscribed := `document.getElementById("status").dataset.state === "queued" && window.flashsaleClient.waits.size === 1 &&
		[...window.flashsaleClient.waits.values()].every((w) => w.subscribed)`
	waitJS(t, tab, 30*time.Second, "queued and subscribed", subscribed+` && window.flashsaleClient.stats.socketsOpened === 1`)

	if n := proxy.drop(); n == 0 {
		t.Fatalf("the proxy had no connection to drop")
	}
	waitJS(t, tab, 30*time.Second, "a second socket, subscribed again", subscribed+` && window.flashsaleClient.stats.socketsOpened === 2`)

	startRoles(t, cfg, roleSet{worker: true})
	waitJS(t, tab, 30*time.Second, "success", `document.getElementById("status").dataset.state === "success"`)
	if via := evalJS[string](t, tab, `document.getElementById("status").dataset.via`); via != "websocket" {
		t.Errorf("result arrived by %q, want websocket", via)
	}
	if polls := evalJS[int](t, tab, `window.flashsaleClient.stats.polls`); polls != 0 {
		t.Errorf("polls: got %d, want 0 (the reconnected socket carries the result)", polls)
	}
}

// startBrowser starts the one headless Chromium of TestBrowser; it stops
// with the test.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	testenv.SkipShort(t, "drives a browser")
	path := chromiumPath()
	if path == "" {
		const msg = "no Chromium (apt-get install chromium, or set FLASHSALE_TEST_CHROMIUM)"
		if testenv.InCI() {
			t.Fatalf("CI=true and %s", msg)
		}
		t.Skip(msg)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless, chromedp.NoSandbox, chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		// A background tab's timers must not be throttled: the countdown is
		// what the tests watch.
		chromedp.Flag("disable-background-timer-throttling", true), chromedp.Flag("disable-renderer-backgrounding", true),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	// The first run starts the browser; it must have no timeout.
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start Chromium %s: %v", path, err)
	}
	return browser
}

func chromiumPath() string {
	if p := os.Getenv("FLASHSALE_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// openPage opens url in a new tab of a new browser context at a phone's
// width and signs in with token (unless empty) through the page's form.
func openPage(t *testing.T, browser context.Context, url, token string) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(tab, chromedp.EmulateViewport(390, 780)); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	ctx, cancelNav := context.WithTimeout(tab, 30*time.Second)
	defer cancelNav()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	waitJS(t, tab, 30*time.Second, "the page is ready", `document.documentElement.dataset.ready === "true"`)
	if token == "" {
		return tab
	}
	tok, _ := json.Marshal(token)
	evalJS[bool](t, tab, fmt.Sprintf(`(document.getElementById("token").value = %s, document.getElementById("signin").requestSubmit(), true)`, tok))
	waitJS(t, tab, 10*time.Second, "signed in", `document.getElementById("who").textContent.startsWith("signed in as")`)
	return tab
}

// showCampaign opens a campaign's view from the list.
func showCampaign(t *testing.T, tab context.Context, id string) {
	t.Helper()
	sel, _ := json.Marshal(fmt.Sprintf("a[data-campaign=%q]", id))
	waitJS(t, tab, 30*time.Second, "the campaign in the list", fmt.Sprintf(`!!document.querySelector(%s)`, sel))
	evalJS[bool](t, tab, fmt.Sprintf(`(document.querySelector(%s).click(), true)`, sel))
	waitJS(t, tab, 30*time.Second, "the campaign's view", `document.getElementById("countdown").textContent !== ""`)
}

// evalJS evaluates expr in the tab and returns its value.
func evalJS[T any](t *testing.T, tab context.Context, expr string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		t.Fatalf("evaluate %s: %v\npage: %s", expr, err, pageText(tab))
	}
	return v
}

// waitJS waits until expr is truthy in the tab: the page reacting to an
// event, however slow the machine, within timeout.
func waitJS(t *testing.T, tab context.Context, timeout time.Duration, what, expr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, timeout+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(timeout))); err != nil {
		t.Fatalf("waiting for %s: %v\npage: %s", what, err, pageText(tab))
	}
}

// pageText is what the page shows, for failure messages.
func pageText(tab context.Context) string {
	ctx, cancel := context.WithTimeout(tab, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	return strings.Join(strings.Fields(s), " ")
}

// screenshot writes the tab's page to the directory screenshotsEnv names,
// when it is set.
func screenshot(t *testing.T, tab context.Context, name string) {
	t.Helper()
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(moduleRoot(t), dir)
	}
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for ; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if dir == filepath.Dir(dir) {
			t.Fatalf("no go.mod above the test's directory")
		}
	}
}

// deadAddr is a ws:// URL nothing listens on: a port bound and released.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "ws://" + addr + "/api/v1/ws"
}

// dropProxy forwards TCP connections to a target and drops them all on
// demand, as a load balancer or a notifier's restart would.
type dropProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newDropProxy(t *testing.T, target string) *dropProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln}
	t.Cleanup(func() { _ = ln.Close(); p.drop() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return p
}

func (p *dropProxy) addr() string { return p.ln.Addr().String() }

// drop closes every connection and returns how many pairs it closed.
func (p *dropProxy) drop() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	n := len(p.conns) / 2
	p.conns = nil
	return n
}
