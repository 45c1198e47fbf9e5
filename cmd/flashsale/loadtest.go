package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/schollz/progressbar/v3"
	"github.com/valyala/fasthttp"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/model"
)

// loadtest is the flash-sale simulator: it sets up a campaign through the
// admin API, lets many shoppers buy at once, waits for every result and
// checks the guarantees the README promises. Files: loadtest.go (flags and
// the run), loadtest_shopper.go (one shopper's requests and result),
// loadtest_crowd.go (--ws-per-shopper: the crowd's sockets and the
// notifier's figures), loadtest_lifecycle.go (--pay-ratio),
// loadtest_reread.go (the final re-read: retracted successes, unfinished
// requests), loadtest_report.go (measurements, invariants and the report).

// loadtestOptions are the command's flags.
type loadtestOptions struct {
	url             string
	resultsURL      string // the notifier: WebSocket and polling (default: url)
	configPath      string
	campaign        string
	existing        bool // sell campaign as it stands: no create or preload
	stock           int64
	perUserLimit    int64
	buckets         int // the campaign's stock buckets (model.Campaign.Buckets)
	shoppers        int
	concurrency     int
	rate            float64
	repeat          float64
	idempotentShare float64
	results         string
	settle          time.Duration
	timeout         time.Duration
	json            bool
	progress        bool
	adminToken      string
	jwtSecret       string
	issuer          string // the iss and aud minted tokens carry, for a server that checks them
	audience        string
	maxSockets      int
	seed            uint64
	// lifecycle: --pay-ratio or --payment-window was given (loadtest_lifecycle.go).
	lifecycle     bool
	payRatio      float64
	paymentWindow time.Duration
	// The waiting crowd (loadtest_crowd.go).
	wsPerShopper  bool
	connectWindow time.Duration
	hold          time.Duration
	metricsURL    string
	metricsURLSet bool // given by the flag, not derived: a failed read is an error
	// The gate against bots (loadtest_challenge.go).
	challenge challengeOptions
	// markAfter, markFor: a span after the sale's start whose answers the
	// report gives apart (a fault injected then).
	markAfter, markFor time.Duration
}

// secondsOrDuration is a flag that takes "30", meaning seconds, or "30s".
type secondsOrDuration struct{ d *time.Duration }

func (f secondsOrDuration) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f secondsOrDuration) Set(s string) error {
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		*f.d = time.Duration(secs * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want seconds (30) or a duration (30s)")
	}
	*f.d = d
	return nil
}

const loadtestUsage = `Usage: flashsale loadtest [flags]

Runs a flash sale against a gateway and checks that it sold every item exactly
once: creates and preloads a campaign through the admin API, mints tokens for
--shoppers users, fires their purchases (closed loop with --concurrency, or open
loop with --rate), waits for every admitted request's result over WebSocket or
polling, prints a report and exits non-zero if an invariant broke.

With --ws-per-shopper every shopper opens one WebSocket before the sale, all
within --connect-window of its start (a thundering herd), and waits on it for
all its results; the crowd stays connected and idle for --hold once every
purchase is answered, then leaves together. The report adds the connect times,
the refused connects, the reconnects, and the notifier's RSS (before the
crowd, with it connected, after it left), bytes per connection and CPU during
the hold, read from its /metrics (--metrics-url).

With --challenge-bits N the campaign is gated against bots: each purchase
first fetches a challenge, solves it (2^N hashes on average, on this
process's cores) and sends the solution; --challenge-fetch fetches one
before each purchase of an ungated campaign and sends nothing.

With --pay-ratio or --payment-window it runs the order lifecycle too: each
buyer pays with probability --pay-ratio and otherwise lets the order expire,
shoppers left without an order keep retrying while units come back, and the run
waits until every order is paid or ended and reports the units resold.

With --existing it sells a campaign created and preloaded before, as it
stands, instead of creating one: for example one whose Redis was killed
since, to measure the sale decided in MySQL (degraded mode).

Without --url it starts the embedded serve in this process (or the roles of
--config) and runs against that. Against separate processes, --url is a
gateway (purchases, the admin API, payments) and --results-url a notifier
(WebSocket and polling); the tool checks both serve their routes before the
sale and stops with the reason if not.

The report gives every route's answers by status and time to answer, and
the requests that got no answer (and, with --mark-after and --mark-for,
those of a span of the sale apart). Once the sale settled the tool reads every
success again, and every admitted request still without a final result: a
success that now reads otherwise (another status or order, 404) was
retracted, and the run fails naming it.

A run in which more than 10% of the purchases are refused 429 rate_limited
measured the server's rate limits, not the sale (the shoppers all come from
this host: raise gateway.ip_rate and ip_burst): it says so and exits non-zero
even when every invariant held.

Flags:
`

