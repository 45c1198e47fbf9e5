package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/lifecycle"
	"github.com/flashsale/flashsale/internal/metrics"
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
		return fmt.Errorf("%s: a single role needs shared services: set redis.mode server and a shared queue driver (or use serve)", name)
	}
	log := newLog(cfg.Log)
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
		tok, _ := auth.NewJWT([]byte(cfg.Auth.JWTSecret), cfg.Auth.JWTLeeway).Mint("alice", 24*time.Hour)
		fmt.Fprintf(stdout, "dev admin token: %s\ndev shopper token for user alice: %s\n", cfg.Auth.AdminToken, tok)
	}
	return sys.Wait()
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
	db          *sqlstore.DB // nil unless a gateway or worker runs
	pub         queue.Publisher
	newConsumer func(name string) queue.Consumer
	// newExpiryConsumer consumes queue.expiry_topic (its own consumer
	// group on RocketMQ).
	newExpiryConsumer func(name string) queue.Consumer
	queuePing         queue.Pinger

	// The HTTP engines and the roles, from mount; a role that does not run
	// is nil.
	engine         *gin.Engine
	adminEngine    *gin.Engine // engine itself unless http.admin_addr is set
	notifier       *notifier.Notifier
	gateway        *gateway.Service
	worker         *worker.Worker
	consumer       queue.Consumer
	lifecycle      *lifecycle.Service // with a gateway or a worker
	expiry         *worker.Expiry     // with a worker
	expiryConsumer queue.Consumer

	// The listeners, from listen.
	addr      string
	adminAddr string
	listeners []listener

	group *errgroup.Group
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
	sys := &system{log: log, cfg: cfg, roles: roles, Metrics: metrics.New()}
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
	s.store = store.New(rdb)
	if s.roles.gateway || s.roles.worker {
		if s.db, err = sqlstore.Open(ctx, s.cfg.Database.Driver, s.cfg.Database.DSN); err != nil {
			return err
		}
		s.closers = append(s.closers, s.db.Close)
	}
	if s.pub, s.newConsumer, s.newExpiryConsumer, s.queuePing, err = openQueue(s.cfg.Queue, rdb, s.log, s); err != nil {
		return err
	}
	if so.wrapPublisher != nil {
		s.pub = so.wrapPublisher(s.pub)
	}
	return nil
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
	if s.db != nil {
		checks[s.cfg.Database.Driver] = s.db.Ping // "mysql" or "sqlite"
	}
	if s.queuePing != nil {
		checks["queue"] = s.queuePing.Ping
	}
	jwt := auth.NewJWT([]byte(s.cfg.Auth.JWTSecret), s.cfg.Auth.JWTLeeway)
	if s.roles.notifier {
		checks["notifier"] = s.mountNotifier(jwt)
	}
	if s.db != nil {
		opts := lifecycleOptions(s.cfg)
		opts.LatePayments = s.Metrics.LatePayments
		s.lifecycle = lifecycle.New(s.db, s.store, opts, s.log.With("component", "lifecycle"))
	}
	if s.roles.gateway {
		s.mountGateway(jwt)
	}
	registerOps(s.engine, s.Metrics, checks)
	if s.roles.worker {
		s.mountWorker()
	}
	return nil
}

// mountWorker builds the worker, which decides purchases and schedules the
// expiry of the orders they make, and the expiry consumer and sweeper.
func (s *system) mountWorker() {
	log := s.log.With("role", "worker")
	s.worker = worker.New(log, s.store, s.db, s.Metrics, worker.Options{MaxAttempts: s.cfg.Worker.MaxAttempts,
		Expiry: s.pub, ExpiryTopic: s.cfg.Queue.ExpiryTopic})
	s.consumer = s.newConsumer(consumerName())
	if _, ok := s.pub.(queue.DelayPublisher); !ok {
		log.Info("the queue driver has no delayed delivery: unpaid orders expire through the sweeper, payment.grace after their window",
			"driver", s.cfg.Queue.Driver, "grace", s.cfg.Payment.Grace)
	}
	s.expiry = worker.NewExpiry(log, s.lifecycle, worker.ExpiryOptions{Topic: s.cfg.Queue.ExpiryTopic, Publisher: s.pub,
		MaxAttempts: s.cfg.Worker.MaxAttempts})
	s.expiryConsumer = s.newExpiryConsumer(consumerName())
}

