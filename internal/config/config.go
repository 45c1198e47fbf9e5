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
	"net/url"
	"os"
	"regexp"
	"slices"
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
	// Degrade is what a Redis that does not answer does to the sale:
	// DegradeMySQL decides purchases in MySQL until Redis answers again
	// (the degraded mode), DegradeRefuse answers them 503.
	Degrade string `yaml:"degrade" env:"DEGRADE"`
}

// The values of Config.Degrade.
const (
	DegradeMySQL  = "mysql"
	DegradeRefuse = "refuse"
)

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
	// MaxConns bounds the connections the main listener keeps open,
	// WebSockets included; 0 takes the process's descriptor limit less
	// FDReserve (at most a quarter of the limit), kept for the admin
	// listener, the Redis and MySQL pools and files. At the bound the
	// connection idle longest is closed for room, else one that has not
	// sent its first request within a second, else the new one is refused
	// (503).
	MaxConns  int `yaml:"max_conns" env:"MAX_CONNS"`
	FDReserve int `yaml:"fd_reserve" env:"FD_RESERVE"`
	// MaxConnsPerIP bounds the connections one client address (the TCP
	// peer; TrustedProxies are exempt) keeps open on the main listener
	// (429 beyond it); 0 takes twice notifier.max_conns_per_ip: a shopper
	// holding a WebSocket may hold a plain connection too.
	MaxConnsPerIP int `yaml:"max_conns_per_ip" env:"MAX_CONNS_PER_IP"`
	// DrainDelay is how long a gateway or notifier keeps serving, with
	// /readyz answering 503, between SIGTERM and closing its listeners, so
	// a load balancer stops sending it requests first.
	DrainDelay time.Duration `yaml:"drain_delay" env:"DRAIN_DELAY"`
}

// Auth holds the secrets. They are masked whenever the config is logged.
type Auth struct {
	JWTSecret  string        `yaml:"jwt_secret" env:"JWT_SECRET"`
	JWTLeeway  time.Duration `yaml:"jwt_leeway" env:"JWT_LEEWAY"`
	AdminToken string        `yaml:"admin_token" env:"ADMIN_TOKEN"`
	// MaxTokenLifetime bounds how far ahead a shopper token's exp may be:
	// a token valid for longer is refused (401), so a stolen one is good
	// for at most that long.
	MaxTokenLifetime time.Duration `yaml:"max_token_lifetime" env:"MAX_TOKEN_LIFETIME"`
	// AdminFailuresPerMinute is how many wrong admin tokens a client IP may
	// present in a minute; then it gets 429 until the minute is over.
	AdminFailuresPerMinute int `yaml:"admin_failures_per_minute" env:"ADMIN_FAILURES_PER_MINUTE"`
	// Dev is the embedded default's development mode: serve prints the
	// development admin token and a shopper token at start. Validate refuses
	// it, like the development secrets themselves, with a real Redis or
	// MySQL.
	Dev bool `yaml:"dev" env:"DEV"`
	// Provider verifies shopper tokens an identity provider signs.
	Provider `yaml:",inline"`
}

// Provider configures shopper tokens from an identity provider (Auth0,
// Okta, Keycloak, Cognito…): verified against its JWKS URL, their iss and
// aud checked. Without jwks_url shopper tokens are HS256 with jwt_secret.
type Provider struct {
	// JWKSURL is the provider's key set, e.g.
	// https://TENANT.auth0.com/.well-known/jwks.json.
	JWKSURL string `yaml:"jwks_url" env:"JWKS_URL"`
	// Issuer and Audience must be every token's iss and among its aud;
	// both are required with jwks_url (a token for another API of the same
	// provider must not buy here).
	Issuer   string `yaml:"issuer" env:"ISSUER"`
	Audience string `yaml:"audience" env:"AUDIENCE"`
	// Algorithms accepted: RS256 and ES256 by default with jwks_url, HS256
	// alone without. Adding HS256 next to a provider's lets load tests mint
	// tokens with jwt_secret.
	Algorithms []string `yaml:"algorithms" env:"ALGORITHMS"`
	// JWKSRefresh is how often the key set is fetched again (rotated keys
	// come in, withdrawn ones stop working within it).
	JWKSRefresh time.Duration `yaml:"jwks_refresh" env:"JWKS_REFRESH"`
	// JWKSUnknownKID is the least time between two fetches caused by a
	// token whose key id the set lacks.
	JWKSUnknownKID time.Duration `yaml:"jwks_unknown_kid" env:"JWKS_UNKNOWN_KID"`
}

