package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/challenge"
	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/lifecycle"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/openapi"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/requestid"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/notifier"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/memqueue"
	"github.com/flashsale/flashsale/queue/redisstream"
	"github.com/flashsale/flashsale/queue/rocketmq"
	"github.com/flashsale/flashsale/worker"
)

type roleSet struct{ gateway, worker, notifier bool }

// metrics names the roles for internal/metrics, which exports the families
// of these roles only.
func (r roleSet) metrics() []metrics.Role {
	var out []metrics.Role
	if r.gateway {
		out = append(out, metrics.Gateway)
	}
	if r.worker {
		out = append(out, metrics.Worker)
	}
	if r.notifier {
		out = append(out, metrics.Notifier)
	}
	return out
}

func (r roleSet) String() string {
	var names []string
	if r.gateway {
		names = append(names, "gateway")
	}
	if r.worker {
		names = append(names, "worker")
	}
	if r.notifier {
		names = append(names, "notifier")
	}
	return strings.Join(names, "+")
}

func runRoles(ctx context.Context, name string, args []string, stdout io.Writer, env map[string]string, newLog newLogger, roles roleSet) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	configPath := fs.String("config", "", "config file (default: the built-in embedded config, see configs/flashsale.yaml)")
	addr := fs.String("addr", "", "listen address, overrides http.addr")
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: flashsale %s [--config FILE] [--addr HOST:PORT]\n\nRuns: %s. Environment variables FLASHSALE_* override config keys.\n", name, roles)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(*configPath, env)
	if err != nil {
		return err
	}
	if *addr != "" {
		cfg.HTTP.Addr = *addr
	}
	if roles != (roleSet{true, true, true}) && (cfg.Redis.Mode == "embedded" || cfg.Queue.Driver == "memqueue") {
		return fmt.Errorf("%s: a single role needs shared services: set redis.mode server or cluster and a shared queue driver (or use serve)", name)
	}
	log := newLog(cfg.Log)
	routeRedisLog(log)
	if percent, ok := gcPercent(roles, env); ok {
		debug.SetGCPercent(percent)
		log.Info("garbage collector target set for the role; GOGC overrides it", "gc_percent", percent)
	}
	log.Info("starting", "roles", roles.String(), "version", version, "config", fmt.Sprintf("%+v", cfg.Masked()))
	sys, err := start(ctx, cfg, log, roles)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "flashsale %s listening on http://%s\n", roles, sys.Addr())
	if sys.adminAddr != "" {
		fmt.Fprintf(stdout, "admin API on http://%s\n", sys.adminAddr)
	}
	if cfg.Auth.Dev {
		printDevTokens(stdout, cfg.Auth)
	}
	return sys.Wait()
}

// busyGCPercent is the GOGC of a process whose live heap is bounded. A
// gateway's and a worker's are small (caches with caps, a few batches in
// flight) while every purchase allocates: at Go's default of 100 a gateway
// collected ~10 times a second under load, and 400 cut its CPU per
// purchase by 5-35 % (docs/BENCHMARKS.md, round 8); a worker's successes
// rose about 5 % (issue 29). A notifier's live heap grows with the
// connections it holds, and 400 would let the process grow to five times
// it: a process with a notifier takes 400 only when GOMEMLIMIT bounds its
// memory (the collector then runs at that limit whatever the target), and
// serve sold a success for 13 % less CPU that way (issue 29).
const busyGCPercent = 400

// gcPercent returns the GC target to set for roles, unless GOGC is set.
func gcPercent(roles roleSet, env map[string]string) (int, bool) {
	if _, set := env["GOGC"]; set {
		return 0, false
	}
	if _, bounded := env["GOMEMLIMIT"]; roles.notifier && !bounded {
		return 0, false
	}
	return busyGCPercent, true
}

// authOptions are the shopper token checks a config asks for.
func authOptions(a config.Auth, log *slog.Logger) auth.Options {
	return auth.Options{Leeway: a.JWTLeeway, MaxLifetime: a.MaxTokenLifetime, Algorithms: a.Algorithms, Issuer: a.Issuer, Audience: a.Audience,
		JWKSURL: a.JWKSURL, JWKSRefresh: a.JWKSRefresh, JWKSUnknownKID: a.JWKSUnknownKID, Log: log.With("component", "auth")}
}

// printDevTokens prints what a developer needs to try the API, but only
// what comes from the built-in development secrets: a secret set in a file
// or the environment is never written out, nor a token signed with it.
func printDevTokens(stdout io.Writer, a config.Auth) {
	if a.AdminToken == config.DevAdminToken {
		fmt.Fprintf(stdout, "dev admin token: %s\n", a.AdminToken)
	} else {
		fmt.Fprintln(stdout, "admin token: auth.admin_token as configured (not printed)")
	}
	if a.JWTSecret == config.DevJWTSecret {
		tok, _ := auth.NewJWT([]byte(a.JWTSecret), a.JWTLeeway).Mint("alice", 24*time.Hour)
		fmt.Fprintf(stdout, "dev shopper token for user alice: %s\n", tok)
	} else {
		fmt.Fprintln(stdout, "shopper tokens: sign them with auth.jwt_secret as configured (flashsale token USER)")
	}
}