func parseLoadtestFlags(args []string, stdout io.Writer, env map[string]string) (loadtestOptions, error) {
	o := loadtestOptions{settle: 30 * time.Second}
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	// Parse errors are returned as one line; only --help prints the usage.
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.url, "url", "", "gateway base URL, e.g. http://127.0.0.1:8080 (default: start the embedded serve in-process)")
	fs.StringVar(&o.resultsURL, "results-url", "", "notifier base URL for WebSocket and polled results (default: --url)")
	fs.StringVar(&o.configPath, "config", "", "config of the in-process serve (only without --url)")
	fs.StringVar(&o.campaign, "campaign", "", "campaign id to create (default: a fresh random id)")
	fs.BoolVar(&o.existing, "existing", false, "sell the campaign --campaign names as it stands, created and preloaded before (say, then Redis killed): nothing is created or preloaded; its stock, limit, buckets and challenge come from the admin API, and nobody may have bought from it yet")
	fs.Int64Var(&o.stock, "stock", 1000, "units on sale")
	fs.Int64Var(&o.perUserLimit, "per-user-limit", 1, "units one shopper may buy")
	fs.IntVar(&o.buckets, "buckets", 1, "stock buckets of the campaign (1 to 64): each its own Redis hash tag, queue partition and worker")
	fs.IntVar(&o.shoppers, "shoppers", 10_000, "distinct shoppers (users), each buys one unit")
	fs.IntVar(&o.concurrency, "concurrency", 256, "closed loop: shoppers buying at once")
	fs.Float64Var(&o.rate, "rate", 0, "open loop: shoppers started per second, whatever the server's speed (0 = closed loop)")
	fs.Float64Var(&o.repeat, "repeat", 0.1, "share of shoppers who buy a second time after their first answer")
	fs.Float64Var(&o.idempotentShare, "idempotent-share", 0.1, "share of shoppers who resend their purchase with the same Idempotency-Key")
	fs.StringVar(&o.results, "results", "ws", "how admitted shoppers wait for results: ws or poll")
	fs.Var(secondsOrDuration{&o.settle}, "settle", "time after the last purchase by which every result must have arrived (seconds or a duration)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "timeout of one HTTP request")
	fs.BoolVar(&o.json, "json", false, "write the report as JSON")
	fs.BoolVar(&o.progress, "progress", true, "show a progress bar on stderr")
	fs.StringVar(&o.adminToken, "admin-token", "", "admin token (default: $FLASHSALE_AUTH_ADMIN_TOKEN, else the dev token; the in-process serve's own)")
	fs.StringVar(&o.jwtSecret, "jwt-secret", "", "HS256 secret to mint shopper tokens (default: $FLASHSALE_AUTH_JWT_SECRET, else the dev secret; the in-process serve's own)")
	fs.StringVar(&o.issuer, "issuer", "", "iss of the minted shopper tokens, for a server with auth.issuer (default: $FLASHSALE_AUTH_ISSUER)")
	fs.StringVar(&o.audience, "audience", "", "aud of the minted shopper tokens, for a server with auth.audience (default: $FLASHSALE_AUTH_AUDIENCE)")
	fs.IntVar(&o.maxSockets, "max-sockets", 0, "sockets the tool may open at once (default: from the open-file limit)")
	fs.Uint64Var(&o.seed, "seed", 0, "seed that picks repeating and idempotent shoppers (default: random)")
	fs.Float64Var(&o.payRatio, "pay-ratio", 1, "lifecycle: share of buyers who pay; the others let their order expire")
	fs.DurationVar(&o.paymentWindow, "payment-window", 0, "lifecycle: the campaign's payment window (default: the server's, 10m)")
	fs.BoolVar(&o.wsPerShopper, "ws-per-shopper", false, "each shopper opens one WebSocket before the sale and waits on it for all its results (with --results ws)")
	fs.DurationVar(&o.connectWindow, "connect-window", time.Second, "with --ws-per-shopper: the shoppers connect spread over this span just before the sale starts (0: all at once)")
	fs.DurationVar(&o.hold, "hold", 0, "with --ws-per-shopper: how long the crowd stays connected and idle once every purchase is answered (the notifier's idle CPU is measured over it)")
	o.challenge.register(fs)
	fs.DurationVar(&o.markAfter, "mark-after", 0, "with --mark-for: the report gives apart the answers that came from this long after the sale's start")
	fs.DurationVar(&o.markFor, "mark-for", 0, "the span of the answers given apart, e.g. a fault injected --mark-after the start (0: none)")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "with --ws-per-shopper: the notifier's Prometheus metrics, for its RSS and CPU (default: --results-url's /metrics; with http.admin_addr set, /metrics is on the admin listener)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, loadtestUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
		}
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	crowdFlag, campaignFlag, campaignSet := "", "", false
	fs.Visit(func(f *flag.Flag) {
		o.lifecycle = o.lifecycle || f.Name == "pay-ratio" || f.Name == "payment-window"
		switch f.Name {
		case "connect-window", "hold", "metrics-url":
			crowdFlag = f.Name
		case "stock", "per-user-limit", "buckets", "challenge-bits", "pay-ratio", "payment-window":
			campaignFlag = f.Name
		case "campaign":
			campaignSet = true
		}
	})
	if crowdFlag != "" && !o.wsPerShopper {
		return o, fmt.Errorf("--%s: goes with --ws-per-shopper", crowdFlag)
	}
	switch {
	case o.existing && campaignFlag != "":
		return o, fmt.Errorf("--%s: not with --existing (the campaign has its own)", campaignFlag)
	case o.existing && (!campaignSet || o.url == ""):
		return o, errors.New("--existing: goes with --campaign and --url (the campaign of a running server)")
	}
	o.metricsURLSet = o.metricsURL != ""
	if o.adminToken == "" {
		o.adminToken = cmp.Or(env["FLASHSALE_AUTH_ADMIN_TOKEN"], config.DevAdminToken)
	}
	if o.jwtSecret == "" {
		o.jwtSecret = cmp.Or(env["FLASHSALE_AUTH_JWT_SECRET"], config.DevJWTSecret)
	}
	o.issuer = cmp.Or(o.issuer, env["FLASHSALE_AUTH_ISSUER"])
	o.audience = cmp.Or(o.audience, env["FLASHSALE_AUTH_AUDIENCE"])
	if o.campaign == "" {
		o.campaign = "lt-" + rand.Text()[:12]
	}
	if o.seed == 0 {
		o.seed = mrand.Uint64()
	}
	return o, o.validate()
}