// supportedAlgorithms are the JWT algorithms auth.algorithms may name
// (internal/auth.SupportedAlgorithms).
var supportedAlgorithms = []string{"HS256", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// validate checks the provider settings, nil when they are fine.
func (p Provider) validate() error {
	bad := func(key, why string) error { return fmt.Errorf("config: auth.%s: %s", key, why) }
	for _, a := range p.Algorithms {
		if !slices.Contains(supportedAlgorithms, a) {
			return bad("algorithms", fmt.Sprintf("%q is not one of %s", a, strings.Join(supportedAlgorithms, ", ")))
		}
	}
	if p.JWKSURL == "" {
		if len(p.Algorithms) > 0 && !slices.Equal(p.Algorithms, []string{"HS256"}) {
			return bad("algorithms", "only HS256 without auth.jwks_url")
		}
		return nil
	}
	u, err := url.Parse(p.JWKSURL)
	switch {
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
		return bad("jwks_url", "must be an http(s) URL")
	case p.Issuer == "":
		return bad("issuer", "is required with auth.jwks_url (the provider's iss, e.g. https://TENANT.auth0.com/)")
	case p.Audience == "":
		return bad("audience", "is required with auth.jwks_url (this API's identifier at the provider)")
	case p.JWKSRefresh < time.Minute || p.JWKSRefresh > 24*time.Hour:
		return bad("jwks_refresh", "must be between 1m and 24h")
	case p.JWKSUnknownKID < time.Second || p.JWKSUnknownKID > time.Hour:
		return bad("jwks_unknown_kid", "must be between 1s and 1h")
	}
	return nil
}

// Redis selects a Redis server: mode "embedded" runs an in-process Redis,
// "server" one Redis at Addr, "cluster" a Redis Cluster found from Addrs.
// It configures the stock's Redis (redis) and, when its mode is set, the
// queue's own (queue.redis), which has no key_retention.
type Redis struct {
	Mode string `yaml:"mode" env:"MODE"`
	Addr string `yaml:"addr" env:"ADDR"`
	// Addrs are a few of the cluster's nodes (mode cluster); the client
	// learns the others and the slot map from them.
	Addrs []string `yaml:"addrs" env:"ADDRS"`
	// ClusterReloadInterval is how often the cluster client re-reads the
	// slot map. go-redis re-reads it on MOVED, but not when a master stops
	// answering: until this reload it keeps sending to the dead master
	// instead of its promoted replica (go-redis's default is 60 s).
	ClusterReloadInterval time.Duration `yaml:"cluster_reload_interval" env:"CLUSTER_RELOAD_INTERVAL"`
	Password              string        `yaml:"password" env:"PASSWORD"`
	DB                    int           `yaml:"db" env:"DB"`
	PoolSize              int           `yaml:"pool_size" env:"POOL_SIZE"`
	// KeyRetention is how long a campaign's keys outlive its sale: they
	// expire this long after its end plus its payment window.
	KeyRetention time.Duration `yaml:"key_retention" env:"KEY_RETENTION"`
	// MinReplicasAck is how many replicas must hold a deduction's writes
	// (WAIT) before its results are published and its batch acknowledged,
	// and a purchase's queue entry (queue.driver redisstream, in this
	// Redis unless queue.redis is set) before the shopper is told it is
	// queued; 0 does not wait. ReplicaAckTimeout
	// bounds the wait: fewer replicas by then hands the batch back, to be
	// decided again, and keeps the purchase as of unknown publish outcome.
	MinReplicasAck    int           `yaml:"min_replicas_ack" env:"MIN_REPLICAS_ACK"`
	ReplicaAckTimeout time.Duration `yaml:"replica_ack_timeout" env:"REPLICA_ACK_TIMEOUT"`
	// Timeout bounds every Redis call but those that wait by design (a
	// replica WAIT, a blocking queue read): past it the call fails, and a
	// request that needed it is answered 503 unavailable with Retry-After.
	// It is what a frozen Redis costs a shopper, so it is short; a call
	// that timed out may still run when Redis wakes up, which every
	// request path allows for (docs/RELIABILITY.md).
	Timeout time.Duration `yaml:"timeout" env:"TIMEOUT"`
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
	// Redis puts the redisstream driver's streams in a Redis of their own;
	// mode "" keeps them in the stock's (redis). A queue that outlives the
	// stock's Redis keeps the requests it accepted when that Redis is lost.
	// Its min_replicas_ack and replica_ack_timeout then cover the queue's
	// entries, redis's only the stock.
	Redis Redis `yaml:"redis" envPrefix:"REDIS_"`
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
	CachedCampaigns  int           `yaml:"cached_campaigns" env:"CACHED_CAMPAIGNS"`
	CachedUnknownIDs int           `yaml:"cached_unknown_ids" env:"CACHED_UNKNOWN_IDS"`
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
	// MaxQueueDelay is the longest a stored message can take to reach a
	// worker while workers run. An admitted request still queued this
	// long after its admission, with a request numbered after it decided,
	// or this long after its sale ended (and after its last resume either
	// way), was not enqueued (a publish of unknown outcome whose message
	// was lost, a gateway that died before publishing): the workers'
	// not-enqueued sweep rejects it (not_enqueued). Only requests that
	// nothing admitted later passes (a sold-out sale, its last requests)
	// wait for it; the others end sooner, by NotEnqueuedGrace. Too short,
	// and a message that was only slow is rejected (when it arrives it
	// finds the final result and takes nothing); too long, and its shopper
	// waits that long for the answer. The default, 5m, covers several times over
	// the slowest hand-overs measured or documented: a dead RocketMQ
	// consumer's queue lock (60 s) plus a rebalance (20 s), a broker
	// restart's resubscription (30 s), a redisstream lease (queue.lease_ttl)
	// and a sale's backlog at the workers' throughput. Paused campaigns do
	// not count against it (their requests are held, not rejected).
	MaxQueueDelay time.Duration `yaml:"max_queue_delay" env:"MAX_QUEUE_DELAY"`
	// NotEnqueuedGrace is the longest from an admission to its message
	// stored in the queue: admit.lua's call and the publish are each
	// bounded by gateway.publish_timeout, so it must exceed twice that.
	// Once a worker decided a request admitted this long after a queued
	// one, the queued one's message, had it been stored, came before and
	// was decided: the not-enqueued sweep rejects it (not_enqueued) within
	// seconds instead of max_queue_delay. Too short, and a message
	// overtaken by a later one is rejected (it then takes nothing). The
	// sweep runs every quarter of it, at most every second.
	NotEnqueuedGrace time.Duration `yaml:"not_enqueued_grace" env:"NOT_ENQUEUED_GRACE"`
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

	// Abuse limits (docs/RELIABILITY.md, "Limits"). MaxConns 0 derives the
	// process's WebSocket budget from its descriptor limit: RLIMIT_NOFILE
	// minus FDReserve (at most half the limit), kept for plain HTTP, health
	// checks and the clients' pools.
	MaxConnsPerUser int `yaml:"max_conns_per_user" env:"MAX_CONNS_PER_USER"`
	MaxConnsPerIP   int `yaml:"max_conns_per_ip" env:"MAX_CONNS_PER_IP"`
	MaxConns        int `yaml:"max_conns" env:"MAX_CONNS"`
	FDReserve       int `yaml:"fd_reserve" env:"FD_RESERVE"`
	PollRate        int `yaml:"poll_rate" env:"POLL_RATE"`
	PollBurst       int `yaml:"poll_burst" env:"POLL_BURST"`
	SubscribeRate   int `yaml:"subscribe_rate" env:"SUBSCRIBE_RATE"`
	SubscribeBurst  int `yaml:"subscribe_burst" env:"SUBSCRIBE_BURST"`
}

// Log configures slog.
type Log struct {
	Level  string `yaml:"level" env:"LEVEL"`
	Format string `yaml:"format" env:"FORMAT"`
}

// Development secrets of the embedded default. Never valid in production:
// Validate refuses them with a real Redis or MySQL.
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
			WriteTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second, MaxBodyBytes: 4096, ShutdownTimeout: 10 * time.Second, FDReserve: 128},
		Auth: Auth{JWTSecret: DevJWTSecret, JWTLeeway: 30 * time.Second, MaxTokenLifetime: 7 * 24 * time.Hour, AdminToken: DevAdminToken, AdminFailuresPerMinute: 10, Dev: true,
			Provider: Provider{JWKSRefresh: time.Hour, JWKSUnknownKID: time.Minute}},
		Redis: Redis{Mode: "embedded", PoolSize: 64, ClusterReloadInterval: 2 * time.Second, KeyRetention: 7 * 24 * time.Hour,
			ReplicaAckTimeout: time.Second, Timeout: time.Second},
		Database: Database{Driver: "sqlite", DSN: ":memory:"},
		Queue: Queue{Driver: "redisstream", Topic: "flashsale-purchases", ExpiryTopic: "flashsale-expiry", Partitions: 8, BatchSize: 128, Group: "workers", LeaseTTL: 10 * time.Second,
			Redis: Redis{PoolSize: 64, ClusterReloadInterval: 2 * time.Second, ReplicaAckTimeout: time.Second, Timeout: time.Second},
			RocketMQ: RocketMQ{NameServers: []string{"127.0.0.1:9876"}, ProducerGroup: "flashsale-gateway",
				Retries: 2, MaxReconsumeTimes: 1000, SuspendTime: time.Second, LogLevel: "warn"}},
		Gateway: Gateway{RateLimits: model.RateLimits{UserRate: 5, UserBurst: 10}, PublishTimeout: 2 * time.Second,
			CampaignCacheTTL: 2 * time.Second, CachedCampaigns: 10_000, CachedUnknownIDs: 1024, SoldOutRecheck: time.Second, AdmitBatch: 256, AdmitConcurrency: 2, AdmitLinger: 500 * time.Microsecond,
			BreakerFailures: 3, BreakerOpenFor: 2 * time.Second},
		Worker:   Worker{MaxAttempts: 10, MaxQueueDelay: 5 * time.Minute, NotEnqueuedGrace: 5 * time.Second},
		Payment:  Payment{Provider: "fake", WebhookSecret: DevWebhookSecret, WebhookTolerance: 5 * time.Minute, Grace: 30 * time.Second, SweepInterval: 5 * time.Second},
		Notifier: Notifier{MaxSubscriptionsPerConn: 256, PingInterval: 20 * time.Second, RecheckInterval: time.Second, MaxConnsPerUser: 8, MaxConnsPerIP: 256, FDReserve: 256, PollRate: 5, PollBurst: 20, SubscribeRate: 20, SubscribeBurst: 256},
		Log:      Log{Level: "info", Format: "text"},
		Degrade:  DegradeMySQL,
	}
}