// system is a running set of roles and the clients they share. start builds
// it in steps that read top to bottom (open, mount, listen, run); when ctx
// ends, shutdown stops it and Wait closes the clients.
type system struct {
	log     *slog.Logger
	cfg     config.Config
	roles   roleSet
	Metrics *metrics.Metrics

	// The clients, from open. closers are called in reverse order after the
	// roles stop.
	closers     []func() error
	store       *store.Store
	redisGuard  *store.Guard // bounds every Redis call (openRedis)
	db          *sqlstore.DB // nil unless a gateway or worker runs
	pub         queue.Publisher
	newConsumer func(name string) queue.Consumer
	// newExpiryConsumer consumes queue.expiry_topic (its own consumer
	// group on RocketMQ).
	newExpiryConsumer func(name string) queue.Consumer
	queuePing         queue.Pinger
	backlog           queue.BacklogReader // nil unless the driver can tell
	// shoppers verifies shopper tokens; nil unless a gateway or notifier runs.
	shoppers *auth.JWT

	// The HTTP engines and the roles, from mount; a role that does not run
	// is nil.
	engine         *gin.Engine
	adminEngine    *gin.Engine // engine itself unless http.admin_addr is set
	notifier       *notifier.Notifier
	gateway        *gateway.Service
	worker         *worker.Worker
	consumer       queue.Consumer
	lifecycle      *lifecycle.Service  // with a gateway or a worker
	restorer       *reconcile.Restorer // with MySQL open: one per process, so its bound is the process's
	expiry         *worker.Expiry      // with a worker
	expiryConsumer queue.Consumer
	sweeper        worker.Sweeper // with a worker

	// The listeners, from listen.
	addr      string
	adminAddr string
	listeners []listener

	group *errgroup.Group
	// draining is set once a stop begins: /readyz answers 503 from then on.
	draining atomic.Bool
}

// listener is a bound address and the server that serves it once run starts.
type listener struct {
	ln  net.Listener
	srv *http.Server
}

// Addr is the main listener's address.
func (s *system) Addr() string { return s.addr }

// startOptions are seams for fault-injection tests.
type startOptions struct {
	wrapPublisher func(queue.Publisher) queue.Publisher
}

type startOption func(*startOptions)

// start opens the clients, mounts the roles, binds the listeners and runs
// everything in the background until ctx ends. Nothing runs before the last
// step, so a failed start only has to close what it opened.
func start(ctx context.Context, cfg config.Config, log *slog.Logger, roles roleSet, opts ...startOption) (_ *system, err error) {
	var so startOptions
	for _, o := range opts {
		o(&so)
	}
	// sys is not the named result: "return nil, err" must not hide it from
	// the cleanup below.
	sys := &system{log: log, cfg: cfg, roles: roles, Metrics: metrics.New(roles.metrics()...)}
	sys.Metrics.SetBuildInfo(version)
	defer func() {
		if err != nil {
			sys.abort()
		}
	}()
	if err = sys.open(ctx, so); err != nil {
		return nil, err
	}
	if err = sys.mount(); err != nil {
		return nil, err
	}
	if err = sys.listen(); err != nil {
		return nil, err
	}
	sys.run(ctx)
	return sys, nil
}

// open connects the clients the roles share, each registering its closer.
func (s *system) open(ctx context.Context, so startOptions) error {
	rdb, err := openRedis(ctx, s.cfg.Redis, s)
	if err != nil {
		return err
	}
	rdb.AddHook(s.Metrics.ScriptHook(scriptNames()))
	storeOpts := []store.Option{store.WithKeyRetention(s.cfg.Redis.KeyRetention), store.WithTransferObserver(s.Metrics.ObserveTransfer)}
	if s.cfg.Redis.Mode == "embedded" {
		storeOpts = append(storeOpts, store.WithPlainResults()) // miniredis has no sharded pub/sub
	}
	if n := s.cfg.Redis.MinReplicasAck; n > 0 {
		storeOpts = append(storeOpts, store.WithReplicaAck(store.ReplicaAck{Replicas: n, Timeout: s.cfg.Redis.ReplicaAckTimeout,
			Observe: s.Metrics.ObserveReplicaAck}))
	}
	s.store = store.New(rdb, storeOpts...)
	// A notifier reads MySQL too: a poll Redis cannot answer finds its
	// order there (guarantee 4), or its lost result decided.
	if s.roles.gateway || s.roles.worker || s.roles.notifier {
		if s.db, err = sqlstore.Open(ctx, s.cfg.Database.Driver, s.cfg.Database.DSN); err != nil {
			return err
		}
		s.closers = append(s.closers, s.db.Close)
	}
	if s.pub, s.newConsumer, s.newExpiryConsumer, s.queuePing, err = openQueue(ctx, s.cfg.Queue, rdb, s.log, s); err != nil {
		return err
	}
	s.backlog, _ = s.pub.(queue.BacklogReader)
	if so.wrapPublisher != nil {
		s.pub = so.wrapPublisher(s.pub)
	}
	if s.roles.gateway || s.roles.notifier {
		// The provider's key set is fetched now (a wrong auth.jwks_url
		// fails the start) and refreshed until the clients close.
		keysCtx, stopKeys := context.WithCancel(context.WithoutCancel(ctx))
		s.closers = append(s.closers, func() error { stopKeys(); return nil })
		if s.shoppers, err = auth.New(keysCtx, []byte(s.cfg.Auth.JWTSecret), authOptions(s.cfg.Auth, s.log)); err != nil {
			return fmt.Errorf("shopper auth: %w", err)
		}
	}
	return nil
}