func (o loadtestOptions) validate() error {
	bad := func(flag, why string) error { return fmt.Errorf("--%s: %s", flag, why) }
	switch {
	case o.stock < 1:
		return bad("stock", "must be at least 1")
	case o.perUserLimit < 1:
		return bad("per-user-limit", "must be at least 1")
	case o.buckets < 1 || o.buckets > model.MaxBuckets:
		return bad("buckets", "must be between 1 and 64")
	case o.shoppers < 1:
		return bad("shoppers", "must be at least 1")
	case o.concurrency < 1:
		return bad("concurrency", "must be at least 1")
	case o.rate < 0:
		return bad("rate", "must not be negative")
	case o.repeat < 0 || o.repeat > 1:
		return bad("repeat", "must be a share between 0 and 1")
	case o.idempotentShare < 0 || o.idempotentShare > 1:
		return bad("idempotent-share", "must be a share between 0 and 1")
	case o.results != "ws" && o.results != "poll":
		return bad("results", `must be "ws" or "poll"`)
	case o.settle <= 0:
		return bad("settle", "must be positive")
	case o.timeout <= 0:
		return bad("timeout", "must be positive")
	case o.maxSockets < 0:
		return bad("max-sockets", "must not be negative")
	case o.url != "" && o.configPath != "":
		return bad("config", "starts an in-process serve, so it cannot go with --url")
	case o.payRatio < 0 || o.payRatio > 1:
		return bad("pay-ratio", "must be a share between 0 and 1")
	case o.paymentWindow != 0 && (o.paymentWindow < time.Second || o.paymentWindow > 24*time.Hour):
		return bad("payment-window", "must be between 1s and 24h")
	case o.wsPerShopper && o.results != "ws":
		return bad("ws-per-shopper", "goes with --results ws")
	case o.wsPerShopper && o.lifecycle:
		return bad("ws-per-shopper", "not with --pay-ratio or --payment-window (their retries poll)")
	case o.connectWindow < 0:
		return bad("connect-window", "must not be negative")
	case o.hold < 0:
		return bad("hold", "must not be negative")
	case o.markAfter < 0:
		return bad("mark-after", "must not be negative")
	case o.markFor < 0:
		return bad("mark-for", "must not be negative")
	case o.markAfter > 0 && o.markFor == 0:
		return bad("mark-after", "goes with --mark-for")
	}
	if o.resultsURL != "" && o.url == "" {
		return bad("results-url", "goes with --url (the in-process serve answers results itself)")
	}
	for _, f := range []struct{ flag, value string }{{"url", o.url}, {"results-url", o.resultsURL}, {"metrics-url", o.metricsURL}} {
		if f.value == "" {
			continue
		}
		u, err := url.Parse(f.value)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad(f.flag, fmt.Sprintf("%q is not an http(s) URL with a host", f.value))
		}
	}
	return o.challenge.validate()
}

