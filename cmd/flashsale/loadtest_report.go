package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// recorder collects what shoppers saw; every method is safe for concurrent
// use. Latencies go into HDR histograms in microseconds.
type recorder struct {
	o         loadtestOptions
	httpConns int
	wsCap     int

	// saleCPU is the CPU seconds of the process at --metrics-url from the
	// sale's start until every result was in; -1 when unknown.
	saleCPU float64

	mu           sync.Mutex
	t0, firedAt  time.Time
	lastAnswerAt time.Time
	requests     int
	admittedN    int // 202
	replayedN    int // 200: an Idempotency-Key matched
	rateLimitedN int // 429
	refused      map[string]int
	transport    map[string]int // transport errors, by a short message
	admitLat     *hdrhistogram.Histogram
	resultLat    *hdrhistogram.Histogram
	owner        map[string]string // admitted request id -> user
	admittedBy   map[string]int64  // user -> admitted requests
	results      map[string]finalResult
	byChannel    map[string]int
	byStatus     map[string]int
	duplicates   int            // a result for a request id seen twice
	wsFailures   map[string]int // why results were polled on a WebSocket run
	wsOpened     int            // WebSockets that connected
	polls        int            // polls sent, answered or not
	missingN     int
	missingOne   string           // one missing request, for the report
	idemBroken   int              // replays that started a second request
	idemExamples []string         // the first few, for the report
	units        map[string]int64 // user -> units bought (successes)
	successes    int64
	soldOutSeen  bool // a 410 sold_out or a sold_out result
	soldOutAt    time.Time
	lastResultAt time.Time
	// settledOrders counts, in a lifecycle run, what buyers did with their
	// orders (orderSettled).
	settledOrders map[string]int
	// routes: every HTTP request the shoppers sent, by route (call);
	// marked: those answered within --mark-after/--mark-for.
	routes, marked routeSet
	lastPollAt     time.Time         // the last poll answered
	retracted      map[string]string // request id -> a success told, then contradicted (loadtest_reread.go)
	reread         rereadCounts      // what the final re-read found
}

const maxLatencyMicros = int64(10 * time.Minute / time.Microsecond)

func newRecorder(o loadtestOptions, httpConns, wsCap int) *recorder {
	return &recorder{o: o, httpConns: httpConns, wsCap: wsCap, saleCPU: -1,
		refused: map[string]int{}, transport: map[string]int{},
		admitLat: hdrhistogram.New(1, maxLatencyMicros, 3), resultLat: hdrhistogram.New(1, maxLatencyMicros, 3),
		owner: map[string]string{}, admittedBy: map[string]int64{}, results: map[string]finalResult{},
		byChannel: map[string]int{"ws": 0, "poll": 0, "answer": 0}, byStatus: map[string]int{}, wsFailures: map[string]int{},
		units: map[string]int64{}, settledOrders: map[string]int{},
		routes: routeSet{}, marked: routeSet{}, retracted: map[string]string{}}
}

func (r *recorder) start(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t0 = t
}

func (r *recorder) fired(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.firedAt = t
}

func micros(d time.Duration) int64 { return min(max(d.Microseconds(), 1), maxLatencyMicros) }

// answer records one purchase answer (or transport failure).
func (r *recorder) answer(a purchaseAnswer, latency time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	r.lastAnswerAt = time.Now()
	if err != nil {
		msg := err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
		r.transport[msg]++
		return
	}
	_ = r.admitLat.RecordValue(micros(latency))
	if a.status == http.StatusTooManyRequests {
		r.rateLimitedN++
	}
	switch a.status {
	case http.StatusAccepted:
		r.admittedN++
	case http.StatusOK:
		r.replayedN++
	default:
		r.refused[a.code]++
		if a.code == "sold_out" && !r.soldOutSeen {
			r.soldOutSeen, r.soldOutAt = true, time.Now()
		}
	}
}

func (r *recorder) admitted(user, rid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.owner[rid] = user
	r.admittedBy[user]++
}

