// Package config loads flashsale's configuration: built-in defaults (the
// embedded, no-services mode, mirrored by configs/flashsale.yaml), then an
// optional YAML file, then FLASHSALE_* environment variables, then validation.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"gopkg.in/yaml.v3"

	"github.com/flashsale/flashsale/model"
)

// Config is the whole configuration. yaml tags name file keys; env tags name
// the environment variables that override them.
type Config struct {
	HTTP     HTTP     `yaml:"http" envPrefix:"HTTP_"`
	Auth     Auth     `yaml:"auth" envPrefix:"AUTH_"`
	Redis    Redis    `yaml:"redis" envPrefix:"REDIS_"`
	Database Database `yaml:"database" envPrefix:"DATABASE_"`
	Queue    Queue    `yaml:"queue" envPrefix:"QUEUE_"`
	Gateway  Gateway  `yaml:"gateway" envPrefix:"GATEWAY_"`
	Worker   Worker   `yaml:"worker" envPrefix:"WORKER_"`
	Payment  Payment  `yaml:"payment" envPrefix:"PAYMENT_"`
	Notifier Notifier `yaml:"notifier" envPrefix:"NOTIFIER_"`
	Log      Log      `yaml:"log" envPrefix:"LOG_"`
}

// HTTP configures the listeners.
type HTTP struct {
	Addr              string        `yaml:"addr" env:"ADDR"`
	AdminAddr         string        `yaml:"admin_addr" env:"ADMIN_ADDR"`
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout" env:"READ_HEADER_TIMEOUT"`
	ReadTimeout       time.Duration `yaml:"read_timeout" env:"READ_TIMEOUT"`
	WriteTimeout      time.Duration `yaml:"write_timeout" env:"WRITE_TIMEOUT"`
	IdleTimeout       time.Duration `yaml:"idle_timeout" env:"IDLE_TIMEOUT"`
	MaxBodyBytes      int64         `yaml:"max_body_bytes" env:"MAX_BODY_BYTES"`
	// TrustedProxies may set X-Forwarded-For / X-Real-IP; from anyone else
	// those headers are ignored, so a client cannot pick its rate-limit key.
	TrustedProxies  []string      `yaml:"trusted_proxies" env:"TRUSTED_PROXIES"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout" env:"SHUTDOWN_TIMEOUT"`
}

// Auth holds the secrets. They are masked whenever the config is logged.
type Auth struct {
	JWTSecret  string        `yaml:"jwt_secret" env:"JWT_SECRET"`
	JWTLeeway  time.Duration `yaml:"jwt_leeway" env:"JWT_LEEWAY"`
	AdminToken string        `yaml:"admin_token" env:"ADMIN_TOKEN"`
	// Dev marks the built-in development secrets, which serve refuses to use
	// with a real Redis or MySQL.
	Dev bool `yaml:"dev" env:"DEV"`
}

// Redis selects the Redis server; mode "embedded" runs an in-process Redis.
type Redis struct {
	Mode     string `yaml:"mode" env:"MODE"`
	Addr     string `yaml:"addr" env:"ADDR"`
	Password string `yaml:"password" env:"PASSWORD"`
	DB       int    `yaml:"db" env:"DB"`
	PoolSize int    `yaml:"pool_size" env:"POOL_SIZE"`
}

// Database selects the order store.
type Database struct {
	Driver string `yaml:"driver" env:"DRIVER"`
	DSN    string `yaml:"dsn" env:"DSN"`
}

// Queue selects the transport.
type Queue struct {
	Driver     string `yaml:"driver" env:"DRIVER"`
	Topic      string `yaml:"topic" env:"TOPIC"`
	Partitions int    `yaml:"partitions" env:"PARTITIONS"`
	BatchSize  int    `yaml:"batch_size" env:"BATCH_SIZE"`
	Group      string `yaml:"group" env:"GROUP"`
	// LeaseTTL bounds how long a dead worker's partitions wait before another
	// worker takes them over (redisstream).
	LeaseTTL time.Duration `yaml:"lease_ttl" env:"LEASE_TTL"`
	// ExpiryTopic carries one message per order, delayed by its payment
	// window, that expires the order if it is still unpaid. The workers
	// consume it in queue.group, on RocketMQ in <group>-expiry
	// (ExpiryGroupSuffix).
	ExpiryTopic string `yaml:"expiry_topic" env:"EXPIRY_TOPIC"`
	// RocketMQ configures the rocketmq driver.
	RocketMQ RocketMQ `yaml:"rocketmq" envPrefix:"ROCKETMQ_"`
}