// runLoadtest is the loadtest command.
func runLoadtest(ctx context.Context, args []string, stdout io.Writer, env map[string]string, newLog newLogger) error {
	o, err := parseLoadtestFlags(args, stdout, env)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err != nil {
		return fmt.Errorf("loadtest: %w", err)
	}

	embedded := o.url == ""
	if embedded {
		cfg, err := config.Load(o.configPath, env)
		if err != nil {
			return fmt.Errorf("loadtest: %w", err)
		}
		cfg.HTTP.Addr = "127.0.0.1:0"
		// Every simulated shopper connects from this host: the per-address
		// WebSocket cap would refuse the crowd (the per-user cap stays).
		cfg.Notifier.MaxConnsPerIP = max(cfg.Notifier.MaxConnsPerIP, 1<<20)
		if o.lifecycle {
			// Orders expire through their delayed messages; the sweeper
			// looks often here too, so that an order whose message was lost
			// ends in seconds, not after the default grace.
			cfg.Payment.Grace, cfg.Payment.SweepInterval = min(cfg.Payment.Grace, time.Second), min(cfg.Payment.SweepInterval, 250*time.Millisecond)
		}
		log := newLog(cfg.Log)
		routeRedisLog(log)
		sctx, stop := context.WithCancel(ctx)
		sys, err := start(sctx, cfg, log, roleSet{gateway: true, worker: true, notifier: true})
		if err != nil {
			stop()
			return fmt.Errorf("loadtest: start in-process serve: %w", err)
		}
		defer func() {
			stop()
			_ = sys.Wait()
		}()
		o.url, o.adminToken, o.jwtSecret = "http://"+sys.Addr(), cfg.Auth.AdminToken, cfg.Auth.JWTSecret
		o.issuer, o.audience = cfg.Auth.Issuer, cfg.Auth.Audience
		if sys.adminAddr != "" {
			return errors.New("loadtest: an in-process serve with a separate http.admin_addr is not supported; run serve and pass --url")
		}
	}
	o.url = strings.TrimRight(o.url, "/")
	o.resultsURL = strings.TrimRight(cmp.Or(o.resultsURL, o.url), "/")
	o.metricsURL = cmp.Or(o.metricsURL, o.resultsURL+"/metrics")

	rep, err := newLoadtest(o, embedded).run(ctx, embedded)
	if err != nil {
		return fmt.Errorf("loadtest: %w", err)
	}
	if o.json {
		if err := rep.writeJSON(stdout); err != nil {
			return fmt.Errorf("loadtest: write report: %w", err)
		}
	} else {
		rep.writeText(stdout)
	}
	var problems []string
	if rep.RateLimit.Exceeded {
		problems = append(problems, rep.RateLimit.message())
	}
	if failed := rep.failed(); len(failed) > 0 {
		problems = append(problems, fmt.Sprintf("%d invariant(s) violated: %s", len(failed), strings.Join(failed, "; ")))
	}
	if len(problems) > 0 {
		return fmt.Errorf("loadtest: %s", strings.Join(problems, "; "))
	}
	return nil
}