// replayed checks a resent purchase: it must name the first request, or be
// refused before it is admitted (sold out, rate limited), never start another.
func (r *recorder) replayed(first string, again purchaseAnswer) {
	if again.requestID == "" || again.requestID == first && again.status == http.StatusOK {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.idemBroken++
	if len(r.idemExamples) < 3 {
		r.idemExamples = append(r.idemExamples, fmt.Sprintf("%s replayed as %d %s", first, again.status, again.requestID))
	}
}

func (r *recorder) result(user string, res finalResult, channel string, sent time.Time) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, dup := r.results[res.RequestID]; dup {
		r.duplicates++
		if prev.Status == "success" && (res.Status != prev.Status || res.OrderID != prev.OrderID) {
			r.retract(prev, res.Status+" "+res.OrderID+" over "+channel)
		}
		return
	}
	r.results[res.RequestID] = res
	r.byChannel[channel]++
	r.byStatus[res.Status]++
	_ = r.resultLat.RecordValue(micros(now.Sub(sent)))
	r.lastResultAt = now
	switch res.Status {
	case "success":
		r.units[user] += res.Quantity
		r.successes += res.Quantity
		if r.successes == r.o.stock {
			r.soldOutAt = now
		}
	case "sold_out":
		r.soldOutSeen = true
	}
}

// The routes the shoppers call, named as the server's metrics name them.
const (
	routePurchase  = "POST /api/v1/campaigns/:id/purchases"
	routePoll      = "GET /api/v1/purchases/:request_id"
	routeWS        = "GET /api/v1/ws"
	routePay       = "POST /api/v1/orders/:order/pay"
	routeChallenge = "GET /api/v1/campaigns/:id/challenge"
)

// routeSet is what each route answered.
type routeSet map[string]*routeCounts

// routeCounts is what one route answered.
type routeCounts struct {
	byStatus map[int]int
	noAnswer map[string]int // by cause: a refused connection, a timeout
	took     *hdrhistogram.Histogram
}

func (rs routeSet) add(route string, status int, took time.Duration, err error) {
	rc := rs[route]
	if rc == nil {
		rc = &routeCounts{byStatus: map[int]int{}, noAnswer: map[string]int{}, took: hdrhistogram.New(1, maxLatencyMicros, 3)}
		rs[route] = rc
	}
	if status == 0 {
		if err == nil {
			err = errors.New("no answer")
		}
		rc.noAnswer[shortError(err)]++
		return
	}
	rc.byStatus[status]++
	_ = rc.took.RecordValue(micros(took))
}

// call records one HTTP request a shopper sent: its answer's status and
// how long it took from sending, or, with status 0, the error that left
// it without an answer.
func (r *recorder) call(route string, status int, took time.Duration, err error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.routes.add(route, status, took, err)
	if from := r.t0.Add(r.o.markAfter); r.o.markFor > 0 && !r.t0.IsZero() && !now.Before(from) && now.Before(from.Add(r.o.markFor)) {
		r.marked.add(route, status, took, err)
	}
	if route == routePoll && status != 0 {
		r.lastPollAt = now
	}
}

func (r *recorder) wsFailed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wsFailures[err.Error()]++
}

func (r *recorder) pollSent() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.polls++
}

func (r *recorder) wsOpen() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wsOpened++
}

func (r *recorder) missing(rid string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.missingN++
	if r.missingOne == "" {
		r.missingOne = fmt.Sprintf("%s: %v", rid, err)
	}
}