// RocketMQ configures the rocketmq driver. Its consumer group is
// queue.group, and queue.partitions is the queue count of a topic the broker
// creates on first send.
type RocketMQ struct {
	NameServers       []string      `yaml:"name_servers" env:"NAME_SERVERS"`
	ProducerGroup     string        `yaml:"producer_group" env:"PRODUCER_GROUP"`
	ProducerInstance  string        `yaml:"producer_instance" env:"PRODUCER_INSTANCE"`
	ConsumerInstance  string        `yaml:"consumer_instance" env:"CONSUMER_INSTANCE"`
	Retries           int           `yaml:"retries" env:"RETRIES"`
	MaxReconsumeTimes int           `yaml:"max_reconsume_times" env:"MAX_RECONSUME_TIMES"`
	SuspendTime       time.Duration `yaml:"suspend_time" env:"SUSPEND_TIME"`
	LogLevel          string        `yaml:"log_level" env:"LOG_LEVEL"`
}

// Gateway tunes how purchases are admitted. The rate limits' keys
// (user_rate, user_burst, campaign_rate, campaign_burst, ip_rate, ip_burst)
// sit directly under gateway; model.RateLimits declares them.
type Gateway struct {
	model.RateLimits `yaml:",inline"`
	PublishTimeout   time.Duration `yaml:"publish_timeout" env:"PUBLISH_TIMEOUT"`
	CampaignCacheTTL time.Duration `yaml:"campaign_cache_ttl" env:"CAMPAIGN_CACHE_TTL"`
	SoldOutRecheck   time.Duration `yaml:"soldout_recheck" env:"SOLDOUT_RECHECK"`
	AdmitBatch       int           `yaml:"admit_batch" env:"ADMIT_BATCH"`
	AdmitConcurrency int           `yaml:"admit_concurrency" env:"ADMIT_CONCURRENCY"`
	AdmitLinger      time.Duration `yaml:"admit_linger" env:"ADMIT_LINGER"`
	BreakerFailures  int           `yaml:"breaker_failures" env:"BREAKER_FAILURES"`
	BreakerOpenFor   time.Duration `yaml:"breaker_open_for" env:"BREAKER_OPEN_FOR"`
}

// Worker tunes consumption.
type Worker struct {
	MaxAttempts int `yaml:"max_attempts" env:"MAX_ATTEMPTS"`
}

// Payment configures what follows a success: the payment provider, the
// signed webhook it reports payments through, and the sweeper that expires
// unpaid orders whose expiry message was lost. The webhook secret is masked
// whenever the config is logged.
type Payment struct {
	// Provider is the payment provider; "fake" (the only one so far)
	// completes a payment at once through the webhook path.
	Provider      string `yaml:"provider" env:"PROVIDER"`
	WebhookSecret string `yaml:"webhook_secret" env:"WEBHOOK_SECRET"`
	// WebhookTolerance is how far a webhook's signed timestamp may be from
	// now, against replays.
	WebhookTolerance time.Duration `yaml:"webhook_tolerance" env:"WEBHOOK_TOLERANCE"`
	// Grace is how long past an order's expiry the sweeper leaves it to its
	// expiry message; SweepInterval how often it looks.
	Grace         time.Duration `yaml:"grace" env:"GRACE"`
	SweepInterval time.Duration `yaml:"sweep_interval" env:"SWEEP_INTERVAL"`
}

// Notifier tunes WebSocket delivery.
type Notifier struct {
	AllowedOrigins          []string      `yaml:"allowed_origins" env:"ALLOWED_ORIGINS"`
	MaxSubscriptionsPerConn int           `yaml:"max_subscriptions_per_conn" env:"MAX_SUBSCRIPTIONS_PER_CONN"`
	PingInterval            time.Duration `yaml:"ping_interval" env:"PING_INTERVAL"`
	RecheckInterval         time.Duration `yaml:"recheck_interval" env:"RECHECK_INTERVAL"`
}

// Log configures slog.
type Log struct {
	Level  string `yaml:"level" env:"LEVEL"`
	Format string `yaml:"format" env:"FORMAT"`
}

// Development secrets of the embedded default. Never valid in production:
// Validate refuses them unless Redis is embedded.
const (
	DevJWTSecret     = "flashsale-dev-only-jwt-secret-do-not-use-in-production"
	DevAdminToken    = "dev-admin-token"
	DevWebhookSecret = "flashsale-dev-only-webhook-secret-do-not-use-in-production"
)