// mountNotifier builds the notifier and registers its WebSocket and poll
// routes. It returns the notifier's readiness check.
func (s *system) mountNotifier(jwt *auth.JWT) func(context.Context) error {
	ntf := notifier.New(s.log.With("role", "notifier"), s.store, s.Metrics, notifier.Options{
		AllowedOrigins:          s.cfg.Notifier.AllowedOrigins,
		MaxSubscriptionsPerConn: s.cfg.Notifier.MaxSubscriptionsPerConn,
		PingInterval:            s.cfg.Notifier.PingInterval,
		RecheckInterval:         s.cfg.Notifier.RecheckInterval,
	})
	ntf.Register(s.engine, httpapi.Shopper(s.log, jwt, false), httpapi.Shopper(s.log, jwt, true))
	s.notifier = ntf
	return func(context.Context) error {
		if !ntf.Ready() {
			return errors.New("results subscription not ready")
		}
		return nil
	}
}

// mountGateway builds the gateway and registers its admin and shopper routes.
func (s *system) mountGateway(jwt *auth.JWT) {
	s.gateway = gateway.New(s.log.With("role", "gateway"), s.store, s.db, s.pub, s.Metrics, gatewayOptions(s.cfg))
	log := s.log.With("role", "gateway")
	admin, shopper := httpapi.Admin(s.log, s.cfg.Auth.AdminToken), httpapi.Shopper(s.log, jwt, false)
	h := gateway.NewHandlers(log, s.gateway)
	h.RegisterAdmin(s.adminEngine, admin)
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
		SoldOutRecheck:   cfg.Gateway.SoldOutRecheck,
		PublishTimeout:   cfg.Gateway.PublishTimeout,
		AdmitBatch:       cfg.Gateway.AdmitBatch,
		AdmitConcurrency: cfg.Gateway.AdmitConcurrency,
		AdmitLinger:      cfg.Gateway.AdmitLinger,
		BreakerFailures:  cfg.Gateway.BreakerFailures,
		BreakerOpenFor:   cfg.Gateway.BreakerOpenFor,
	}
}

// listen binds the main address and, when http.admin_addr is set, the admin
// one.
func (s *system) listen() (err error) {
	if s.addr, err = s.bind(s.cfg.HTTP.Addr, s.engine); err != nil {
		return err
	}
	if s.cfg.HTTP.AdminAddr != "" {
		s.adminAddr, err = s.bind(s.cfg.HTTP.AdminAddr, s.adminEngine)
	}
	return err
}

func (s *system) bind(addr string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen %s: %w", addr, err)
	}
	c := s.cfg.HTTP
	srv := &http.Server{Handler: h, ReadHeaderTimeout: c.ReadHeaderTimeout, ReadTimeout: c.ReadTimeout,
		WriteTimeout: c.WriteTimeout, IdleTimeout: c.IdleTimeout, MaxHeaderBytes: 16 << 10}
	s.listeners = append(s.listeners, listener{ln: ln, srv: srv})
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
		g.Go(func() error { return s.expiry.Sweep(gctx, s.cfg.Payment.SweepInterval) })
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
		s.shutdown(stopLoops)
		return nil
	})
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
	e.Use(m.GinMiddleware(), httpapi.LimitBody(log, c.MaxBodyBytes))
	e.NoRoute(func(c *gin.Context) { httpapi.Abort(c, log, fmt.Errorf("route: %w", errNoRoute)) })
	e.NoMethod(func(c *gin.Context) { httpapi.Abort(c, log, fmt.Errorf("method: %w", errNoRoute)) })
	return e, nil
}

var errNoRoute = fmt.Errorf("no such route: %w", model.ErrNotFound)

func registerOps(e *gin.Engine, m *metrics.Metrics, checks map[string]func(context.Context) error) {
	e.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	e.GET("/readyz", func(c *gin.Context) {
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
	e.GET("/metrics", gin.WrapH(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})))
}

func openRedis(ctx context.Context, c config.Redis, sys *system) (redis.UniversalClient, error) {
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
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: c.Password, DB: c.DB, PoolSize: c.PoolSize})
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
func openQueue(c config.Queue, rdb redis.UniversalClient, log *slog.Logger, sys *system) (queue.Publisher, func(name string) queue.Consumer, func(name string) queue.Consumer, queue.Pinger, error) {
	switch c.Driver {
	case "memqueue":
		q := memqueue.New(memqueue.Options{Partitions: c.Partitions, BatchSize: c.BatchSize})
		sys.closers = append(sys.closers, q.Close)
		consumer := func(name string) queue.Consumer { return q.Consumer(name) }
		return q, consumer, consumer, q, nil
	case "redisstream":
		q := redisstream.New(rdb, redisstream.Options{Partitions: c.Partitions, BatchSize: c.BatchSize, Group: c.Group,
			LeaseTTL: c.LeaseTTL, Logger: log.With("component", "redisstream")})
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

// openRocketMQ returns a RocketMQ queue and registers its closer. New only
// resolves the name servers' host names; the clients connect lazily, and
// readiness (Ping) reports an unreachable broker.
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
