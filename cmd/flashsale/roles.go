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

func runRoles(ctx context.Context, name string, args []string, stdout io.Writer, env map[string]string, log *slog.Logger, roles roleSet) error {
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
	log = newLogger(cfg.Log)
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

func newLogger(c config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// system is a running set of roles and the clients they share.
type system struct {
	log       *slog.Logger
	cfg       config.Config
	addr      string
	adminAddr string
	group     *errgroup.Group
	closers   []func() error // closed in reverse order after the roles stop
	Metrics   *metrics.Metrics
}

// Addr is the main listener's address.
func (s *system) Addr() string { return s.addr }

// Wait blocks until ctx (given to start) ends and everything has shut down.
func (s *system) Wait() error {
	err := s.group.Wait()
	for i := len(s.closers) - 1; i >= 0; i-- {
		if cerr := s.closers[i](); cerr != nil {
			s.log.Warn("close", "err", cerr)
		}
	}
	s.log.Info("stopped")
	return err
}

// startOptions are seams for fault-injection tests.
type startOptions struct {
	wrapPublisher func(queue.Publisher) queue.Publisher
}

type startOption func(*startOptions)

// start builds clients and roles, binds the listeners and runs everything in
// the background until ctx ends.
func start(ctx context.Context, cfg config.Config, log *slog.Logger, roles roleSet, opts ...startOption) (_ *system, err error) {
	var so startOptions
	for _, o := range opts {
		o(&so)
	}
	gin.SetMode(gin.ReleaseMode)
	// sys is not the named result: "return nil, err" must not hide it from
	// the cleanup below.
	sys := &system{log: log, cfg: cfg, Metrics: metrics.New()}
	defer func() {
		if err != nil {
			for i := len(sys.closers) - 1; i >= 0; i-- {
				_ = sys.closers[i]()
			}
		}
	}()

	rdb, err := openRedis(ctx, cfg.Redis, sys)
	if err != nil {
		return nil, err
	}
	st := store.New(rdb)

	var db *sqlstore.DB
	if roles.gateway || roles.worker {
		db, err = sqlstore.Open(ctx, cfg.Database.Driver, cfg.Database.DSN)
		if err != nil {
			return nil, err
		}
		sys.closers = append(sys.closers, db.Close)
	}

	pub, newConsumer, qping, err := openQueue(cfg.Queue, rdb, log, sys)
	if err != nil {
		return nil, err
	}
	if so.wrapPublisher != nil {
		pub = so.wrapPublisher(pub)
	}

	jwt := auth.NewJWT([]byte(cfg.Auth.JWTSecret), cfg.Auth.JWTLeeway)
	engine, err := newEngine(log, sys.Metrics, cfg.HTTP)
	if err != nil {
		return nil, err
	}
	adminEngine := engine
	if cfg.HTTP.AdminAddr != "" {
		if adminEngine, err = newEngine(log, sys.Metrics, cfg.HTTP); err != nil {
			return nil, err
		}
	}
	checks := map[string]func(context.Context) error{"redis": st.Ping}
	if db != nil {
		checks[cfg.Database.Driver] = db.Ping // "mysql" or "sqlite"
	}
	if qping != nil {
		checks["queue"] = qping.Ping
	}

	runCtx, cancelRoles := context.WithCancel(context.WithoutCancel(ctx))
	// A role that fails cancels gctx, which shuts the others down too.
	g, gctx := errgroup.WithContext(ctx)
	sys.group = g

	var ntf *notifier.Notifier
	if roles.notifier {
		ntf = notifier.New(log.With("role", "notifier"), st, sys.Metrics, notifier.Options{
			AllowedOrigins:          cfg.Notifier.AllowedOrigins,
			MaxSubscriptionsPerConn: cfg.Notifier.MaxSubscriptionsPerConn,
			PingInterval:            cfg.Notifier.PingInterval,
			RecheckInterval:         cfg.Notifier.RecheckInterval,
		})
		ntf.Register(engine, httpapi.Shopper(log, jwt, false), httpapi.Shopper(log, jwt, true))
		checks["notifier"] = func(context.Context) error {
			if !ntf.Ready() {
				return errors.New("results subscription not ready")
			}
			return nil
		}
		g.Go(func() error { return ntf.Run(runCtx) })
	}
	if roles.gateway {
		svc := gateway.New(log.With("role", "gateway"), st, db, pub, sys.Metrics, gateway.Options{
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
		})
		h := gateway.NewHandlers(log.With("role", "gateway"), svc)
		h.RegisterAdmin(adminEngine, httpapi.Admin(log, cfg.Auth.AdminToken))
		h.RegisterShopper(engine, httpapi.Shopper(log, jwt, false))
		g.Go(func() error { return svc.Run(runCtx) })
	}
	registerOps(engine, sys.Metrics, checks)

	// Workers stop when the signal context ends, so they finish their batch
	// while the HTTP servers drain.
	if roles.worker {
		w := worker.New(log.With("role", "worker"), st, db, sys.Metrics, worker.Options{MaxAttempts: cfg.Worker.MaxAttempts})
		consumer := newConsumer(consumerName())
		g.Go(func() error { return w.Run(gctx, consumer, cfg.Queue.Topic) })
	}

	servers := []*http.Server{}
	listen := func(addr string, h http.Handler) (string, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return "", fmt.Errorf("listen %s: %w", addr, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout, ReadTimeout: cfg.HTTP.ReadTimeout,
			WriteTimeout: cfg.HTTP.WriteTimeout, IdleTimeout: cfg.HTTP.IdleTimeout, MaxHeaderBytes: 16 << 10}
		servers = append(servers, srv)
		g.Go(func() error {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", ln.Addr(), err)
			}
			return nil
		})
		return ln.Addr().String(), nil
	}
	if sys.addr, err = listen(cfg.HTTP.Addr, engine); err != nil {
		cancelRoles()
		return nil, err
	}
	if cfg.HTTP.AdminAddr != "" {
		if sys.adminAddr, err = listen(cfg.HTTP.AdminAddr, adminEngine); err != nil {
			cancelRoles()
			return nil, err
		}
	}

	// Shutdown: stop intake (HTTP), close WebSockets, let workers drain (they
	// watch ctx directly), then stop the background loops.
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), cfg.HTTP.ShutdownTimeout)
		defer cancel()
		// WebSockets first: http.Server.Shutdown does not track hijacked
		// connections.
		if ntf != nil {
			ntf.Shutdown(sctx)
		}
		for _, srv := range servers {
			if err := srv.Shutdown(sctx); err != nil {
				log.Warn("http shutdown", "err", err)
			}
		}
		cancelRoles()
		return nil
	})
	return sys, nil
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