// EnvPrefix starts every environment variable that overrides a config key.
const EnvPrefix = "FLASHSALE_"

// TestEnvPrefix starts the variables the project's tests read
// (FLASHSALE_TEST_REDIS_ADDR, …; see internal/testenv). They share
// EnvPrefix but name no config key, and a test's child processes inherit
// them, so Load lets them pass; every other FLASHSALE_ variable must name a
// key.
const TestEnvPrefix = EnvPrefix + "TEST_"

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
	opts := env.Options{Prefix: EnvPrefix, Environment: environ}
	if err := unknownEnv(&cfg, opts); err != nil {
		return Config{}, err
	}
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
	case c.HTTP.MaxConns < 0 || c.HTTP.FDReserve < 0 || c.HTTP.MaxConnsPerIP < 0:
		return bad("http.max_conns", "max_conns, fd_reserve and max_conns_per_ip must not be negative")
	case c.HTTP.DrainDelay < 0 || c.HTTP.DrainDelay > 5*time.Minute:
		return bad("http.drain_delay", "must be between 0 (off) and 5m")
	case len(c.Auth.JWTSecret) < 32:
		return bad("auth.jwt_secret", "must be at least 32 bytes")
	case len(c.Auth.AdminToken) < 8:
		return bad("auth.admin_token", "must be at least 8 bytes")
	case c.Auth.AdminFailuresPerMinute < 1 || c.Auth.AdminFailuresPerMinute > 1000:
		return bad("auth.admin_failures_per_minute", "must be between 1 and 1000")
	case c.Auth.MaxTokenLifetime < time.Hour || c.Auth.MaxTokenLifetime > 365*24*time.Hour:
		return bad("auth.max_token_lifetime", "must be between 1h and 8760h")
	case c.Auth.JWTLeeway < 0 || c.Auth.JWTLeeway > 5*time.Minute:
		return bad("auth.jwt_leeway", "must be between 0 and 5m")
	case c.Auth.Provider.validate() != nil:
		return c.Auth.Provider.validate()
	case c.Redis.validate("redis") != nil:
		return c.Redis.validate("redis")
	case c.Degrade != DegradeMySQL && c.Degrade != DegradeRefuse:
		return bad("degrade", "must be mysql or refuse")
	case c.Auth.Dev && c.realServices():
		return bad("auth.dev", "development mode is only allowed with redis.mode embedded and database.driver sqlite")
	case c.realServices() && (c.Auth.JWTSecret == DevJWTSecret || c.Auth.AdminToken == DevAdminToken):
		return bad("auth", "the development secrets are only allowed with redis.mode embedded and database.driver sqlite")
	case c.Redis.KeyRetention < time.Hour || c.Redis.KeyRetention > 365*24*time.Hour:
		return bad("redis.key_retention", "must be between 1h and 8760h (a year)")
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
	case c.Queue.validateRedis() != nil:
		return c.Queue.validateRedis()
	case c.Queue.LeaseTTL < 500*time.Millisecond || c.Queue.LeaseTTL > 5*time.Minute:
		return bad("queue.lease_ttl", "must be between 500ms and 5m")
	case c.Gateway.UserRate < 0 || c.Gateway.CampaignRate < 0 || c.Gateway.UserBurst < 0 || c.Gateway.CampaignBurst < 0 ||
		c.Gateway.IPRate < 0 || c.Gateway.IPBurst < 0:
		return bad("gateway.*_rate", "rates and bursts must not be negative")
	case c.Gateway.PublishTimeout <= 0:
		return bad("gateway.publish_timeout", "must be positive")
	case c.Gateway.CampaignCacheTTL <= 0:
		return bad("gateway.campaign_cache_ttl", "must be positive")
	case c.Gateway.CachedCampaigns < 1 || c.Gateway.CachedCampaigns > 1_000_000:
		return bad("gateway.cached_campaigns", "must be between 1 and 1000000")
	case c.Gateway.CachedUnknownIDs < 1 || c.Gateway.CachedUnknownIDs > 1_000_000:
		return bad("gateway.cached_unknown_ids", "must be between 1 and 1000000")
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
	case c.Worker.MaxQueueDelay < time.Second || c.Worker.MaxQueueDelay > 24*time.Hour:
		return bad("worker.max_queue_delay", "must be between 1s and 24h")
	case c.Worker.NotEnqueuedGrace <= 2*c.Gateway.PublishTimeout || c.Worker.NotEnqueuedGrace > c.Worker.MaxQueueDelay:
		return bad("worker.not_enqueued_grace", "must exceed twice gateway.publish_timeout, and be at most worker.max_queue_delay")
	case c.Payment.Provider != "fake":
		return bad("payment.provider", `must be "fake"`)
	case len(c.Payment.WebhookSecret) < 32:
		return bad("payment.webhook_secret", "must be at least 32 bytes")
	case c.realServices() && c.Payment.WebhookSecret == DevWebhookSecret:
		return bad("payment.webhook_secret", "the development secret is only allowed with redis.mode embedded and database.driver sqlite")
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
	case c.Notifier.MaxConnsPerUser < 1 || c.Notifier.MaxConnsPerIP < 1:
		return bad("notifier.max_conns_per_*", "must be at least 1")
	case c.Notifier.MaxConns < 0 || c.Notifier.FDReserve < 0:
		return bad("notifier.max_conns", "max_conns (0: derived) and fd_reserve must not be negative")
	case c.Notifier.PollRate < 1 || c.Notifier.PollBurst < 1 || c.Notifier.SubscribeRate < 1 || c.Notifier.SubscribeBurst < 1:
		return bad("notifier.*_rate", "poll and subscribe rates and bursts must be at least 1")
	case c.Log.Level != "debug" && c.Log.Level != "info" && c.Log.Level != "warn" && c.Log.Level != "error":
		return bad("log.level", "must be debug, info, warn or error")
	case c.Log.Format != "text" && c.Log.Format != "json":
		return bad("log.format", `must be "text" or "json"`)
	}
	return nil
}