// scriptNames names the Lua scripts run on Redis, for their latency
// metric.
func scriptNames() map[string]string {
	names := store.ScriptNames()
	maps.Copy(names, redisstream.ScriptNames())
	return names
}

// mount builds the roles this process runs and registers their routes, the
// health checks and the metrics on the HTTP engines.
func (s *system) mount() error {
	gin.SetMode(gin.ReleaseMode)
	var err error
	if s.engine, err = newEngine(s.log, s.Metrics, s.cfg.HTTP); err != nil {
		return err
	}
	s.adminEngine = s.engine
	if s.cfg.HTTP.AdminAddr != "" {
		if s.adminEngine, err = newEngine(s.log, s.Metrics, s.cfg.HTTP); err != nil {
			return err
		}
	}
	checks := map[string]func(context.Context) error{"redis": s.store.Ping}
	orders := s.roles.gateway || s.roles.worker // a notifier's pushes need no MySQL
	if orders {
		checks[s.cfg.Database.Driver] = s.db.Ping // "mysql" or "sqlite"
	}
	if s.queuePing != nil {
		checks["queue"] = s.queuePing.Ping
	}
	if s.db != nil {
		s.restorer = reconcile.NewRestorer(s.log.With("component", "restore"), s.db, s.store, s.Metrics, reconcile.RestorerOptions{})
	}
	if s.roles.notifier {
		checks["notifier"] = s.mountNotifier(s.shoppers)
	}
	if orders {
		opts := lifecycleOptions(s.cfg)
		opts.LatePayments = s.Metrics.LatePayments
		s.lifecycle = lifecycle.New(s.db, s.store, opts, s.log.With("component", "lifecycle"))
	}
	if s.roles.gateway {
		s.mountGateway(s.shoppers)
		s.mountWeb()
	}
	registerOps(s.engine, s.adminEngine, s.Metrics, checks, s.draining.Load)
	s.Metrics.WatchDependencies(checks)
	if s.roles.gateway || s.roles.notifier {
		registerDocument(s.engine, s.adminEngine)
	}
	if s.roles.worker {
		s.mountWorker()
	}
	return nil
}

// watchStock exports the units left of every open campaign loaded into
// Redis: what a dashboard shows selling down.
func (s *system) watchStock() {
	s.Metrics.WatchStock(func(ctx context.Context) (map[string]int64, error) {
		ids, err := s.db.OpenCampaignIDs(ctx, time.Now())
		if err != nil {
			return nil, err
		}
		return s.store.Remaining(ctx, ids)
	})
}

// watchBacklog exports what waits in each partition of the topics the
// worker consumes, when the queue driver can tell.
func (s *system) watchBacklog() {
	if s.backlog == nil {
		return
	}
	s.Metrics.WatchBacklog([]string{s.cfg.Queue.Topic, s.cfg.Queue.ExpiryTopic}, func(ctx context.Context, topic string) ([]metrics.Backlog, error) {
		partitions, err := s.backlog.Backlog(ctx, topic)
		if err != nil {
			return nil, err
		}
		out := make([]metrics.Backlog, len(partitions))
		for i, b := range partitions {
			out[i] = metrics.Backlog(b)
		}
		return out, nil
	})
}