// Default returns the built-in configuration: everything in one process with
// no external services. configs/flashsale.yaml documents the same values.
func Default() Config {
	return Config{
		HTTP: HTTP{Addr: "127.0.0.1:8080", ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second, MaxBodyBytes: 4096, ShutdownTimeout: 10 * time.Second},
		Auth:     Auth{JWTSecret: DevJWTSecret, JWTLeeway: 30 * time.Second, AdminToken: DevAdminToken, Dev: true},
		Redis:    Redis{Mode: "embedded", PoolSize: 64},
		Database: Database{Driver: "sqlite", DSN: ":memory:"},
		Queue: Queue{Driver: "redisstream", Topic: "flashsale-purchases", ExpiryTopic: "flashsale-expiry", Partitions: 8, BatchSize: 128, Group: "workers", LeaseTTL: 10 * time.Second,
			RocketMQ: RocketMQ{NameServers: []string{"127.0.0.1:9876"}, ProducerGroup: "flashsale-gateway",
				Retries: 2, MaxReconsumeTimes: 1000, SuspendTime: time.Second, LogLevel: "warn"}},
		Gateway: Gateway{RateLimits: model.RateLimits{UserRate: 5, UserBurst: 10}, PublishTimeout: 2 * time.Second,
			CampaignCacheTTL: 2 * time.Second, SoldOutRecheck: time.Second, AdmitBatch: 256, AdmitConcurrency: 2, AdmitLinger: 500 * time.Microsecond,
			BreakerFailures: 3, BreakerOpenFor: 2 * time.Second},
		Worker:   Worker{MaxAttempts: 10},
		Payment:  Payment{Provider: "fake", WebhookSecret: DevWebhookSecret, WebhookTolerance: 5 * time.Minute, Grace: 30 * time.Second, SweepInterval: 5 * time.Second},
		Notifier: Notifier{MaxSubscriptionsPerConn: 256, PingInterval: 20 * time.Second, RecheckInterval: time.Second},
		Log:      Log{Level: "info", Format: "text"},
	}
}