// realServices reports whether the config reaches a real Redis or MySQL,
// where the development mode and secrets are refused.
func (c Config) realServices() bool {
	return c.Redis.Mode != "embedded" || c.Database.Driver == "mysql" || c.Queue.Redis.Mode != ""
}

// validate checks the Redis settings under key (redis, queue.redis): the
// mode and the addresses it needs, the pool and the timeouts. Each mode
// reads its own key (addr, addrs) and ignores the other, so
// FLASHSALE_REDIS_MODE alone switches a file that names both.
func (r Redis) validate(key string) error {
	bad := func(sub, why string) error { return fmt.Errorf("config: %s.%s: %s", key, sub, why) }
	switch r.Mode {
	case "embedded":
	case "server":
		if r.Addr == "" {
			return bad("addr", fmt.Sprintf(`is required when %s.mode is "server"`, key))
		}
	case "cluster":
		switch {
		case len(r.Addrs) == 0:
			return bad("addrs", fmt.Sprintf(`is required when %s.mode is "cluster" (a few of its nodes, host:port)`, key))
		case r.DB != 0:
			return bad("db", fmt.Sprintf("must be 0 with %s.mode cluster (a cluster has only database 0)", key))
		case r.ClusterReloadInterval < 100*time.Millisecond || r.ClusterReloadInterval > time.Minute:
			return bad("cluster_reload_interval", "must be between 100ms and 1m")
		}
		for _, a := range r.Addrs {
			if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
				return bad("addrs", fmt.Sprintf("%q is not host:port", a))
			}
		}
	default:
		return bad("mode", `must be "embedded", "server" or "cluster"`)
	}
	switch {
	case r.PoolSize < 1:
		return bad("pool_size", "must be at least 1")
	case r.MinReplicasAck < 0:
		return bad("min_replicas_ack", "must not be negative")
	case r.MinReplicasAck > 0 && r.Mode == "embedded":
		return bad("min_replicas_ack", fmt.Sprintf("needs a Redis with replicas, not %s.mode embedded", key))
	case r.ReplicaAckTimeout <= 0 || r.ReplicaAckTimeout > time.Minute:
		return bad("replica_ack_timeout", "must be between 1ms and 1m")
	case r.Timeout < 10*time.Millisecond || r.Timeout > time.Minute:
		return bad("timeout", "must be between 10ms and 1m")
	}
	return nil
}