// report is what a run measured and what it proved, as printed.
type report struct {
	URL             string         `json:"url"`
	ResultsURL      string         `json:"results_url"`
	Campaign        string         `json:"campaign"`
	Stock           int64          `json:"stock"`
	PerUserLimit    int64          `json:"per_user_limit"`
	Buckets         int            `json:"buckets"`
	Shoppers        int            `json:"shoppers"`
	Mode            string         `json:"mode"`
	Results         string         `json:"results_channel"`
	Sockets         socketBudget   `json:"sockets"`
	Requests        int            `json:"requests"`
	FireSeconds     float64        `json:"fire_seconds"`
	RequestsPerSec  float64        `json:"requests_per_second"`
	Admitted        int            `json:"admitted"`
	AdmittedPerSec  float64        `json:"admitted_per_second"`
	Replayed        int            `json:"replayed"`
	Refused         map[string]int `json:"refused"`
	TransportErrors map[string]int `json:"transport_errors"`
	SellOutMillis   *float64       `json:"time_to_sell_out_ms"`
	AllAnsweredMs   float64        `json:"all_answered_ms"`
	AllResultsMs    *float64       `json:"all_results_ms"`
	AdmitLatency    percentiles    `json:"admit_latency_ms"`
	ResultLatency   percentiles    `json:"time_to_result_ms"`
	Delivered       int            `json:"results_delivered"`
	// ServerCPUPerRequest is the CPU, in µs per purchase request, of the
	// process at --metrics-url (a serve: every role; else the notifier)
	// from the sale's start until every result was in: the settle and the
	// re-read are not in it. Absent when the metrics could not be read or
	// the server runs in this process.
	ServerCPUPerRequest *float64 `json:"server_cpu_us_per_request,omitempty"`
	// Polls counts the polls sent while waiting (the re-read's are in
	// HTTP only): a polled result's cost grows with how long it takes, a
	// WebSocket's does not.
	Polls       int            `json:"polls"`
	ByChannel   map[string]int `json:"results_by_channel"`
	WSFallbacks map[string]int `json:"ws_fallbacks"`
	ByStatus    map[string]int `json:"results_by_status"`
	Successes   int64          `json:"successes"`
	// HTTP is every request the shoppers sent, by route: the answers by
	// status, the requests that got none, and the time to an answer.
	HTTP              map[string]routeReport `json:"http"`
	LongestAnswerMs   float64                `json:"longest_answer_ms"`
	NoAnswer          int                    `json:"no_answer"`
	Unfinished        unfinishedReport       `json:"unfinished"`
	Reread            rereadReport           `json:"reread"`
	Marked            *markedReport          `json:"marked,omitempty"`
	Server            serverStats            `json:"server"`
	Lifecycle         *lifecycleReport       `json:"lifecycle,omitempty"`
	Crowd             *crowdReport           `json:"crowd,omitempty"`
	RateLimit         rateLimitCheck         `json:"rate_limit"`
	Invariants        []invariant            `json:"invariants"`
	InvariantsHolding bool                   `json:"invariants_ok"`
	// OK: every invariant held and the run measured the sale, not the
	// server's rate limits.
	OK bool `json:"ok"`
}

// maxRateLimitedShare is the share of purchases refused 429 above which a
// run measured the server's rate limits rather than the sale: its
// throughput and latencies are the limiter's, and with most shoppers
// refused the stock may never sell out, so "no undersell" holds without
// saying anything. The tool's own shoppers stay within the default per-user
// limits, so a well-configured run sees none; 10% leaves room for a
// deliberately tight campaign_rate.
const maxRateLimitedShare = 0.10

// rateLimitCheck is how many purchases the server refused 429.
type rateLimitCheck struct {
	Refused  int     `json:"refused_429"`
	Of       int     `json:"purchases"`
	Share    float64 `json:"share"`
	MaxShare float64 `json:"max_share"`
	Exceeded bool    `json:"exceeded"`
}

func newRateLimitCheck(refused, of int) rateLimitCheck {
	c := rateLimitCheck{Refused: refused, Of: of, MaxShare: maxRateLimitedShare}
	if of > 0 {
		c.Share = float64(refused) / float64(of)
	}
	c.Exceeded = c.Share > maxRateLimitedShare
	return c
}

func (c rateLimitCheck) message() string {
	return "the run measured the rate limits, not the sale: " + c.detail()
}

func (c rateLimitCheck) detail() string {
	return fmt.Sprintf("%d of %d purchases (%.1f%%) were refused 429, above %.0f%%; "+
		"raise the server's gateway.ip_rate and ip_burst (every shopper comes from this host), its user or campaign rates, or lower --rate",
		c.Refused, c.Of, 100*c.Share, 100*c.MaxShare)
}

// socketBudget is what the generator allowed itself (HTTPConns, WebSockets:
// at once) and the WebSockets it did open in all.
type socketBudget struct {
	HTTPConns        int `json:"http_connections"`
	WebSockets       int `json:"websockets"`
	WebSocketsOpened int `json:"websockets_opened"`
}

// routeReport is what one route answered: answers by HTTP status, the
// requests without an answer by cause, and the time from sending to the
// answer.
type routeReport struct {
	ByStatus map[string]int `json:"by_status"`
	NoAnswer map[string]int `json:"no_answer,omitempty"`
	Answer   percentiles    `json:"answer_ms"`
}

