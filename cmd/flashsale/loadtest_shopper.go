package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/valyala/fasthttp"
)

// shopper is one simulated user.
type shopper struct {
	user, token string
	// repeat: buys a second time after the first answer (a new request).
	repeat bool
	// replay: sends the first purchase with an Idempotency-Key and resends
	// it, as a client retrying after a lost answer would.
	replay bool
	// pays: in a lifecycle run, pays for an order rather than let it expire.
	pays bool
	// socket: with --ws-per-shopper, the shopper's one WebSocket; nil when
	// it has none, for the reason in noSocket.
	socket   *crowdSocket
	noSocket error
	// challenge: the solution of its last keyed purchase, with
	// --challenge-bits (loadtest_challenge.go).
	challenge shopperChallenge
}

// purchaseAnswer is the gateway's answer to one purchase.
type purchaseAnswer struct {
	status    int
	code      string // the error body's code, or "transport" when there was no answer
	requestID string
	// decided is the final result a 202 carries when the purchase was
	// decided at once (in MySQL, while Redis is out: the degraded mode).
	decided *finalResult
}

// shop runs one shopper: its purchases now, its results in the background
// (counted in waiters). done is called once every result it waits for came.
func (lt *loadtest) shop(ctx context.Context, s *shopper, due time.Time, waiters *sync.WaitGroup, done func()) {
	var mine sync.WaitGroup
	await := func(a purchaseAnswer, sent time.Time) {
		if a.status != http.StatusAccepted {
			return
		}
		lt.rec.admitted(s.user, a.requestID)
		if a.decided != nil {
			lt.rec.result(s.user, *a.decided, "answer", sent)
			mine.Go(func() { lt.afterResult(ctx, s, *a.decided) })
			return
		}
		mine.Go(func() { lt.awaitResult(ctx, s, a.requestID, sent) })
	}

	key := ""
	if s.replay {
		key = "lt-" + s.user
	}
	first := lt.purchase(ctx, s, key, due)
	await(first, due)
	switch {
	case s.replay && first.status == http.StatusAccepted:
		again := lt.purchase(ctx, s, key, time.Now())
		lt.rec.replayed(first.requestID, again)
		await(again, time.Now()) // only a broken gateway admits the replay anew
	case s.replay && first.code == "transport":
		// The first answer was lost (a timeout, a dropped connection): the
		// replay admits the purchase now (202) or names the request the
		// first one started (200), which the shopper then waits for.
		again := lt.purchase(ctx, s, key, time.Now())
		if again.status == http.StatusOK && again.requestID != "" {
			lt.rec.admitted(s.user, again.requestID)
			mine.Go(func() { lt.awaitResult(ctx, s, again.requestID, due) })
		}
		await(again, time.Now())
	}
	if s.repeat && first.status != 0 {
		sent := time.Now()
		await(lt.purchase(ctx, s, "", sent), sent)
	}
	waiters.Go(func() {
		mine.Wait()
		done()
	})
}

// newShopperClient is the client of the shoppers' requests to baseURL (a
// URL validated by the flags), with at most conns connections.
func newShopperClient(baseURL string, conns int, timeout time.Duration) *fasthttp.HostClient {
	u, _ := url.Parse(baseURL)
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	return &fasthttp.HostClient{
		Addr:                     host,
		IsTLS:                    u.Scheme == "https",
		MaxConns:                 conns,
		MaxConnWaitTimeout:       timeout,
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		NoDefaultUserAgentHeader: true,
		// A purchase is not idempotent without its key: never resend one.
		MaxIdemponentCallAttempts: 1,
	}
}

// shopperCall sends req to route through client (lt.shoppers or
// lt.results), fills resp (valid until it is released) and records the
// answer's status and time, or that there was none.
func (lt *loadtest) shopperCall(ctx context.Context, client *fasthttp.HostClient, route string, req *fasthttp.Request, resp *fasthttp.Response) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sent := time.Now()
	err := client.DoTimeout(req, resp, lt.o.timeout)
	if err != nil {
		lt.rec.call(route, 0, 0, err)
		return err
	}
	lt.rec.call(route, resp.StatusCode(), time.Since(sent), nil)
	return nil
}