// validateRedis checks queue.redis: unset, or a server or cluster of the
// redisstream driver's own.
func (q Queue) validateRedis() error {
	bad := func(key, why string) error { return fmt.Errorf("config: queue.redis.%s: %s", key, why) }
	switch {
	case q.Redis.Mode == "":
		return nil
	case q.Driver != "redisstream":
		return bad("mode", "is only for queue.driver redisstream")
	case q.Redis.Mode == "embedded":
		return bad("mode", `must be "" (the stock's Redis), "server" or "cluster": an embedded Redis would die with the process`)
	case q.Redis.KeyRetention != 0:
		return bad("key_retention", "is redis.key_retention's alone: the queue deletes its entries once acknowledged, it never expires them")
	}
	return q.Redis.validate("queue.redis")
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
	c.Queue.Redis.Password = mask(c.Queue.Redis.Password)
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

// unknownEnv refuses a FLASHSALE_ variable that names no config key (other
// than TestEnvPrefix's): a misspelt override would otherwise be ignored
// without a word, and the server would run on the value it was meant to
// replace. The error names the closest key.
func unknownEnv(cfg *Config, opts env.Options) error {
	params, err := env.GetFieldParamsWithOptions(cfg, opts)
	if err != nil {
		return fmt.Errorf("config environment: %w", err)
	}
	known := make([]string, 0, len(params))
	for _, p := range params {
		known = append(known, p.Key)
	}
	var unknown []string
	for name := range opts.Environment {
		if strings.HasPrefix(name, opts.Prefix) && !strings.HasPrefix(name, TestEnvPrefix) && !slices.Contains(known, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	for i, name := range unknown {
		if match := closest(name, known); match != "" {
			unknown[i] += " (did you mean " + match + "?)"
		}
	}
	return fmt.Errorf("config environment: unknown variable %s: every %s* variable must name a config key (%s* excepted)",
		strings.Join(unknown, ", "), opts.Prefix, TestEnvPrefix)
}

// closest returns the name among known nearest to name, if it is a few
// edits away (a typo), else "".
func closest(name string, known []string) string {
	best, bestDist := "", 4 // more edits than this is another name, not a typo
	for _, k := range known {
		if d := editDistance(strings.ToUpper(name), k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance counts the insertions, deletions, substitutions and swaps of
// adjacent letters that turn a into b (optimal string alignment).
func editDistance(a, b string) int {
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
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