// loadtest is one run: its options, clients and measurements.
type loadtest struct {
	o    loadtestOptions
	http *http.Client // admin calls and the health check
	// shoppers sends the purchases, and results the polls (the same client
	// when --results-url is --url): fasthttp's client costs a fraction of
	// net/http's CPU per request, and the generator shares the cores with
	// the server it measures.
	shoppers    *fasthttp.HostClient
	results     *fasthttp.HostClient
	purchaseURL string // the campaign's purchase endpoint, built once
	jwt         *auth.JWT
	dialer      *websocket.Dialer
	wsSlots     chan struct{} // one token per WebSocket the tool may hold open
	rec         *recorder
}

// Socket budget: descriptors kept free for the process itself, and the most
// HTTP connections used at once when the open loop sets no natural bound.
const (
	reservedFDs      = 256
	maxOpenLoopConns = 1024
)

// minter signs the shoppers' tokens with the HS256 secret, carrying the
// issuer and audience a server may check.
func minter(o loadtestOptions) *auth.JWT {
	j, _ := auth.New(context.Background(), []byte(o.jwtSecret), auth.Options{Issuer: o.issuer, Audience: o.audience}) // fails only with a JWKS URL
	return j
}

func newLoadtest(o loadtestOptions, embedded bool) *loadtest {
	budget := o.maxSockets
	if budget == 0 {
		budget = max(openFileLimit()-reservedFDs, 64)
		if embedded {
			// The server's end of every connection is in this process too.
			budget /= 2
		}
	}
	httpConns := o.concurrency
	if o.rate > 0 {
		httpConns = maxOpenLoopConns
	}
	// A separate results URL has a pool of its own: the two share the
	// HTTP half of the budget.
	pools := 1
	if o.resultsURL != o.url {
		pools = 2
	}
	httpConns = max(min(httpConns, budget/(2*pools)), 1)
	wsCap := 0
	if o.results == "ws" {
		wsCap = max(budget-pools*httpConns, 0)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxConnsPerHost = httpConns
	tr.MaxIdleConnsPerHost = httpConns
	tr.MaxIdleConns = httpConns
	tr.DisableCompression = true
	shoppers := newShopperClient(o.url, httpConns, o.timeout)
	results := shoppers
	if pools == 2 {
		results = newShopperClient(o.resultsURL, httpConns, o.timeout)
	}
	return &loadtest{
		o:           o,
		http:        &http.Client{Transport: tr, Timeout: o.timeout},
		shoppers:    shoppers,
		results:     results,
		purchaseURL: o.url + "/api/v1/campaigns/" + o.campaign + "/purchases",
		jwt:         minter(o),
		// Small buffers: a crowd of 15,000 sockets reads frames of a few
		// hundred bytes.
		dialer:  &websocket.Dialer{HandshakeTimeout: o.timeout, ReadBufferSize: 1024, WriteBufferSize: 1024},
		wsSlots: make(chan struct{}, wsCap),
		rec:     newRecorder(o, pools*httpConns, wsCap),
	}
}

// run sets the sale up, lets every shopper buy, waits for the results and
// returns the report. embedded: the server runs in this process.
func (lt *loadtest) run(ctx context.Context, embedded bool) (*report, error) {
	if err := lt.setUp(ctx); err != nil {
		return nil, err
	}
	shoppers, err := lt.planShoppers()
	if err != nil {
		return nil, err
	}
	var crowd *crowd
	if lt.o.wsPerShopper {
		if crowd, err = lt.gatherCrowd(ctx, shoppers, embedded); err != nil {
			return nil, err
		}
	}
	bar := lt.progressBar()

	var waiters sync.WaitGroup
	cpuBefore, cpuKnown := lt.serverCPU(ctx, embedded)
	start := time.Now()
	lt.rec.start(start)
	done := func() { _ = bar.Add(1) }
	if lt.o.rate > 0 {
		lt.openLoop(ctx, shoppers, start, &waiters, done)
	} else {
		lt.closedLoop(ctx, shoppers, &waiters, done)
	}
	fired := time.Now()
	lt.rec.fired(fired)
	if crowd != nil {
		crowd.hold()
	}
	// Waiters stop by themselves at the settle deadline.
	waiters.Wait()
	if cpuAfter, ok := lt.serverCPU(ctx, embedded); ok && cpuKnown {
		lt.rec.saleCPU = cpuAfter - cpuBefore // read by report, once the run is over
	}
	_ = bar.Finish()
	if lt.o.progress {
		fmt.Fprintln(os.Stderr)
	}

	if !lt.o.lifecycle {
		if crowd != nil {
			crowd.leave()
		}
		stats, err := lt.settledStats(ctx, fired.Add(lt.o.hold+lt.o.settle), func(st serverStats) bool { return st.UnitsInDB == st.Sold })
		if err != nil {
			return nil, err
		}
		lt.reread(ctx, shoppers)
		rep := lt.rec.report(stats, nil)
		if crowd != nil {
			rep.Crowd = crowd.report()
		}
		return rep, nil
	}
	waiting := lt.resell(ctx, shoppers)
	lt.rec.fired(time.Now()) // the retries fire purchases too
	state, err := lt.awaitFinalOrders(ctx, time.Now().Add(lt.o.settle+lt.o.paymentWindow))
	if err != nil {
		return nil, err
	}
	state.waiting = waiting
	successes := lt.rec.orderCount()
	stats, err := lt.settledStats(ctx, time.Now().Add(lt.o.settle), func(st serverStats) bool { return st.OrdersInDB == successes })
	if err != nil {
		return nil, err
	}
	lt.reread(ctx, shoppers)
	return lt.rec.report(stats, &state), nil
}

// serverCPU reads the CPU seconds the process at --metrics-url has used:
// known is false when it cannot be read, or when the server runs in this
// process, whose CPU is the tool's too.
func (lt *loadtest) serverCPU(ctx context.Context, embedded bool) (seconds float64, known bool) {
	if embedded {
		return 0, false
	}
	r, err := lt.readNotifier(ctx)
	return r.cpuSeconds, err == nil
}

// say tells the operator, on stderr with the progress bar, where a long
// run is; the line starts on a line of its own, below the bar.
func (lt *loadtest) say(format string, args ...any) {
	if lt.o.progress {
		fmt.Fprintf(os.Stderr, "\nloadtest: "+format+"\n", args...)
	}
}

func (lt *loadtest) progressBar() *progressbar.ProgressBar {
	return progressbar.NewOptions(lt.o.shoppers,
		progressbar.OptionSetVisibility(lt.o.progress),
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetDescription("shoppers answered"),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("shoppers"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetPredictTime(false),
	)
}

// planShoppers mints every shopper's token before the clock starts, so
// signing costs the generator nothing during the sale.
func (lt *loadtest) planShoppers() ([]*shopper, error) {
	rng := mrand.New(mrand.NewPCG(lt.o.seed, 1))
	out := make([]*shopper, lt.o.shoppers)
	for i := range out {
		user := fmt.Sprintf("shopper%07d", i)
		tok, err := lt.jwt.Mint(user, 2*time.Hour)
		if err != nil {
			return nil, fmt.Errorf("mint token for %s: %w", user, err)
		}
		out[i] = &shopper{user: user, token: tok,
			repeat: rng.Float64() < lt.o.repeat, replay: rng.Float64() < lt.o.idempotentShare}
		if lt.o.lifecycle {
			out[i].pays = rng.Float64() < lt.o.payRatio
		}
	}
	return out, nil
}

// closedLoop keeps --concurrency shoppers buying at once.
func (lt *loadtest) closedLoop(ctx context.Context, shoppers []*shopper, waiters *sync.WaitGroup, done func()) {
	next := make(chan *shopper)
	var wg sync.WaitGroup
	for range lt.o.concurrency {
		wg.Go(func() {
			for s := range next {
				lt.shop(ctx, s, time.Now(), waiters, done)
			}
		})
	}
	for _, s := range shoppers {
		select {
		case next <- s:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
}

// openLoop starts shoppers at --rate per second whatever the answers take;
// each shopper's latency counts from when it was due, so a server that falls
// behind shows its queueing instead of slowing the generator.
func (lt *loadtest) openLoop(ctx context.Context, shoppers []*shopper, start time.Time, waiters *sync.WaitGroup, done func()) {
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / lt.o.rate)
	for i, s := range shoppers {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() { lt.shop(ctx, s, due, waiters, done) })
	}
	wg.Wait()
}