// mountWorker builds the worker, which decides purchases and schedules the
// expiry of the orders they make, the expiry consumer, and the sweeper of
// the periodic tasks (the not-enqueued sweep, transfer recovery, the
// expiry sweep).
func (s *system) mountWorker() {
	log := s.log.With("role", "worker")
	opts := worker.Options{MaxAttempts: s.cfg.Worker.MaxAttempts,
		Expiry: s.pub, ExpiryTopic: s.cfg.Queue.ExpiryTopic, KeyRetention: s.cfg.Redis.KeyRetention, Restorer: s.restorer}
	if s.cfg.Degrade == config.DegradeMySQL {
		opts.Decider = s.db
		if s.cfg.Redis.Mode != "cluster" { // as the gateway's RedisDown (mountGateway)
			opts.RedisDown = s.redisGuard.Down
		}
		opts.RedisOutages = s.redisGuard.Outages
	}
	s.worker = worker.New(log, s.store, s.db, s.Metrics, opts)
	s.consumer = s.newConsumer(consumerName())
	if _, ok := s.pub.(queue.DelayPublisher); !ok {
		log.Info("the queue driver has no delayed delivery: unpaid orders expire through the sweeper, payment.grace after their window",
			"driver", s.cfg.Queue.Driver, "grace", s.cfg.Payment.Grace)
	}
	s.expiry = worker.NewExpiry(log, s.lifecycle, worker.ExpiryOptions{Topic: s.cfg.Queue.ExpiryTopic, Publisher: s.pub,
		MaxAttempts: s.cfg.Worker.MaxAttempts})
	s.expiryConsumer = s.newExpiryConsumer(consumerName())
	s.sweeper = worker.Sweeper{Log: log,
		Tasks: append(s.worker.Tasks(s.cfg.Worker.NotEnqueuedGrace, s.cfg.Worker.MaxQueueDelay), s.expiry.SweepTask(s.cfg.Payment.SweepInterval))}
	s.watchBacklog()
}

// mountNotifier builds the notifier and registers its WebSocket and poll
// routes. It returns the notifier's readiness check.
func (s *system) mountNotifier(jwt *auth.JWT) func(context.Context) error {
	c := s.cfg.Notifier
	fileLimit := openFileLimit()
	maxConns := webSocketBudget(c, fileLimit)
	log := s.log.With("role", "notifier")
	log.Info("WebSocket budget", "max_conns", maxConns, "open_file_limit", fileLimit, "fd_reserve", c.FDReserve)
	opts := notifier.Options{
		AllowedOrigins:          c.AllowedOrigins,
		MaxSubscriptionsPerConn: c.MaxSubscriptionsPerConn,
		PingInterval:            c.PingInterval,
		RecheckInterval:         c.RecheckInterval,
		MaxConnsPerUser:         c.MaxConnsPerUser,
		MaxConnsPerIP:           c.MaxConnsPerIP,
		MaxConns:                maxConns,
		PollRate:                c.PollRate,
		PollBurst:               c.PollBurst,
		SubscribeRate:           c.SubscribeRate,
		SubscribeBurst:          c.SubscribeBurst,
		Issuer:                  requestIssuer(s.cfg),
	}
	if s.db != nil {
		// A poll Redis has no result for finds its order in MySQL; without
		// one, the lost rule (the worker's bounds) ends or waits on it.
		opts.Ledger = s.db
		opts.Lost, opts.Grace, opts.MaxQueueDelay = s.store, s.cfg.Worker.NotEnqueuedGrace, s.cfg.Worker.MaxQueueDelay
		opts.Restorer = s.restorer
	}
	ntf := notifier.New(log, s.store, s.Metrics, opts)
	ntf.Register(s.engine, httpapi.Shopper(s.log, jwt, false), httpapi.Shopper(s.log, jwt, true))
	s.notifier = ntf
	return func(context.Context) error {
		if !ntf.Ready() {
			return errors.New("results subscription not ready")
		}
		return nil
	}
}

// webSocketBudget is the process's WebSocket cap: notifier.max_conns, or
// the descriptor limit less notifier.fd_reserve (at most half the limit),
// so that WebSockets cannot take the descriptors plain HTTP, /healthz and
// the Redis and MySQL pools need.
func webSocketBudget(c config.Notifier, fileLimit int) int {
	return descriptorBudget(c.MaxConns, c.FDReserve, fileLimit, 2)
}

// descriptorBudget is maxConns when set, else the descriptor limit less
// reserve, which takes at most 1/share of it.
func descriptorBudget(maxConns, reserve, fileLimit, share int) int {
	if maxConns > 0 {
		return maxConns
	}
	return fileLimit - min(reserve, fileLimit/share)
}

// mountGateway builds the gateway and registers its admin and shopper routes.
func (s *system) mountGateway(jwt *auth.JWT) {
	opts := gatewayOptions(s.cfg)
	if s.cfg.Redis.Mode != "cluster" {
		// On a cluster an outage is a master's: the campaigns on the
		// others sell on, so none is refused for it without asking.
		opts.RedisDown = s.redisGuard.Down
	}
	opts.Restorer = s.restorer
	if s.cfg.Degrade == config.DegradeMySQL {
		opts.Degrade, opts.Decider = true, s.db
	}
	s.gateway = gateway.New(s.log.With("role", "gateway"), s.store, s.db, s.pub, s.Metrics, opts)
	s.watchStock()
	log := s.log.With("role", "gateway")
	admin := httpapi.Admin(s.log, s.cfg.Auth.AdminToken, s.cfg.Auth.AdminFailuresPerMinute)
	shopper := httpapi.Shopper(s.log, jwt, false)
	h := gateway.NewHandlers(log, s.gateway)
	h.RegisterAdmin(s.adminEngine, admin)
	gateway.NewStatsStream(log, s.gateway, s.draining.Load).Register(s.adminEngine, admin)
	s.mountConsole()
	h.RegisterShopper(s.engine, shopper)
	oh := gateway.NewOrderHandlers(log, s.lifecycle)
	oh.RegisterAdmin(s.adminEngine, admin)
	oh.RegisterShopper(s.engine, shopper)
	oh.RegisterWebhook(s.engine)
}