// report returns the answers by route, the longest time to an answer and
// the requests without one.
func (rs routeSet) report() (map[string]routeReport, float64, int) {
	out := map[string]routeReport{}
	longest, none := 0.0, 0
	for route, rc := range rs {
		rr := routeReport{ByStatus: map[string]int{}, Answer: percentilesOf(rc.took)}
		for status, n := range rc.byStatus {
			rr.ByStatus[strconv.Itoa(status)] = n
		}
		if len(rc.noAnswer) > 0 {
			rr.NoAnswer = rc.noAnswer
			for _, n := range rc.noAnswer {
				none += n
			}
		}
		if rc.took.TotalCount() > 0 {
			longest = max(longest, rr.Answer.Max)
		}
		out[route] = rr
	}
	return out, longest, none
}

// markedReport is the answers that came within --mark-after and
// --mark-for of the sale's start (a fault the operator injected then).
type markedReport struct {
	FromMs          float64                `json:"from_ms"`
	ToMs            float64                `json:"to_ms"`
	HTTP            map[string]routeReport `json:"http"`
	LongestAnswerMs float64                `json:"longest_answer_ms"`
	NoAnswer        int                    `json:"no_answer"`
}

type percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func percentilesOf(h *hdrhistogram.Histogram) percentiles {
	ms := func(v int64) float64 { return float64(v) / 1000 }
	return percentiles{P50: ms(h.ValueAtQuantile(50)), P90: ms(h.ValueAtQuantile(90)),
		P99: ms(h.ValueAtQuantile(99)), Max: ms(h.Max())}
}

// invariant is one guarantee checked on a run.
type invariant struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// report computes the report and checks every invariant against what the
// shoppers saw and what the server's stats say; lc is the sale's end state
// in a lifecycle run, nil otherwise.
func (r *recorder) report(st serverStats, lc *lifecycleState) *report {
	r.mu.Lock()
	defer r.mu.Unlock()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	fire := r.firedAt.Sub(r.t0)
	rep := &report{URL: r.o.url, ResultsURL: r.o.resultsURL, Campaign: r.o.campaign, Stock: r.o.stock, PerUserLimit: r.o.perUserLimit, Buckets: r.o.buckets,
		Shoppers: r.o.shoppers, Results: r.o.results, Sockets: socketBudget{HTTPConns: r.httpConns, WebSockets: r.wsCap, WebSocketsOpened: r.wsOpened},
		Requests: r.requests, FireSeconds: fire.Seconds(), Admitted: r.admittedN, Replayed: r.replayedN,
		Refused: r.refused, TransportErrors: r.transport, AllAnsweredMs: ms(r.lastAnswerAt.Sub(r.t0)),
		AdmitLatency: percentilesOf(r.admitLat), ResultLatency: percentilesOf(r.resultLat),
		Delivered: len(r.results), Polls: r.polls, ByChannel: r.byChannel, ByStatus: r.byStatus, Successes: r.successes, Server: st}
	rep.Mode = fmt.Sprintf("closed loop, concurrency %d", r.o.concurrency)
	if r.o.rate > 0 {
		rep.Mode = fmt.Sprintf("open loop, %.0f shoppers/s", r.o.rate)
	}
	if secs := fire.Seconds(); secs > 0 {
		rep.RequestsPerSec, rep.AdmittedPerSec = float64(r.requests)/secs, float64(r.admittedN)/secs
	}
	if r.saleCPU >= 0 && r.requests > 0 {
		v := 1e6 * r.saleCPU / float64(r.requests)
		rep.ServerCPUPerRequest = &v
	}
	// In a lifecycle run units come back and successes pass the stock.
	if (r.successes == r.o.stock || r.o.lifecycle && r.successes > r.o.stock) && !r.soldOutAt.IsZero() {
		v := ms(r.soldOutAt.Sub(r.t0))
		rep.SellOutMillis = &v
	}
	if !r.lastResultAt.IsZero() {
		last := r.lastResultAt
		if r.lastAnswerAt.After(last) {
			last = r.lastAnswerAt
		}
		v := ms(last.Sub(r.t0))
		rep.AllResultsMs = &v
	}
	rep.HTTP, rep.LongestAnswerMs, rep.NoAnswer = r.routes.report()
	if r.o.markFor > 0 {
		m := &markedReport{FromMs: ms(r.o.markAfter), ToMs: ms(r.o.markAfter + r.o.markFor)}
		m.HTTP, m.LongestAnswerMs, m.NoAnswer = r.marked.report()
		rep.Marked = m
	}
	rep.Reread, rep.Unfinished = r.rereadReports()
	rep.WSFallbacks = map[string]int{}
	for msg, n := range r.wsFailures {
		rep.WSFallbacks[msg] = n
	}
	if lc == nil {
		rep.Invariants = r.invariants(st)
	} else {
		rep.Invariants = r.lifecycleInvariants(st, lc)
		rep.Lifecycle = &lifecycleReport{PaymentWindow: r.o.paymentWindow.String(), PayRatio: r.o.payRatio,
			Orders: r.successes, Paid: lc.paid, Ended: r.successes - lc.paid - lc.pending,
			UnitsResold: max(r.successes-r.o.stock, 0), Settled: r.settledOrders, Waiting: lc.waiting}
		if r.o.paymentWindow == 0 {
			rep.Lifecycle.PaymentWindow = "server default"
		}
	}
	rep.InvariantsHolding = true
	for _, inv := range rep.Invariants {
		rep.InvariantsHolding = rep.InvariantsHolding && inv.OK
	}
	rep.RateLimit = newRateLimitCheck(r.rateLimitedN, r.requests)
	rep.OK = rep.InvariantsHolding && !rep.RateLimit.Exceeded
	return rep
}

