package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/gorilla/websocket"
)

// The waiting crowd (--ws-per-shopper): every shopper opens one WebSocket
// before the sale, as a sale page does, all of them within
// --connect-window before the start (a thundering herd), subscribes each
// of its request ids on it and keeps it until the crowd leaves together.
// Around the crowd the tool reads the notifier's own /metrics: its RSS
// before the crowd, with it connected (and idle for --hold), after it
// left, and the CPU it spent holding the crowd idle.

// Redialling a dropped socket: attempts, and the pause before each retry.
const (
	redialAttempts = 3
	redialPause    = 200 * time.Millisecond
)

// After the crowd leaves, the notifier is read every leavePoll until no
// WebSocket is left and its RSS fell by less than leaveQuietBytes over
// leaveQuiet, or for leaveMax. leaveQuiet spans two of the notifier's
// memory checks (5 s apart, notifier/memory.go): it gives the crowd's
// memory back once the count of sockets held still for one.
const (
	leavePoll       = 500 * time.Millisecond
	leaveQuiet      = 12 * time.Second
	leaveQuietBytes = 1 << 20
	leaveMax        = 30 * time.Second
)

var errSocketBudget = errors.New("socket budget used up")

// crowd is the sockets of a --ws-per-shopper run and what was measured
// around them.
type crowd struct {
	lt      *loadtest
	ctx     context.Context
	readers sync.WaitGroup

	mu         sync.Mutex
	sockets    []*crowdSocket
	connectLat *hdrhistogram.Histogram
	rep        crowdReport

	reconnects atomic.Int64
	lost       atomic.Int64
	// readErr is the first failed read of the notifier's metrics; no
	// reading is tried after it.
	readErr error
	before  notifierReading
}

// crowdReport is what a --ws-per-shopper run adds to the report.
type crowdReport struct {
	ConnectWindowMs float64         `json:"connect_window_ms"`
	Connected       int             `json:"connected"`
	ConnectFailed   connectFailures `json:"connect_failed"`
	ConnectTime     percentiles     `json:"connect_time_ms"`
	// SaleStartLagMs: how long after the window's end the last connect
	// ended, delaying the sale's start (0 when the window held them all).
	SaleStartLagMs float64 `json:"sale_start_lag_ms"`
	Reconnects     int     `json:"reconnects"`
	// Lost: sockets that dropped and could not be redialled; their
	// shoppers polled.
	Lost        int            `json:"lost"`
	HoldSeconds float64        `json:"hold_seconds"`
	Notifier    notifierReport `json:"notifier"`
}

// connectFailures counts the shoppers whose WebSocket was refused or
// failed, by the upgrade's status.
type connectFailures struct {
	TooMany      int            `json:"429"`
	Unavailable  int            `json:"503"`
	Other        int            `json:"other"`
	OtherReasons map[string]int `json:"other_reasons,omitempty"`
}

// notifierReport is the notifier process's figures, from its /metrics.
type notifierReport struct {
	MetricsURL string `json:"metrics_url"`
	// Unavailable says why some or all figures are missing.
	Unavailable string `json:"unavailable,omitempty"`
	// SharedWithLoadtest: the in-process serve; RSS and CPU are the whole
	// process's, the tool's own sockets included.
	SharedWithLoadtest bool  `json:"shared_with_loadtest"`
	RSSBefore          int64 `json:"rss_before_bytes"`
	RSSHerd            int64 `json:"rss_herd_bytes"`      // every shopper connected, before the first purchase
	RSSConnected       int64 `json:"rss_connected_bytes"` // every purchase answered, after --hold
	RSSAfterLeave      int64 `json:"rss_after_leave_bytes"`
	// BytesPerConnection is (RSS connected − RSS before) / the notifier's
	// WebSocket clients then.
	BytesPerConnection     *float64 `json:"bytes_per_connection"`
	ClientsHerd            int      `json:"websocket_clients_herd"`
	ClientsConnected       int      `json:"websocket_clients_connected"`
	SubscriptionsConnected int      `json:"websocket_subscriptions_connected"`
	ClientsAfterLeave      int      `json:"websocket_clients_after_leave"`
	// Upgrades: requests to the WebSocket route the notifier answered from
	// before the crowd until it left (refused ones included).
	Upgrades int `json:"websocket_upgrades"`
	// IdleCPUSeconds is the notifier's CPU time during --hold.
	IdleCPUSeconds    *float64 `json:"idle_cpu_seconds"`
	AfterLeaveWaitMs  float64  `json:"after_leave_wait_ms"`
	AfterLeaveSettled bool     `json:"after_leave_settled"`
}

// notifierReading is what the notifier's /metrics said at one moment.
type notifierReading struct {
	rss, cpuSeconds, clients, subscriptions, upgrades float64
}