// lifecycleOptions is the order lifecycle's part of the config.
func lifecycleOptions(cfg config.Config) lifecycle.Options {
	return lifecycle.Options{
		Provider:      cfg.Payment.Provider,
		WebhookSecret: cfg.Payment.WebhookSecret,
		Tolerance:     cfg.Payment.WebhookTolerance,
		Grace:         cfg.Payment.Grace,
	}
}

// gatewayOptions is the gateway's part of the config.
func gatewayOptions(cfg config.Config) gateway.Options {
	return gateway.Options{
		Topic:            cfg.Queue.Topic,
		RateLimits:       cfg.Gateway.RateLimits,
		CampaignCacheTTL: cfg.Gateway.CampaignCacheTTL,
		CachedCampaigns:  cfg.Gateway.CachedCampaigns,
		CachedUnknownIDs: cfg.Gateway.CachedUnknownIDs,
		SoldOutRecheck:   cfg.Gateway.SoldOutRecheck,
		PublishTimeout:   cfg.Gateway.PublishTimeout,
		AdmitBatch:       cfg.Gateway.AdmitBatch,
		AdmitConcurrency: cfg.Gateway.AdmitConcurrency,
		AdmitLinger:      cfg.Gateway.AdmitLinger,
		BreakerFailures:  cfg.Gateway.BreakerFailures,
		BreakerOpenFor:   cfg.Gateway.BreakerOpenFor,
		// The challenge key is derived from jwt_secret (a labelled HMAC, so
		// neither can stand for the other): every deployment already
		// holds it, at least 32 bytes, shared by all gateways and never
		// the development value outside dev, so no new secret to manage.
		Gate:   challenge.NewPoW([]byte(cfg.Auth.JWTSecret), challenge.DefaultTTL, nil),
		Issuer: requestIssuer(cfg),
	}
}

// requestIssuer mints the gateways' request ids and recognises them in
// the notifiers' lost rule. Its key is derived from jwt_secret as the
// challenge key is (HMAC-SHA256(jwt_secret, "flashsale/request-id/v1")),
// so every role of a deployment holds it with no new secret. Not from
// admin_token: every shopper holds ids signed with the key, against which
// a short admin token (8 bytes are allowed) could be searched offline;
// jwt_secret is at least 32 bytes.
func requestIssuer(cfg config.Config) *requestid.Issuer {
	return requestid.NewIssuer([]byte(cfg.Auth.JWTSecret))
}

// listen binds the main address and, when http.admin_addr is set, the admin
// one.
func (s *system) listen() (err error) {
	public := httpapi.ConnBudgetOptions{MaxConns: connBudget(s.cfg.HTTP, openFileLimit()),
		MaxConnsPerIP: cmp.Or(s.cfg.HTTP.MaxConnsPerIP, 2*s.cfg.Notifier.MaxConnsPerIP), Exempt: trusted(s.cfg.HTTP.TrustedProxies)}
	if s.addr, err = s.bind(s.cfg.HTTP.Addr, s.engine, "main", public); err != nil {
		return err
	}
	if s.cfg.HTTP.AdminAddr != "" {
		// Operators and scrapers: a few connections, kept within the
		// main listener's reserve.
		admin := httpapi.ConnBudgetOptions{MaxConns: max(1, min(64, s.cfg.HTTP.FDReserve/2))}
		s.adminAddr, err = s.bind(s.cfg.HTTP.AdminAddr, s.adminEngine, "admin", admin)
	}
	return err
}

// connBudget is the main listener's bound on open connections:
// http.max_conns, or the descriptor limit less http.fd_reserve, which
// takes at most a quarter of it (WebSockets, bounded by the larger
// notifier.fd_reserve, leave room for plain HTTP within it).
func connBudget(c config.HTTP, fileLimit int) int {
	return descriptorBudget(c.MaxConns, c.FDReserve, fileLimit, 4)
}

// trusted reports whether an address is one of the trusted proxies
// (addresses or CIDRs; gin checks their syntax first): exempt from the
// per-address connection bound, since every client behind one shares it.
func trusted(proxies []string) func(netip.Addr) bool {
	var prefixes []netip.Prefix
	for _, p := range proxies {
		if pf, err := netip.ParsePrefix(p); err == nil {
			prefixes = append(prefixes, pf.Masked())
		} else if a, err := netip.ParseAddr(p); err == nil {
			prefixes = append(prefixes, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		}
	}
	return func(a netip.Addr) bool {
		return slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(a) })
	}
}