func (r *recorder) invariants(st serverStats) []invariant {
	check := func(name string, ok bool, format string, args ...any) invariant {
		return invariant{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)}
	}
	var out []invariant
	out = append(out, check("no oversell", r.successes <= r.o.stock,
		"successes %d, stock %d", r.successes, r.o.stock))

	// Demand: what the admitted requests could buy within the user limit.
	var demand int64
	for _, n := range r.admittedBy {
		demand += min(n, r.o.perUserLimit)
	}
	mustSellOut := demand >= r.o.stock || r.soldOutSeen
	out = append(out, check("no undersell", !mustSellOut || r.successes == r.o.stock,
		"successes %d, stock %d, demand %d, sold out announced %v", r.successes, r.o.stock, demand, r.soldOutSeen))

	out = append(out, r.resultInvariant(st))

	var over []string
	for user, n := range r.units {
		if n > r.o.perUserLimit {
			over = append(over, fmt.Sprintf("%s bought %d", user, n))
		}
	}
	sort.Strings(over)
	out = append(out, check("no user above its limit", len(over) == 0,
		"limit %d%s", r.o.perUserLimit, listed(over)))

	out = append(out, check("orders in the database = successes", st.OrdersInDB == r.successes && st.UnitsInDB == st.Sold,
		"orders_in_db %d, successes %d, units_in_db %d, sold %d", st.OrdersInDB, r.successes, st.UnitsInDB, st.Sold))
	// A request Redis lost the marker of and gave rejected (lost) is
	// counted apart (lost), not admitted.
	out = append(out, check("server counters agree with the shoppers", st.Sold == r.successes && st.Admitted+st.Lost == int64(len(r.owner)),
		"server sold %d admitted %d lost %d; shoppers saw %d successes, %d admitted", st.Sold, st.Admitted, st.Lost, r.successes, len(r.owner)))
	out = append(out, r.idempotencyInvariant(), r.retractionInvariant())
	return out
}

// resultInvariant: every admitted request got exactly one final result.
func (r *recorder) resultInvariant(st serverStats) invariant {
	missing := len(r.owner) - countSettled(r.owner, r.results)
	var finished int64
	for _, n := range st.FinishedByStatus {
		finished += n
	}
	return invariant{Name: "one final result per admitted request within --settle",
		OK: missing == 0 && r.duplicates == 0 && st.Queued == 0 && finished == st.Admitted,
		Detail: fmt.Sprintf("admitted %d, results %d, missing %d%s, duplicates %d; server: admitted %d, finished %d, queued %d",
			len(r.owner), len(r.results), missing, firstMissing(r.missingOne), r.duplicates, st.Admitted, finished, st.Queued)}
}

func (r *recorder) idempotencyInvariant() invariant {
	return invariant{Name: "a replayed Idempotency-Key never starts a second request", OK: r.idemBroken == 0,
		Detail: fmt.Sprintf("%d broken%s", r.idemBroken, listed(r.idemExamples))}
}

func countSettled(owner map[string]string, results map[string]finalResult) int {
	n := 0
	for rid := range owner {
		if _, ok := results[rid]; ok {
			n++
		}
	}
	return n
}