// gatherCrowd reads the notifier, then connects every shopper within
// --connect-window and returns once the window is over and every connect
// ended: the sale starts then.
func (lt *loadtest) gatherCrowd(ctx context.Context, shoppers []*shopper, embedded bool) (*crowd, error) {
	c := &crowd{lt: lt, ctx: ctx, connectLat: hdrhistogram.New(1, maxLatencyMicros, 3)}
	c.rep.ConnectWindowMs = float64(lt.o.connectWindow.Microseconds()) / 1000
	c.rep.HoldSeconds = lt.o.hold.Seconds()
	c.rep.Notifier = notifierReport{MetricsURL: lt.o.metricsURL, SharedWithLoadtest: embedded}
	before, ok := c.read()
	if !ok && lt.o.metricsURLSet {
		return nil, fmt.Errorf("--metrics-url %s: %v", lt.o.metricsURL, c.readErr)
	}
	c.before = before
	c.rep.Notifier.RSSBefore = int64(before.rss)

	lt.say("%d shoppers connect within %s", len(shoppers), lt.o.connectWindow)
	start := time.Now()
	saleAt := start.Add(lt.o.connectWindow)
	var dials sync.WaitGroup
	for i, s := range shoppers {
		due := start.Add(time.Duration(int64(lt.o.connectWindow) * int64(i) / int64(len(shoppers))))
		if !sleepUntil(ctx, due) {
			break
		}
		select {
		case lt.wsSlots <- struct{}{}:
			dials.Go(func() { c.connect(s) })
		default:
			s.noSocket = errSocketBudget
		}
	}
	dials.Wait()
	sleepUntil(ctx, saleAt)
	if lag := time.Since(saleAt); lag > time.Millisecond {
		c.rep.SaleStartLagMs = float64(lag.Microseconds()) / 1000
	}
	if err := ctx.Err(); err != nil {
		c.leave()
		return nil, err
	}
	// The notifier counts a socket once its 101 is written, which the
	// shopper may read first: the last few may lag the herd by a moment.
	herd, _ := c.read()
	for wait := time.Now().Add(2 * time.Second); int(herd.clients) < len(c.sockets) && time.Now().Before(wait); {
		time.Sleep(20 * time.Millisecond)
		herd, _ = c.read()
	}
	c.rep.Notifier.RSSHerd, c.rep.Notifier.ClientsHerd = int64(herd.rss), int(herd.clients)
	f := c.rep.ConnectFailed
	lt.say("%d of %d shoppers connected (refused: 429 %d, 503 %d, other %d); the sale starts",
		len(c.sockets), len(shoppers), f.TooMany, f.Unavailable, f.Other)
	return c, nil
}

// connect opens s's socket, holding one of lt.wsSlots until the crowd
// leaves (or at once, if it fails).
func (c *crowd) connect(s *shopper) {
	t0 := time.Now()
	ws, status, err := c.lt.dialWS(c.ctx, s)
	took := time.Since(t0)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		<-c.lt.wsSlots
		f := &c.rep.ConnectFailed
		switch status {
		case http.StatusTooManyRequests:
			f.TooMany++
		case http.StatusServiceUnavailable:
			f.Unavailable++
		default:
			f.Other++
			reason := "status " + strconv.Itoa(status)
			if status == 0 {
				reason = shortError(err)
			}
			if f.OtherReasons == nil {
				f.OtherReasons = map[string]int{}
			}
			f.OtherReasons[reason]++
		}
		s.noSocket = fmt.Errorf("connect failed: %s", connectFailure(status, err))
		return
	}
	_ = c.connectLat.RecordValue(micros(took))
	cs := &crowdSocket{c: c, s: s, ws: ws, waiting: map[string]chan crowdDelivery{}}
	s.socket = cs
	c.sockets = append(c.sockets, cs)
	c.readers.Go(cs.read)
}

func connectFailure(status int, err error) string {
	if status != 0 {
		return "status " + strconv.Itoa(status)
	}
	return shortError(err)
}