// maxHeaderBytes bounds a request's line and headers: net/http reads
// 4,096 bytes more than its MaxHeaderBytes before answering 431.
const maxHeaderBytes = 16 << 10

func (s *system) bind(addr string, h http.Handler, name string, budget httpapi.ConnBudgetOptions) (string, error) {
	// TCP keep-alive stays on with the system's timers: Go's 15 s ones cost
	// three setsockopt calls per accepted connection (a WebSocket per
	// purchase pays them each time), and every connection is bounded
	// anyway: HTTP by the server's timeouts, WebSockets by the pings.
	lc := net.ListenConfig{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: -1, Interval: -1, Count: -1}}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen %s: %w", addr, err)
	}
	budget.Observe = func(event, reason string) {
		if event == "refused" {
			s.Metrics.ConnsRefused.WithLabelValues(name, reason).Inc()
		} else {
			s.Metrics.ConnsClosed.WithLabelValues(name, reason).Inc()
		}
	}
	b := httpapi.NewConnBudget(budget)
	s.Metrics.WatchConnections(name, b.Open)
	c := s.cfg.HTTP
	srv := &http.Server{Handler: b.Handler(h), ReadHeaderTimeout: c.ReadHeaderTimeout, ReadTimeout: c.ReadTimeout,
		WriteTimeout: c.WriteTimeout, IdleTimeout: c.IdleTimeout, MaxHeaderBytes: maxHeaderBytes - 4096,
		ConnState: b.ConnState, ConnContext: b.ConnContext}
	s.listeners = append(s.listeners, listener{ln: b.Listener(ln), srv: srv})
	return ln.Addr().String(), nil
}

// run starts the roles and the servers under one errgroup, and the shutdown
// that follows the end of ctx. A role that fails cancels the group's context,
// which shuts the others down too.
func (s *system) run(ctx context.Context) {
	// The notifier's and the gateway's loops outlive ctx: in-flight requests
	// need them until the servers have drained (shutdown stops them).
	loops, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	g, gctx := errgroup.WithContext(ctx)
	s.group = g
	if s.notifier != nil {
		g.Go(func() error { return s.notifier.Run(loops) })
	}
	if s.gateway != nil {
		g.Go(func() error { return s.gateway.Run(loops) })
	}
	// Workers stop when ctx ends, so they finish their batch while the
	// servers drain.
	if s.worker != nil {
		g.Go(func() error { return s.worker.Run(gctx, s.consumer, s.cfg.Queue.Topic) })
		g.Go(func() error { return s.expiry.Run(gctx, s.expiryConsumer) })
		g.Go(func() error { return s.sweeper.Run(gctx) })
	}
	if s.gateway != nil || s.worker != nil {
		g.Go(func() error { return s.handBack(gctx) })
	}
	for _, l := range s.listeners {
		g.Go(func() error {
			if err := l.srv.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", l.ln.Addr(), err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		s.drain()
		s.shutdown(stopLoops)
		return nil
	})
}

// drain marks the process draining, so /readyz answers 503, and goes on
// serving for http.drain_delay: a load balancer that polls /readyz stops
// sending requests before the listeners close, instead of seeing refused
// connections. Only a gateway or a notifier waits; a worker serves no
// shopper (it stopped consuming and freed its partitions already).
func (s *system) drain() {
	s.draining.Store(true)
	d := s.cfg.HTTP.DrainDelay
	if d <= 0 || !(s.roles.gateway || s.roles.notifier) {
		return
	}
	s.log.Info("draining: /readyz answers 503 until the listeners close", "drain_delay", d)
	time.Sleep(d)
}

// shutdown stops intake and lets in-flight requests finish within
// http.shutdown_timeout, then stops the roles' loops. The workers drain by
// themselves: they watch ctx directly.
func (s *system) shutdown(stopLoops context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HTTP.ShutdownTimeout)
	defer cancel()
	// WebSockets first: http.Server.Shutdown does not track hijacked
	// connections.
	if s.notifier != nil {
		s.notifier.Shutdown(ctx)
	}
	for _, l := range s.listeners {
		if err := l.srv.Shutdown(ctx); err != nil {
			s.log.Warn("http shutdown", "err", err)
		}
	}
	stopLoops()
}

// Wait blocks until ctx (given to start) ends and everything has shut down,
// then closes the clients.
func (s *system) Wait() error {
	err := s.group.Wait()
	s.close()
	s.log.Info("stopped")
	return err
}

// abort undoes a start that failed before anything ran.
func (s *system) abort() {
	for _, l := range s.listeners {
		_ = l.ln.Close()
	}
	s.close()
}