// purchase sends one purchase; its latency counts from due.
func (lt *loadtest) purchase(ctx context.Context, s *shopper, key string, due time.Time) purchaseAnswer {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(lt.purchaseURL)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.SetContentType("application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if a, ok := lt.challengeHeader(ctx, s, key, req, due); !ok {
		return a
	}
	req.SetBodyString(`{"quantity":1}`)
	if err := lt.shopperCall(ctx, lt.shoppers, routePurchase, req, resp); err != nil {
		a := purchaseAnswer{code: "transport"}
		lt.rec.answer(a, time.Since(due), err)
		return a
	}
	var body struct {
		finalResult
		Code string `json:"code"`
	}
	_ = json.Unmarshal(resp.Body(), &body)
	a := purchaseAnswer{status: resp.StatusCode(), code: body.Code, requestID: body.RequestID}
	if a.status == http.StatusAccepted && body.final() {
		// The answer names no quantity: the one bought, {"quantity":1}.
		body.Quantity = 1
		a.decided = &body.finalResult
	}
	if a.code == "" && a.status >= 300 {
		a.code = fmt.Sprintf("http_%d", a.status)
	}
	lt.rec.answer(a, time.Since(due), nil)
	return a
}

// finalResult is a request's final outcome as the shopper learned it.
type finalResult struct {
	RequestID string `json:"request_id"`
	Status    string `json:"status"`
	OrderID   string `json:"order_id"`
	Quantity  int64  `json:"quantity"`
}

func (r finalResult) final() bool {
	switch r.Status {
	case "success", "sold_out", "limit_exceeded", "rejected":
		return true
	}
	return false
}

// awaitResult waits for rid's final result until sent+hold+settle: over a
// WebSocket (the shopper's own with --ws-per-shopper, else one for this
// request while the socket budget allows), else (or if the socket fails)
// by polling.
func (lt *loadtest) awaitResult(ctx context.Context, s *shopper, rid string, sent time.Time) {
	deadline := sent.Add(lt.o.hold + lt.o.settle)
	if lt.o.results == "ws" {
		r, err := lt.wsAwait(ctx, s, rid, deadline)
		if err == nil {
			lt.rec.result(s.user, r, "ws", sent)
			lt.afterResult(ctx, s, r)
			return
		}
		lt.rec.wsFailed(err)
	}
	r, err := lt.pollResult(ctx, s, rid, deadline)
	if err != nil {
		lt.rec.missing(rid, err)
		return
	}
	lt.rec.result(s.user, r, "poll", sent)
	lt.afterResult(ctx, s, r)
}

// wsAwait waits for rid's result over a WebSocket; its error says why the
// result must be polled instead.
func (lt *loadtest) wsAwait(ctx context.Context, s *shopper, rid string, deadline time.Time) (finalResult, error) {
	if lt.o.wsPerShopper {
		if s.socket == nil {
			return finalResult{}, s.noSocket
		}
		return s.socket.await(ctx, rid, deadline)
	}
	select {
	case lt.wsSlots <- struct{}{}:
		defer func() { <-lt.wsSlots }()
		return lt.wsResult(ctx, s, rid, deadline)
	default:
		return finalResult{}, errSocketBudget
	}
}

// afterResult settles a new order in a lifecycle run.
func (lt *loadtest) afterResult(ctx context.Context, s *shopper, r finalResult) {
	if lt.o.lifecycle && r.Status == "success" {
		lt.settleOrder(ctx, s, r.OrderID)
	}
}