// shortError is an error's last part: a dial error's cause without the
// address in front.
func shortError(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

// hold keeps the crowd connected and idle for --hold once every purchase
// is answered, reading the notifier at its start and end.
func (c *crowd) hold() {
	lt := c.lt
	start, _ := c.read()
	if lt.o.hold > 0 {
		lt.say("every purchase answered; the crowd waits, idle, for %s", lt.o.hold)
		sleepUntil(c.ctx, time.Now().Add(lt.o.hold))
	}
	end, ok := c.read()
	if lt.o.hold > 0 {
		// The script that starts a worker after the hold waits for this line.
		lt.say("hold over; waiting for the results")
		if ok {
			v := end.cpuSeconds - start.cpuSeconds
			c.rep.Notifier.IdleCPUSeconds = &v
		}
	}
	n := &c.rep.Notifier
	n.RSSConnected, n.ClientsConnected, n.SubscriptionsConnected = int64(end.rss), int(end.clients), int(end.subscriptions)
	if ok && end.clients > 0 {
		v := (end.rss - c.before.rss) / end.clients
		n.BytesPerConnection = &v
	}
}

// leave closes every socket, then reads the notifier until its memory
// settles (or leaveMax).
func (c *crowd) leave() {
	for _, cs := range c.sockets {
		cs.close()
		<-c.lt.wsSlots
	}
	c.readers.Wait()
	if c.readErr != nil {
		return
	}
	c.lt.say("the crowd left; reading the notifier until its memory settles (at most %s)", leaveMax)
	t0 := time.Now()
	var seen []notifierReading
	var at []time.Time
	n := &c.rep.Notifier
	for {
		r, ok := c.read()
		if !ok {
			break
		}
		seen, at = append(seen, r), append(at, time.Now())
		n.RSSAfterLeave, n.ClientsAfterLeave = int64(r.rss), int(r.clients)
		n.Upgrades = int(r.upgrades - c.before.upgrades)
		if r.clients == 0 {
			for i := len(seen) - 1; i >= 0; i-- {
				if at[len(at)-1].Sub(at[i]) >= leaveQuiet {
					n.AfterLeaveSettled = seen[i].rss-r.rss < leaveQuietBytes
					break
				}
			}
		}
		if n.AfterLeaveSettled || time.Since(t0) >= leaveMax || !sleepUntil(c.ctx, time.Now().Add(leavePoll)) {
			break
		}
	}
	n.AfterLeaveWaitMs = float64(time.Since(t0).Microseconds()) / 1000
}

// report fills in what the sockets counted.
func (c *crowd) report() *crowdReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	rep := c.rep
	rep.Connected = len(c.sockets)
	rep.ConnectTime = percentilesOf(c.connectLat)
	rep.Reconnects, rep.Lost = int(c.reconnects.Load()), int(c.lost.Load())
	if c.readErr != nil {
		rep.Notifier.Unavailable = c.readErr.Error()
	}
	return &rep
}

// read reads the notifier's metrics; after a failure it stops trying (the
// report says why) and returns false.
func (c *crowd) read() (notifierReading, bool) {
	if c.readErr != nil {
		return notifierReading{}, false
	}
	r, err := c.lt.readNotifier(c.ctx)
	if err != nil {
		c.readErr = err
		return notifierReading{}, false
	}
	return r, true
}

// readNotifier fetches and parses --metrics-url.
func (lt *loadtest) readNotifier(ctx context.Context) (notifierReading, error) {
	rctx, cancel := context.WithTimeout(ctx, lt.o.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, lt.o.metricsURL, nil)
	if err != nil {
		return notifierReading{}, err
	}
	resp, err := lt.http.Do(req)
	if err != nil {
		return notifierReading{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return notifierReading{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return notifierReading{}, fmt.Errorf("GET %s: status %d (with http.admin_addr set, /metrics is on the admin listener: pass --metrics-url)",
			lt.o.metricsURL, resp.StatusCode)
	}
	return parseNotifierMetrics(string(body))
}

// parseNotifierMetrics picks the notifier's figures out of Prometheus's
// text format.
func parseNotifierMetrics(text string) (notifierReading, error) {
	var r notifierReading
	var haveRSS, haveClients bool
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, rest := line, "", ""
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			name, labels, rest = line[:i], line[i+1:j], line[j+1:]
		} else if i := strings.IndexByte(line, ' '); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		switch name {
		case "process_resident_memory_bytes":
			r.rss, haveRSS = v, true
		case "process_cpu_seconds_total":
			r.cpuSeconds = v
		case "flashsale_websocket_clients":
			r.clients, haveClients = v, true
		case "flashsale_websocket_subscriptions":
			r.subscriptions = v
		case "flashsale_http_requests_total":
			if strings.Contains(labels, `route="/api/v1/ws"`) {
				r.upgrades += v
			}
		}
	}
	switch {
	case !haveRSS:
		return r, errors.New("no process_resident_memory_bytes in the metrics")
	case !haveClients:
		return r, errors.New("no flashsale_websocket_clients in the metrics: not a notifier's")
	}
	return r, nil
}

// crowdSocket is one shopper's WebSocket: subscribe frames go out from the
// shopper's waiting purchases, one reader routes what comes back and
// redials when the connection drops.
type crowdSocket struct {
	c *crowd
	s *shopper

	writeMu sync.Mutex // gorilla allows one writer at a time

	mu      sync.Mutex
	ws      *websocket.Conn
	waiting map[string]chan crowdDelivery // request id → its waiting purchase
	leaving bool
	// lost: the connection dropped and could not be redialled; the
	// shopper's later results are polled.
	lost error
}