// Load returns the defaults overlaid with the YAML file at path (if path is
// not empty) and then the environment (lookup, usually os.LookupEnv based).
func Load(path string, environ map[string]string) (Config, error) {
	cfg := Default()
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)                                               // a misspelt key fails loudly instead of being ignored
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) { // io.EOF: an empty file keeps the defaults
			return Config{}, fmt.Errorf("config %s: %w", path, err)
		}
	}
	opts := env.Options{Prefix: "FLASHSALE_", Environment: environ}
	if err := env.ParseWithOptions(&cfg, opts); err != nil {
		return Config{}, fmt.Errorf("config environment%s: %w", envNames(&cfg, opts, err), err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate reports the first invalid key by its YAML path.
func (c Config) Validate() error {
	bad := func(key, why string) error { return fmt.Errorf("config: %s: %s", key, why) }
	var rocketMQErr error
	if c.Queue.Driver == "rocketmq" {
		rocketMQErr = c.validateRocketMQ()
	}
	switch {
	case c.HTTP.Addr == "":
		return bad("http.addr", "is required")
	case c.HTTP.MaxBodyBytes < 256 || c.HTTP.MaxBodyBytes > 1<<20:
		return bad("http.max_body_bytes", "must be between 256 and 1048576")
	case c.HTTP.ReadHeaderTimeout <= 0 || c.HTTP.ReadTimeout <= 0 || c.HTTP.WriteTimeout <= 0 || c.HTTP.IdleTimeout <= 0:
		return bad("http.*_timeout", "every timeout must be positive")
	case c.HTTP.ShutdownTimeout <= 0:
		return bad("http.shutdown_timeout", "must be positive")
	case len(c.Auth.JWTSecret) < 32:
		return bad("auth.jwt_secret", "must be at least 32 bytes")
	case len(c.Auth.AdminToken) < 8:
		return bad("auth.admin_token", "must be at least 8 bytes")
	case c.Auth.JWTLeeway < 0 || c.Auth.JWTLeeway > 5*time.Minute:
		return bad("auth.jwt_leeway", "must be between 0 and 5m")
	case c.Redis.Mode != "embedded" && c.Redis.Mode != "server":
		return bad("redis.mode", `must be "embedded" or "server"`)
	case c.Redis.Mode == "server" && c.Redis.Addr == "":
		return bad("redis.addr", `is required when redis.mode is "server"`)
	case c.Redis.Mode == "server" && (c.Auth.JWTSecret == DevJWTSecret || c.Auth.AdminToken == DevAdminToken):
		return bad("auth", "the development secrets are only allowed with redis.mode embedded")
	case c.Redis.PoolSize < 1:
		return bad("redis.pool_size", "must be at least 1")
	case c.Database.Driver != "sqlite" && c.Database.Driver != "mysql":
		return bad("database.driver", `must be "sqlite" or "mysql"`)
	case c.Database.DSN == "":
		return bad("database.dsn", "is required")
	case c.Queue.Driver != "redisstream" && c.Queue.Driver != "memqueue" && c.Queue.Driver != "rocketmq":
		return bad("queue.driver", `must be "redisstream", "memqueue" or "rocketmq"`)
	case c.Queue.Topic == "" || strings.ContainsAny(c.Queue.Topic, "{} "):
		return bad("queue.topic", "must be non-empty without braces or spaces")
	case c.Queue.ExpiryTopic == "" || strings.ContainsAny(c.Queue.ExpiryTopic, "{} ") || c.Queue.ExpiryTopic == c.Queue.Topic:
		return bad("queue.expiry_topic", "must be non-empty without braces or spaces, and not queue.topic")
	case c.Queue.Partitions < 1 || c.Queue.Partitions > 1024:
		return bad("queue.partitions", "must be between 1 and 1024")
	case c.Queue.BatchSize < 1 || c.Queue.BatchSize > 4096:
		return bad("queue.batch_size", "must be between 1 and 4096")
	case c.Queue.Group == "":
		return bad("queue.group", "is required")
	case rocketMQErr != nil:
		return rocketMQErr
	case c.Queue.LeaseTTL < 500*time.Millisecond || c.Queue.LeaseTTL > 5*time.Minute:
		return bad("queue.lease_ttl", "must be between 500ms and 5m")
	case c.Gateway.UserRate < 0 || c.Gateway.CampaignRate < 0 || c.Gateway.UserBurst < 0 || c.Gateway.CampaignBurst < 0 ||
		c.Gateway.IPRate < 0 || c.Gateway.IPBurst < 0:
		return bad("gateway.*_rate", "rates and bursts must not be negative")
	case c.Gateway.PublishTimeout <= 0:
		return bad("gateway.publish_timeout", "must be positive")
	case c.Gateway.CampaignCacheTTL <= 0:
		return bad("gateway.campaign_cache_ttl", "must be positive")
	case c.Gateway.SoldOutRecheck <= 0:
		return bad("gateway.soldout_recheck", "must be positive")
	case c.Gateway.AdmitBatch < 1 || c.Gateway.AdmitBatch > 4096:
		return bad("gateway.admit_batch", "must be between 1 and 4096")
	case c.Gateway.AdmitConcurrency < 1 || c.Gateway.AdmitConcurrency > 64:
		return bad("gateway.admit_concurrency", "must be between 1 and 64")
	case c.Gateway.AdmitLinger < 0 || c.Gateway.AdmitLinger > 10*time.Millisecond:
		return bad("gateway.admit_linger", "must be between 0 (off) and 10ms")
	case c.Gateway.BreakerFailures < 1:
		return bad("gateway.breaker_failures", "must be at least 1")
	case c.Gateway.BreakerOpenFor <= 0:
		return bad("gateway.breaker_open_for", "must be positive")
	case c.Worker.MaxAttempts < 1:
		return bad("worker.max_attempts", "must be at least 1")
	case c.Payment.Provider != "fake":
		return bad("payment.provider", `must be "fake"`)
	case len(c.Payment.WebhookSecret) < 32:
		return bad("payment.webhook_secret", "must be at least 32 bytes")
	case c.Redis.Mode == "server" && c.Payment.WebhookSecret == DevWebhookSecret:
		return bad("payment.webhook_secret", "the development secret is only allowed with redis.mode embedded")
	case c.Payment.WebhookTolerance < time.Second || c.Payment.WebhookTolerance > time.Hour:
		return bad("payment.webhook_tolerance", "must be between 1s and 1h")
	case c.Payment.Grace <= 0 || c.Payment.Grace > time.Hour:
		return bad("payment.grace", "must be positive, at most 1h")
	case c.Payment.SweepInterval < 10*time.Millisecond || c.Payment.SweepInterval > time.Hour:
		return bad("payment.sweep_interval", "must be between 10ms and 1h")
	case c.Notifier.MaxSubscriptionsPerConn < 1:
		return bad("notifier.max_subscriptions_per_conn", "must be at least 1")
	case c.Notifier.PingInterval <= 0 || c.Notifier.RecheckInterval <= 0:
		return bad("notifier.*_interval", "must be positive")
	case c.Log.Level != "debug" && c.Log.Level != "info" && c.Log.Level != "warn" && c.Log.Level != "error":
		return bad("log.level", "must be debug, info, warn or error")
	case c.Log.Format != "text" && c.Log.Format != "json":
		return bad("log.format", `must be "text" or "json"`)
	}
	return nil
}

// ExpiryGroupSuffix names, after queue.group, the RocketMQ consumer group of
// the expiry topic: a RocketMQ group's members must all subscribe to the
// same topics, or the broker hands queues to members that never read them.
const ExpiryGroupSuffix = "-expiry"

// rocketMQName is what RocketMQ accepts as a topic or group name.
var rocketMQName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,127}$`)

// validateRocketMQ checks the keys that matter when queue.driver is
// rocketmq.
func (c Config) validateRocketMQ() error {
	bad := func(key, why string) error { return fmt.Errorf("config: %s: %s", key, why) }
	r := c.Queue.RocketMQ
	switch {
	case !rocketMQName.MatchString(c.Queue.Topic):
		return bad("queue.topic", "must be 1-127 of [a-zA-Z0-9_-] with the rocketmq driver")
	case !rocketMQName.MatchString(c.Queue.ExpiryTopic):
		return bad("queue.expiry_topic", "must be 1-127 of [a-zA-Z0-9_-] with the rocketmq driver")
	case !rocketMQName.MatchString(c.Queue.Group + ExpiryGroupSuffix):
		return bad("queue.group", "must be 1-120 of [a-zA-Z0-9_-] with the rocketmq driver")
	case c.Queue.BatchSize > 1024:
		return bad("queue.batch_size", "must be at most 1024 with the rocketmq driver")
	case len(r.NameServers) == 0:
		return bad("queue.rocketmq.name_servers", "is required with the rocketmq driver")
	case !rocketMQName.MatchString(r.ProducerGroup):
		return bad("queue.rocketmq.producer_group", "must be 1-127 of [a-zA-Z0-9_-]")
	case r.Retries < 0 || r.Retries > 16:
		return bad("queue.rocketmq.retries", "must be between 0 and 16")
	case r.MaxReconsumeTimes < c.Worker.MaxAttempts || r.MaxReconsumeTimes > 1000:
		return bad("queue.rocketmq.max_reconsume_times", fmt.Sprintf("must be between worker.max_attempts (%d) and 1000, "+
			"so the worker gives a failing request its final result before the broker dead-letters it", c.Worker.MaxAttempts))
	case r.SuspendTime < 10*time.Millisecond || r.SuspendTime > 30*time.Second:
		return bad("queue.rocketmq.suspend_time", "must be between 10ms and 30s")
	case r.LogLevel != "debug" && r.LogLevel != "info" && r.LogLevel != "warn" && r.LogLevel != "error":
		return bad("queue.rocketmq.log_level", "must be debug, info, warn or error")
	}
	for _, a := range r.NameServers {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			return bad("queue.rocketmq.name_servers", fmt.Sprintf("%q is not host:port", a))
		}
	}
	return nil
}

// Masked returns a copy safe to log: secrets and DSN passwords hidden.
func (c Config) Masked() Config {
	mask := func(s string) string {
		if s == "" {
			return ""
		}
		return "***"
	}
	c.Auth.JWTSecret = mask(c.Auth.JWTSecret)
	c.Auth.AdminToken = mask(c.Auth.AdminToken)
	c.Payment.WebhookSecret = mask(c.Payment.WebhookSecret)
	c.Redis.Password = mask(c.Redis.Password)
	c.Database.DSN = maskDSN(c.Database.DSN)
	return c
}

// maskDSN hides the password of "user:password@tcp(...)/db".
func maskDSN(dsn string) string {
	at := strings.LastIndex(dsn, "@")
	colon := strings.Index(dsn, ":")
	if at < 0 || colon < 0 || colon > at {
		return dsn
	}
	return dsn[:colon+1] + "***" + dsn[at:]
}

// envNames names the set variables behind a parse error, since the env
// library reports Go field names only.
func envNames(cfg *Config, opts env.Options, err error) string {
	params, perr := env.GetFieldParamsWithOptions(cfg, opts)
	if perr != nil {
		return ""
	}
	var names []string
	for _, p := range params {
		if _, set := opts.Environment[p.Key]; !set {
			continue
		}
		field := strings.ReplaceAll(p.OwnKey, "_", "")
		if strings.Contains(strings.ToLower(err.Error()), `"`+strings.ToLower(field)+`"`) {
			names = append(names, p.Key)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " " + strings.Join(names, ", ")
}