// close closes the clients in reverse order of opening.
func (s *system) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](); err != nil {
			s.log.Warn("close", "err", err)
		}
	}
}

func newEngine(log *slog.Logger, m *metrics.Metrics, c config.HTTP) (*gin.Engine, error) {
	e := gin.New()
	// gin trusts every proxy by default; trust only the configured ones, so
	// X-Forwarded-For from a client cannot choose its rate-limit key.
	if err := e.SetTrustedProxies(c.TrustedProxies); err != nil {
		return nil, fmt.Errorf("config: http.trusted_proxies: %w", err)
	}
	e.HandleMethodNotAllowed = true
	e.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, rec any) {
		httpapi.Abort(c, log, fmt.Errorf("panic: %v", rec))
	}))
	e.Use(m.GinMiddleware(), httpapi.NoSniff, httpapi.CheckBody(log, c.MaxBodyBytes))
	e.NoRoute(func(c *gin.Context) { httpapi.Abort(c, log, fmt.Errorf("route: %w", errNoRoute)) })
	// gin has set the Allow header by then.
	e.NoMethod(func(c *gin.Context) { httpapi.Abort(c, log, fmt.Errorf("route: %w", model.ErrMethodNotAllowed)) })
	return e, nil
}

var errNoRoute = fmt.Errorf("no such route: %w", model.ErrNotFound)

// registerOps mounts the health check on the main engine (and the admin
// one), and the readiness check and the metrics on the admin engine, which
// is the main one unless http.admin_addr is set: they tell the public who
// runs admin actions (the admin routes' refusals), why purchases are
// refused, and which backends are down. Once draining reports true,
// /readyz answers 503 {"status":"draining"}.
func registerOps(e, admin *gin.Engine, m *metrics.Metrics, checks map[string]func(context.Context) error, draining func() bool) {
	healthz := func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) }
	e.GET("/healthz", healthz)
	if admin != e {
		admin.GET("/healthz", healthz)
	}
	admin.GET("/readyz", func(c *gin.Context) {
		if draining() {
			c.JSON(http.StatusServiceUnavailable, gin.H{"status": "draining"})
			return
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), 2*time.Second)
		defer cancel()
		status, body := http.StatusOK, gin.H{}
		for name, check := range checks {
			if err := check(ctx); err != nil {
				status, body[name] = http.StatusServiceUnavailable, "down"
				continue
			}
			body[name] = "ok"
		}
		c.JSON(status, body)
	})
	admin.GET("/metrics", gin.WrapH(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})))
}

// registerDocument serves the API's OpenAPI document on both listeners,
// like /healthz: integrators read it on the public one, operators on the
// admin one.
func registerDocument(e, admin *gin.Engine) {
	e.GET(openapi.Path, openapi.Serve)
	if admin != e {
		admin.GET(openapi.Path, openapi.Serve)
	}
}

// openRedis opens the stock's Redis. Its guard is the process's
// (sys.redisGuard): the gateway reads it to tell Redis down, and
// flashsale_redis_up follows it.
func openRedis(ctx context.Context, c config.Redis, sys *system) (redis.UniversalClient, error) {
	guard := &store.Guard{Timeout: c.Timeout, Log: sys.log}
	if sys.Metrics != nil {
		guard.Observe = sys.Metrics.ObserveRedis
	}
	sys.redisGuard = guard
	return openGuardedRedis(ctx, c, guard, sys)
}

// openGuardedRedis opens the Redis c describes, every call bounded by
// guard, and registers its closer.
func openGuardedRedis(ctx context.Context, c config.Redis, guard *store.Guard, sys *system) (redis.UniversalClient, error) {
	// Every call is bounded by c.Timeout (the guard sets its deadline);
	// the sockets' read timeout is longer only for what waits by design:
	// a pipelined WAIT for replicas is read under it.
	readTimeout := c.Timeout
	if c.MinReplicasAck > 0 {
		readTimeout += c.ReplicaAckTimeout
	}
	if c.Mode == "cluster" {
		// Every key carries its campaign's (or queue partition's) hash
		// tag, so the same scripts run on the cluster unchanged.
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, Password: c.Password, PoolSize: c.PoolSize,
			ClusterStateReloadInterval: c.ClusterReloadInterval, ContextTimeoutEnabled: true,
			DialTimeout: c.Timeout, ReadTimeout: readTimeout, WriteTimeout: c.Timeout, PoolTimeout: c.Timeout})
		rdb.AddHook(guard)
		sys.closers = append(sys.closers, rdb.Close)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		// A ping reaches one node; every master must answer before this
		// process takes traffic, or the slots of a missing one would fail
		// the first purchases of its campaigns.
		if err := rdb.ForEachMaster(pctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() }); err != nil {
			return nil, fmt.Errorf("redis cluster %s: %w", strings.Join(c.Addrs, ","), err)
		}
		return rdb, nil
	}
	addr := c.Addr
	if c.Mode == "embedded" {
		mr := miniredis.NewMiniRedis()
		// Keys must expire on the wall clock: the queue's partition leases
		// and the rate limiter rely on TTLs.
		mr.ClockTTL(true)
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("start embedded redis: %w", err)
		}
		sys.closers = append(sys.closers, func() error { mr.Close(); return nil })
		addr = mr.Addr()
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: c.Password, DB: c.DB, PoolSize: c.PoolSize,
		ContextTimeoutEnabled: true, DialTimeout: c.Timeout, ReadTimeout: readTimeout, WriteTimeout: c.Timeout, PoolTimeout: c.Timeout})
	rdb.AddHook(guard)
	sys.closers = append(sys.closers, rdb.Close)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		return nil, fmt.Errorf("redis %s: %w", addr, err)
	}
	return rdb, nil
}