// dialWS opens a WebSocket to the notifier as s. A refused upgrade's error
// comes with its HTTP status; other failures with 0.
func (lt *loadtest) dialWS(ctx context.Context, s *shopper) (*websocket.Conn, int, error) {
	u, _ := url.Parse(lt.o.resultsURL + "/api/v1/ws")
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.RawQuery = "access_token=" + url.QueryEscape(s.token)
	sent := time.Now()
	conn, resp, err := lt.dialer.DialContext(ctx, u.String(), nil)
	status := 0
	if resp != nil {
		status = resp.StatusCode
		if resp.Body != nil {
			_ = resp.Body.Close()
		}
	}
	if ctx.Err() == nil {
		lt.rec.call(routeWS, status, time.Since(sent), err)
	}
	if err != nil {
		return nil, status, fmt.Errorf("dial: %w", err)
	}
	lt.rec.wsOpen()
	return conn, 0, nil
}

// wsResult subscribes to rid on its own WebSocket and reads until the result.
func (lt *loadtest) wsResult(ctx context.Context, s *shopper, rid string, deadline time.Time) (finalResult, error) {
	conn, _, err := lt.dialWS(ctx, s)
	if err != nil {
		return finalResult{}, err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(deadline)
	if err := conn.WriteJSON(map[string]any{"type": "subscribe", "request_ids": []string{rid}}); err != nil {
		return finalResult{}, fmt.Errorf("subscribe: %w", err)
	}
	for {
		var msg struct {
			Type   string      `json:"type"`
			Code   string      `json:"code"`
			Result finalResult `json:"result"`
		}
		if err := conn.ReadJSON(&msg); err != nil {
			return finalResult{}, fmt.Errorf("read: %w", err)
		}
		switch msg.Type {
		case "result":
			if msg.Result.RequestID == rid && msg.Result.final() {
				return msg.Result, nil
			}
		case "error":
			return finalResult{}, fmt.Errorf("server refused the subscription: %s", msg.Code)
		}
	}
}

// Poll backoff: the first poll comes after pollFirst, then the wait doubles
// up to pollMax, so waiting shoppers cannot swamp the gateway.
const (
	pollFirst = 25 * time.Millisecond
	pollMax   = time.Second
)

var errNotSettled = errors.New("no final result before the settle deadline")

// pollResult polls rid until it is final or deadline passes.
func (lt *loadtest) pollResult(ctx context.Context, s *shopper, rid string, deadline time.Time) (finalResult, error) {
	wait := pollFirst
	for {
		next := time.Now().Add(wait)
		if next.After(deadline) {
			next = deadline
		}
		if !sleepUntil(ctx, next) {
			return finalResult{}, ctx.Err()
		}
		lt.rec.pollSent()
		a := lt.poll(ctx, s, rid)
		if a.err == nil && a.result.final() {
			return a.result, nil
		}
		if !time.Now().Before(deadline) {
			if a.err != nil {
				return finalResult{}, fmt.Errorf("%w (last poll: %v)", errNotSettled, a.err)
			}
			return finalResult{}, fmt.Errorf("%w (still %s)", errNotSettled, a.result.Status)
		}
		wait = max(min(2*wait, pollMax), a.retryAfter)
	}
}

// pollAnswer is the notifier's answer to one poll: status 0 when there was
// none, err saying why it holds no result.
type pollAnswer struct {
	status     int
	result     finalResult
	retryAfter time.Duration
	err        error
}

func (lt *loadtest) poll(ctx context.Context, s *shopper, rid string) pollAnswer {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(lt.o.resultsURL + "/api/v1/purchases/" + url.PathEscape(rid))
	req.Header.Set("Authorization", "Bearer "+s.token)
	if err := lt.shopperCall(ctx, lt.results, routePoll, req, resp); err != nil {
		return pollAnswer{err: err}
	}
	a := pollAnswer{status: resp.StatusCode()}
	if secs, err := strconv.Atoi(string(resp.Header.Peek("Retry-After"))); err == nil && secs > 0 {
		a.retryAfter = time.Duration(secs) * time.Second
	}
	if a.status != http.StatusOK {
		a.err = fmt.Errorf("poll %s: status %d: %s", rid, a.status, bytes.TrimSpace(resp.Body()))
		return a
	}
	if err := json.Unmarshal(resp.Body(), &a.result); err != nil {
		a.err = fmt.Errorf("poll %s: %w", rid, err)
	}
	return a
}

// sleepUntil waits until t or ctx ends; it reports whether t was reached.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// adminCall sends an admin API request and decodes a 2xx answer into out.
func (lt *loadtest) adminCall(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, lt.o.url+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+lt.o.adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := lt.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(raw, &e)
		return fmt.Errorf("%s %s: status %d %s: %s", method, path, resp.StatusCode, e.Code, e.Message)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
}

// setUp checks that the gateway and the notifier serve the routes the run
// needs, then creates and preloads the campaign.
func (lt *loadtest) setUp(ctx context.Context) error {
	if err := lt.checkRoutes(ctx); err != nil {
		return err
	}
	if lt.o.existing {
		return lt.adopt(ctx)
	}
	now := time.Now().UTC()
	c := map[string]any{"id": lt.o.campaign, "name": "loadtest " + lt.o.campaign, "stock": lt.o.stock,
		"per_user_limit": lt.o.perUserLimit, "start_at": now.Add(-time.Second), "end_at": now.Add(24 * time.Hour)}
	if lt.o.buckets > 1 {
		c["buckets"] = lt.o.buckets
	}
	if lt.o.challenge.bits > 0 {
		c["challenge_bits"] = lt.o.challenge.bits
	}
	if lt.o.lifecycle {
		c["price"] = lifecyclePrice
		if lt.o.paymentWindow > 0 {
			c["payment_window"] = lt.o.paymentWindow.String()
		}
	}
	if err := lt.adminCall(ctx, http.MethodPost, "/admin/v1/campaigns", c, nil); err != nil {
		return fmt.Errorf("create campaign: %w", err)
	}
	if err := lt.adminCall(ctx, http.MethodPost, "/admin/v1/campaigns/"+lt.o.campaign+"/preload", nil, nil); err != nil {
		return fmt.Errorf("preload campaign: %w", err)
	}
	return nil
}

// adopt makes the campaign of --existing the run's: its stock, limit,
// buckets and challenge become the run's options. A campaign somebody
// bought from already is refused, since the invariants count this run's
// shoppers alone: its stats say so, or, while they cannot be read (Redis
// out, MySQL not deciding the campaign yet), its orders.
func (lt *loadtest) adopt(ctx context.Context) error {
	var c existingCampaign
	if err := lt.adminCall(ctx, http.MethodGet, "/admin/v1/campaigns/"+lt.o.campaign, nil, &c); err != nil {
		return fmt.Errorf("read campaign: %w", err)
	}
	var st serverStats
	if err := lt.adminCall(ctx, http.MethodGet, "/admin/v1/campaigns/"+lt.o.campaign+"/stats", nil, &st); err != nil {
		// Redis is out and MySQL does not decide the campaign yet: its
		// orders tell, though not the refusals Redis alone held.
		var orders struct {
			Orders []json.RawMessage `json:"orders"`
		}
		if err := lt.adminCall(ctx, http.MethodGet, "/admin/v1/campaigns/"+lt.o.campaign+"/orders?limit=1", nil, &orders); err != nil {
			return fmt.Errorf("read the orders of campaign %s: %w", lt.o.campaign, err)
		}
		st.OrdersInDB = int64(len(orders.Orders))
		lt.say("campaign %s: no stats (%v); %d orders in MySQL", lt.o.campaign, err, st.OrdersInDB)
	}
	if st.Admitted > 0 || st.OrdersInDB > 0 {
		return fmt.Errorf("campaign %s: %d requests admitted and %d orders already; --existing sells a campaign nobody bought from",
			lt.o.campaign, st.Admitted, st.OrdersInDB)
	}
	lt.o.stock, lt.o.perUserLimit, lt.o.buckets, lt.o.challenge.bits = c.Stock, c.PerUserLimit, max(c.Buckets, 1), c.ChallengeBits
	lt.rec.o = lt.o
	return nil
}

// existingCampaign is what the run reads of the campaign of --existing.
type existingCampaign struct {
	Stock         int64 `json:"stock"`
	PerUserLimit  int64 `json:"per_user_limit"`
	Buckets       int   `json:"buckets"`
	ChallengeBits int   `json:"challenge_bits"`
}

// route is one route the run needs, probed without a token: a server that
// has it refuses the probe (401), one that has not answers 404.
type route struct {
	method, path string
}

// checkRoutes fails, before anything is created, unless --url answers and
// serves the purchases (and, in a lifecycle run, payments) and
// --results-url answers and serves the results. Against separate processes
// the two are a gateway and a notifier; a results URL that points at a
// gateway would otherwise lose every result and break every invariant.
func (lt *loadtest) checkRoutes(ctx context.Context) error {
	gateway := []route{{http.MethodPost, "/api/v1/campaigns/" + lt.o.campaign + "/purchases"}}
	if lt.o.lifecycle {
		gateway = append(gateway, route{http.MethodPost, "/api/v1/orders/0/pay"})
	}
	// Polling is the fallback of a WebSocket run too.
	results := []route{{http.MethodGet, "/api/v1/purchases/" + lt.o.campaign + ".0"}}
	if lt.o.results == "ws" {
		results = append(results, route{http.MethodGet, "/api/v1/ws"})
	}
	checks := []struct {
		flag, base, role string
		routes           []route
	}{
		{"url", lt.o.url, "a gateway", gateway},
		{"results-url", lt.o.resultsURL, "a notifier (the WebSocket and poll routes)", results},
	}
	for _, c := range checks {
		if _, err := lt.probe(ctx, http.MethodGet, c.base+"/healthz"); err != nil {
			return fmt.Errorf("--%s %s unreachable: %v", c.flag, c.base, err)
		}
		for _, r := range c.routes {
			status, err := lt.probe(ctx, r.method, c.base+r.path)
			if err != nil {
				return fmt.Errorf("--%s %s: %s %s: %v", c.flag, c.base, r.method, r.path, err)
			}
			if status == http.StatusNotFound {
				return fmt.Errorf("--%s %s does not serve %s %s (404): it must be %s", c.flag, c.base, r.method, r.path, c.role)
			}
		}
	}
	return nil
}

// probe sends a request without a token and returns the answer's status.
func (lt *loadtest) probe(ctx context.Context, method, target string) (int, error) {
	pctx, cancel := context.WithTimeout(ctx, lt.o.timeout)
	defer cancel()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("{}")
	}
	req, err := http.NewRequestWithContext(pctx, method, target, body)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := lt.http.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// serverStats is the admin stats endpoint's answer.
type serverStats struct {
	Stock            int64            `json:"stock"`
	Remaining        int64            `json:"remaining"`
	Sold             int64            `json:"sold"`
	SoldOut          bool             `json:"sold_out"`
	Admitted         int64            `json:"admitted"`
	Queued           int64            `json:"queued"`
	Lost             int64            `json:"lost"`
	FinishedByStatus map[string]int64 `json:"finished_by_status"`
	OrdersInDB       int64            `json:"orders_in_db"`
	UnitsInDB        int64            `json:"units_in_db"`
}

// settledStats reads the campaign's stats until nothing is queued and MySQL
// holds every sale (stored says so), or until deadline; then it returns the
// last reading.
func (lt *loadtest) settledStats(ctx context.Context, deadline time.Time, stored func(serverStats) bool) (serverStats, error) {
	for {
		var st serverStats
		err := lt.adminCall(ctx, http.MethodGet, "/admin/v1/campaigns/"+lt.o.campaign+"/stats", nil, &st)
		if err == nil && st.Queued == 0 && stored(st) {
			return st, nil
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			if err != nil {
				return serverStats{}, fmt.Errorf("campaign stats: %w", err)
			}
			return st, nil
		}
		sleepUntil(ctx, time.Now().Add(50*time.Millisecond))
	}
}