type crowdDelivery struct {
	r   finalResult
	err error
}

// await subscribes to rid and waits for its final result until deadline.
func (cs *crowdSocket) await(ctx context.Context, rid string, deadline time.Time) (finalResult, error) {
	ch := make(chan crowdDelivery, 1)
	// Registered and subscribed on the socket current at registration: a
	// redial takes both together, so it subscribes rid anew or rid goes
	// out on the new socket.
	cs.mu.Lock()
	if cs.lost != nil {
		cs.mu.Unlock()
		return finalResult{}, cs.lost
	}
	cs.waiting[rid] = ch
	ws := cs.ws
	cs.mu.Unlock()
	cs.subscribe(ws, []string{rid})

	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case d := <-ch:
		return d.r, d.err
	case <-timer.C:
		cs.forget(rid)
		return finalResult{}, errNotSettled
	case <-ctx.Done():
		cs.forget(rid)
		return finalResult{}, ctx.Err()
	}
}

// subscribe sends one subscribe frame. A failed write closes the
// connection: the reader then redials and subscribes every waiting id.
func (cs *crowdSocket) subscribe(ws *websocket.Conn, ids []string) {
	cs.writeMu.Lock()
	defer cs.writeMu.Unlock()
	_ = ws.SetWriteDeadline(time.Now().Add(cs.c.lt.o.timeout))
	if err := ws.WriteJSON(map[string]any{"type": "subscribe", "request_ids": ids}); err != nil {
		_ = ws.Close()
	}
}

func (cs *crowdSocket) forget(rid string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	delete(cs.waiting, rid)
}

func (cs *crowdSocket) deliver(rid string, d crowdDelivery) {
	cs.mu.Lock()
	ch, ok := cs.waiting[rid]
	delete(cs.waiting, rid)
	cs.mu.Unlock()
	if ok {
		ch <- d
	}
}

// read routes the socket's frames until the crowd leaves or the socket is
// lost. gorilla answers the server's pings while it reads.
func (cs *crowdSocket) read() {
	for {
		cs.mu.Lock()
		ws := cs.ws
		cs.mu.Unlock()
		_, data, err := ws.ReadMessage()
		if err != nil {
			if !cs.redial(err) {
				return
			}
			continue
		}
		var msg struct {
			Type      string      `json:"type"`
			Code      string      `json:"code"`
			RequestID string      `json:"request_id"`
			Result    finalResult `json:"result"`
		}
		if json.Unmarshal(data, &msg) != nil {
			continue
		}
		switch {
		case msg.Type == "result" && msg.Result.final():
			cs.deliver(msg.Result.RequestID, crowdDelivery{r: msg.Result})
		case msg.Type == "error" && msg.RequestID != "":
			cs.deliver(msg.RequestID, crowdDelivery{err: fmt.Errorf("server refused the subscription: %s", msg.Code)})
		}
	}
}

// redial replaces a dropped connection and subscribes every waiting id on
// the new one; it reports whether reading goes on. When the redial fails,
// every waiting purchase is told, and polls.
func (cs *crowdSocket) redial(cause error) bool {
	cs.mu.Lock()
	leaving := cs.leaving
	cs.mu.Unlock()
	if leaving {
		return false
	}
	var ws *websocket.Conn
	var err error
	for attempt := range redialAttempts {
		if attempt > 0 && !sleepUntil(cs.c.ctx, time.Now().Add(redialPause)) {
			break
		}
		if ws, _, err = cs.c.lt.dialWS(cs.c.ctx, cs.s); err == nil {
			break
		}
	}
	cs.mu.Lock()
	if cs.leaving {
		cs.mu.Unlock()
		if ws != nil {
			_ = ws.Close()
		}
		return false
	}
	if ws == nil {
		cs.lost = fmt.Errorf("socket dropped (%s), redial failed: %s", shortError(cause), shortError(err))
		waiting := cs.waiting
		cs.waiting = map[string]chan crowdDelivery{}
		cs.mu.Unlock()
		cs.c.lost.Add(1)
		for _, ch := range waiting {
			ch <- crowdDelivery{err: cs.lost}
		}
		return false
	}
	cs.ws = ws
	ids := make([]string, 0, len(cs.waiting))
	for id := range cs.waiting {
		ids = append(ids, id)
	}
	cs.mu.Unlock()
	cs.c.reconnects.Add(1)
	if len(ids) > 0 {
		cs.subscribe(ws, ids)
	}
	return true
}

// close leaves: a close frame, then the connection goes.
func (cs *crowdSocket) close() {
	cs.mu.Lock()
	cs.leaving = true
	ws := cs.ws
	cs.mu.Unlock()
	_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	_ = ws.Close()
}