func consumerName() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
}

// openQueue is the one place that picks a queue driver. It returns the
// publisher, the constructors of the purchase topic's and the expiry
// topic's consumers, and the readiness check.
func openQueue(ctx context.Context, c config.Queue, rdb redis.UniversalClient, log *slog.Logger, sys *system) (queue.Publisher, func(name string) queue.Consumer, func(name string) queue.Consumer, queue.Pinger, error) {
	switch c.Driver {
	case "memqueue":
		q := memqueue.New(memqueue.Options{Partitions: c.Partitions, BatchSize: c.BatchSize})
		sys.closers = append(sys.closers, q.Close)
		consumer := func(name string) queue.Consumer { return q.Consumer(name) }
		return q, consumer, consumer, q, nil
	case "redisstream":
		// The streams live in the stock's Redis unless queue.redis gives
		// them their own; either way, a failover may lose an unreplicated
		// entry unless that Redis's min_replicas_ack waits for it.
		rc := sys.cfg.Redis
		if c.Redis.Mode != "" {
			rc = c.Redis
			// A guard of its own: its outages are logged as the queue's,
			// and the gateway's RedisDown and flashsale_redis_up stay the
			// stock's (the queue's show in /readyz's queue check).
			guard := &store.Guard{Timeout: rc.Timeout, Log: log.With("redis", "queue")}
			var err error
			if rdb, err = openGuardedRedis(ctx, rc, guard, sys); err != nil {
				return nil, nil, nil, nil, fmt.Errorf("queue: %w", err)
			}
			rdb.AddHook(sys.Metrics.ScriptHook(redisstream.ScriptNames()))
		}
		ack := redisstream.ReplicaAck{Replicas: rc.MinReplicasAck, Timeout: rc.ReplicaAckTimeout,
			Observe: sys.Metrics.ObserveReplicaAck}
		q := redisstream.New(rdb, redisstream.Options{Partitions: c.Partitions, BatchSize: c.BatchSize, Group: c.Group,
			LeaseTTL: c.LeaseTTL, Logger: log.With("component", "redisstream"), Observer: sys.Metrics, ReplicaAck: ack})
		consumer := func(name string) queue.Consumer { return q.Consumer(name) }
		return q, consumer, consumer, q, nil
	case "rocketmq":
		r := c.RocketMQ
		var libLevel slog.Level
		_ = libLevel.UnmarshalText([]byte(r.LogLevel)) // validated by config
		opts := rocketmq.Options{
			NameServers: r.NameServers, ProducerGroup: r.ProducerGroup, ConsumerGroup: c.Group,
			ProducerInstance: r.ProducerInstance, ConsumerInstance: r.ConsumerInstance,
			Queues: c.Partitions, BatchSize: c.BatchSize, SendAttempts: 1 + r.Retries,
			MaxReconsumeTimes: r.MaxReconsumeTimes, SuspendTime: r.SuspendTime, ProbeTopic: c.Topic,
			Logger: log.With("component", "rocketmq"), LibraryLogLevel: libLevel,
		}
		q, err := openRocketMQ(opts, sys)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		// The expiry topic's consumers form a group of their own: a
		// RocketMQ group's members must all subscribe to the same topics.
		opts.ConsumerGroup, opts.ProbeTopic = c.Group+config.ExpiryGroupSuffix, c.ExpiryTopic
		eq, err := openRocketMQ(opts, sys)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		return q, func(name string) queue.Consumer { return q.Consumer(name) },
			func(name string) queue.Consumer { return eq.Consumer(name) }, q, nil
	}
	return nil, nil, nil, nil, fmt.Errorf("queue driver %q: unknown", c.Driver)
}

// openRocketMQ returns a RocketMQ queue and registers its closer. New dials
// nothing: the clients connect lazily, and readiness (Ping) reports an
// unreachable name server or broker.
func openRocketMQ(opts rocketmq.Options, sys *system) (*rocketmq.Queue, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := rocketmq.New(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	sys.closers = append(sys.closers, q.Close)
	return q, nil
}