// openQueue is the one place that picks a queue driver.
func openQueue(c config.Queue, rdb redis.UniversalClient, log *slog.Logger, sys *system) (queue.Publisher, func(name string) queue.Consumer, queue.Pinger, error) {
	switch c.Driver {
	case "memqueue":
		q := memqueue.New(memqueue.Options{Partitions: c.Partitions, BatchSize: c.BatchSize})
		sys.closers = append(sys.closers, q.Close)
		return q, func(name string) queue.Consumer { return q.Consumer(name) }, q, nil
	case "redisstream":
		q := redisstream.New(rdb, redisstream.Options{Partitions: c.Partitions, BatchSize: c.BatchSize, Group: c.Group,
			LeaseTTL: c.LeaseTTL, Logger: log.With("component", "redisstream")})
		return q, func(name string) queue.Consumer { return q.Consumer(name) }, q, nil
	case "rocketmq":
		r := c.RocketMQ
		var libLevel slog.Level
		_ = libLevel.UnmarshalText([]byte(r.LogLevel)) // validated by config
		// New only resolves the name servers' host names; the clients connect
		// lazily, and readiness (Ping) reports an unreachable broker.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		q, err := rocketmq.New(ctx, rocketmq.Options{
			NameServers: r.NameServers, ProducerGroup: r.ProducerGroup, ConsumerGroup: c.Group,
			ProducerInstance: r.ProducerInstance, ConsumerInstance: r.ConsumerInstance,
			Queues: c.Partitions, BatchSize: c.BatchSize, SendAttempts: 1 + r.Retries,
			MaxReconsumeTimes: r.MaxReconsumeTimes, SuspendTime: r.SuspendTime, ProbeTopic: c.Topic,
			Logger: log.With("component", "rocketmq"), LibraryLogLevel: libLevel,
		})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("queue: %w", err)
		}
		sys.closers = append(sys.closers, q.Close)
		return q, func(name string) queue.Consumer { return q.Consumer(name) }, q, nil
	}
	return nil, nil, nil, fmt.Errorf("queue driver %q: unknown", c.Driver)
}