func firstMissing(s string) string {
	if s == "" {
		return ""
	}
	return " (first: " + s + ")"
}

// listed shows up to three examples.
func listed(items []string) string {
	if len(items) == 0 {
		return ""
	}
	return ": " + strings.Join(items[:min(len(items), 3)], ", ")
}

// failed names the invariants that broke.
func (rep *report) failed() []string {
	var out []string
	for _, inv := range rep.Invariants {
		if !inv.OK {
			out = append(out, inv.Name+" ("+inv.Detail+")")
		}
	}
	return out
}

func (rep *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func (rep *report) writeText(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	opt := func(v *float64) string {
		if v == nil {
			return "n/a"
		}
		return fmt.Sprintf("%.0f ms", *v)
	}
	lat := func(q percentiles) string {
		return fmt.Sprintf("p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms", q.P50, q.P90, q.P99, q.Max)
	}
	loud := func() {
		if rep.RateLimit.Exceeded {
			p("!!! NOT A MEASUREMENT OF THE SALE: %s", rep.RateLimit.detail())
		}
	}
	loud()
	p("flashsale loadtest: %s (results from %s), campaign %s", rep.URL, rep.ResultsURL, rep.Campaign)
	p("  sale            %d units in %d bucket(s), limit %d per user, %d shoppers, %s", rep.Stock, max(rep.Buckets, 1), rep.PerUserLimit, rep.Shoppers, rep.Mode)
	p("  requests        %d in %.2f s: %.0f req/s, admitted %d (%.0f/s), replays answered %d", rep.Requests,
		rep.FireSeconds, rep.RequestsPerSec, rep.Admitted, rep.AdmittedPerSec, rep.Replayed)
	if rep.ServerCPUPerRequest != nil {
		p("  server CPU      %.0f µs per request from the start to the last result (--metrics-url's process)", *rep.ServerCPUPerRequest)
	}
	p("  refused         %s", countsText(rep.Refused))
	if len(rep.TransportErrors) > 0 {
		p("  transport errs  %s", countsText(rep.TransportErrors))
	}
	p("  sold out after  %s; every shopper answered after %.0f ms; every result after %s",
		opt(rep.SellOutMillis), rep.AllAnsweredMs, opt(rep.AllResultsMs))
	p("  admit latency   %s", lat(rep.AdmitLatency))
	p("  time to result  %s", lat(rep.ResultLatency))
	p("  results         %d delivered of %d admitted: %s; by %s; %d polls sent", rep.Delivered, rep.Admitted,
		countsText(rep.ByStatus), countsText(rep.ByChannel), rep.Polls)
	if len(rep.WSFallbacks) > 0 {
		p("  polled instead  %s", countsText(rep.WSFallbacks))
	}
	writeHTTP(p, "http", rep.HTTP, rep.LongestAnswerMs, rep.NoAnswer)
	if m := rep.Marked; m != nil {
		p("  marked span     the answers %.0f-%.0f ms after the start, apart:", m.FromMs, m.ToMs)
		writeHTTP(p, "marked", m.HTTP, m.LongestAnswerMs, m.NoAnswer)
	}
	u := rep.Unfinished
	p("  unfinished      %d admitted requests never final%s; vanished (404 after queued) %d%s; final only at the re-read: %s",
		u.Count, idsText(u.Sample, u.Count), u.Vanished, idsText(u.VanishedSample, u.Vanished), countsText(u.FinalAtReread))
	rr := rep.Reread
	p("  re-read         %d successes: %d confirmed, %d retracted, %d unread", rr.Successes, rr.Confirmed, rr.Retracted, rr.Unread)
	if rr.Retracted > 0 {
		p("!!! RETRACTED SUCCESS: %d shopper(s) told success were told otherwise later: %s", rr.Retracted, strings.Join(rr.RetractedSample, ", "))
	}
	// The WebSocket budget alone would read as WebSockets used, even when
	// every one failed or none was wanted.
	p("  sockets         up to %d HTTP connections; %d WebSockets opened (up to %d at once)",
		rep.Sockets.HTTPConns, rep.Sockets.WebSocketsOpened, rep.Sockets.WebSockets)
	if c := rep.Crowd; c != nil {
		c.writeText(p, lat)
	}
	p("  successes       %d of %d units; server: sold %d, remaining %d, admitted %d, orders in DB %d",
		rep.Successes, rep.Stock, rep.Server.Sold, rep.Server.Remaining, rep.Server.Admitted, rep.Server.OrdersInDB)
	if lc := rep.Lifecycle; lc != nil {
		p("  lifecycle       window %s, pay ratio %.2f: %d orders, %d paid, %d expired or ended unpaid; %d units resold; buyers: %s; %d shoppers still waiting",
			lc.PaymentWindow, lc.PayRatio, lc.Orders, lc.Paid, lc.Ended, lc.UnitsResold, countsText(lc.Settled), lc.Waiting)
	}
	p("invariants:")
	for _, inv := range rep.Invariants {
		mark := "ok  "
		if !inv.OK {
			mark = "FAIL"
		}
		p("  %s %s: %s", mark, inv.Name, inv.Detail)
	}
	loud()
}

// writeHTTP prints the answers by route, one line each, under label.
func writeHTTP(p func(string, ...any), label string, byRoute map[string]routeReport, longest float64, none int) {
	routes := make([]string, 0, len(byRoute))
	for route := range byRoute {
		routes = append(routes, route)
	}
	sort.Strings(routes)
	for _, route := range routes {
		rr := byRoute[route]
		lost := ""
		if len(rr.NoAnswer) > 0 {
			lost = "; no answer: " + countsText(rr.NoAnswer)
		}
		p("  %-15s %s: %s%s; answer p99 %.1f ms, max %.1f ms", label, route, countsText(rr.ByStatus), lost, rr.Answer.P99, rr.Answer.Max)
	}
	p("  %-15s %.1f ms; requests without an answer %d", label+" longest", longest, none)
}

// idsText lists sample request ids of n.
func idsText(ids []string, n int) string {
	if len(ids) == 0 {
		return ""
	}
	more := ""
	if n > len(ids) {
		more = fmt.Sprintf(" and %d more", n-len(ids))
	}
	return " (" + strings.Join(ids, ", ") + more + ")"
}

func countsText(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func (c *crowdReport) writeText(p func(string, ...any), lat func(percentiles) string) {
	f := c.ConnectFailed
	p("  crowd           one WebSocket per shopper, connect window %.0f ms: %d connected; refused 429 %d, 503 %d, other %d%s; reconnects %d, lost %d",
		c.ConnectWindowMs, c.Connected, f.TooMany, f.Unavailable, f.Other, reasons(f.OtherReasons), c.Reconnects, c.Lost)
	late := ""
	if c.SaleStartLagMs > 0 {
		late = fmt.Sprintf("; the sale started %.0f ms after the window", c.SaleStartLagMs)
	}
	p("  connect time    %s%s", lat(c.ConnectTime), late)
	n := c.Notifier
	if n.Unavailable != "" {
		p("  notifier        figures from %s unavailable: %s", n.MetricsURL, n.Unavailable)
	}
	if n.RSSBefore == 0 {
		return
	}
	shared := ""
	if n.SharedWithLoadtest {
		shared = " (the in-process serve: the tool's own sockets included)"
	}
	perConn := "n/a"
	if n.BytesPerConnection != nil {
		perConn = fmt.Sprintf("%.1f KiB", *n.BytesPerConnection/1024)
	}
	p("  notifier RSS    %s before, %s with the crowd (%d clients), %s after %.1f s held (%d clients, %d subscriptions): %s per connection%s",
		mib(n.RSSBefore), mib(n.RSSHerd), n.ClientsHerd, mib(n.RSSConnected), c.HoldSeconds, n.ClientsConnected, n.SubscriptionsConnected, perConn, shared)
	settled := "settled"
	if !n.AfterLeaveSettled {
		settled = "still changing"
	}
	idle := "n/a (no --hold)"
	if n.IdleCPUSeconds != nil {
		idle = fmt.Sprintf("%.2f s over %.1f s (%.1f%% of a core)", *n.IdleCPUSeconds, c.HoldSeconds, 100**n.IdleCPUSeconds/c.HoldSeconds)
	}
	p("  after leaving   %s %.1f s after the crowd left (%s; %d clients); %d upgrade requests in all; idle CPU %s",
		mib(n.RSSAfterLeave), n.AfterLeaveWaitMs/1000, settled, n.ClientsAfterLeave, n.Upgrades, idle)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func reasons(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	return " (" + countsText(m) + ")"
}
