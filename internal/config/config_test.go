package config

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

func TestEmbeddedYAMLMatchesDefaults(t *testing.T) {
	got, err := Load(filepath.Join("..", "..", "configs", "flashsale.yaml"), map[string]string{})
	if err != nil {
		t.Fatalf("load flashsale.yaml: %v", err)
	}
	if want := Default(); !reflect.DeepEqual(normalize(got), normalize(want)) {
		t.Fatalf("configs/flashsale.yaml drifted from Default():\ngot  %+v\nwant %+v", got, want)
	}
}

// normalize treats a nil and an empty list alike.
func normalize(c Config) Config {
	if len(c.Notifier.AllowedOrigins) == 0 {
		c.Notifier.AllowedOrigins = nil
	}
	if len(c.HTTP.TrustedProxies) == 0 {
		c.HTTP.TrustedProxies = nil
	}
	if len(c.Auth.Algorithms) == 0 {
		c.Auth.Algorithms = nil
	}
	if len(c.Redis.Addrs) == 0 {
		c.Redis.Addrs = nil
	}
	if len(c.Queue.Redis.Addrs) == 0 {
		c.Queue.Redis.Addrs = nil
	}
	return c
}

func TestProductionYAML(t *testing.T) {
	path := filepath.Join("..", "..", "configs", "production.yaml")
	if _, err := Load(path, map[string]string{}); err == nil || !strings.Contains(err.Error(), "auth.jwt_secret") {
		t.Fatalf("without secrets: got %v, want an error naming auth.jwt_secret", err)
	}
	secrets := map[string]string{
		"FLASHSALE_AUTH_JWT_SECRET":  strings.Repeat("s", 40),
		"FLASHSALE_AUTH_ADMIN_TOKEN": "admin-secret-token",
	}
	if _, err := Load(path, secrets); err == nil || !strings.Contains(err.Error(), "payment.webhook_secret") {
		t.Fatalf("without a webhook secret: got %v, want an error naming payment.webhook_secret", err)
	}
	secrets["FLASHSALE_PAYMENT_WEBHOOK_SECRET"] = strings.Repeat("w", 32)
	cfg, err := Load(path, secrets)
	if err != nil {
		t.Fatalf("load production.yaml: %v", err)
	}
	if cfg.Redis.Mode != "server" || cfg.Redis.Addr != "redis:6379" || cfg.Database.Driver != "mysql" {
		t.Fatalf("got redis %s %s, db %s; want server redis:6379, mysql", cfg.Redis.Mode, cfg.Redis.Addr, cfg.Database.Driver)
	}
	if cfg.Queue.Driver != "rocketmq" || !reflect.DeepEqual(cfg.Queue.RocketMQ.NameServers, []string{"rocketmq-namesrv:9876"}) {
		t.Fatalf("got queue %s on %v, want rocketmq on [rocketmq-namesrv:9876]", cfg.Queue.Driver, cfg.Queue.RocketMQ.NameServers)
	}
}

func TestEnvOverrides(t *testing.T) {
	cfg, err := Load("", map[string]string{
		"FLASHSALE_HTTP_ADDR":                           "127.0.0.1:0",
		"FLASHSALE_QUEUE_BATCH_SIZE":                    "64",
		"FLASHSALE_GATEWAY_PUBLISH_TIMEOUT":             "750ms",
		"FLASHSALE_NOTIFIER_ALLOWED_ORIGINS":            "https://a.example,https://b.example",
		"FLASHSALE_DATABASE_DSN":                        "file.db",
		"FLASHSALE_REDIS_ADDR":                          "10.0.0.1:6379",
		"FLASHSALE_NOTIFIER_MAX_SUBSCRIPTIONS_PER_CONN": "3",
		"FLASHSALE_QUEUE_ROCKETMQ_NAME_SERVERS":         "10.0.0.2:9876,10.0.0.3:9876",
		"FLASHSALE_QUEUE_ROCKETMQ_SUSPEND_TIME":         "250ms",
		"FLASHSALE_GATEWAY_ADMIT_LINGER":                "0",
		"FLASHSALE_PAYMENT_GRACE":                       "250ms",
		"FLASHSALE_QUEUE_EXPIRY_TOPIC":                  "expiries",
		"FLASHSALE_NOTIFIER_MAX_CONNS_PER_USER":         "2",
		"FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP":           "40",
		"FLASHSALE_NOTIFIER_MAX_CONNS":                  "500",
		"FLASHSALE_NOTIFIER_FD_RESERVE":                 "64",
		"FLASHSALE_NOTIFIER_POLL_RATE":                  "2",
		"FLASHSALE_NOTIFIER_POLL_BURST":                 "4",
		"FLASHSALE_NOTIFIER_SUBSCRIBE_RATE":             "6",
		"FLASHSALE_NOTIFIER_SUBSCRIBE_BURST":            "8",
		"FLASHSALE_GATEWAY_CACHED_UNKNOWN_IDS":          "64",
		"FLASHSALE_REDIS_KEY_RETENTION":                 "36h",
		"FLASHSALE_WORKER_MAX_QUEUE_DELAY":              "90s",
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"http.addr", cfg.HTTP.Addr, "127.0.0.1:0"},
		{"queue.batch_size", cfg.Queue.BatchSize, 64},
		{"gateway.publish_timeout", cfg.Gateway.PublishTimeout, 750 * time.Millisecond},
		{"notifier.allowed_origins", cfg.Notifier.AllowedOrigins, []string{"https://a.example", "https://b.example"}},
		{"database.dsn", cfg.Database.DSN, "file.db"},
		{"redis.addr", cfg.Redis.Addr, "10.0.0.1:6379"},
		{"notifier.max_subscriptions_per_conn", cfg.Notifier.MaxSubscriptionsPerConn, 3},
		{"queue.partitions (untouched)", cfg.Queue.Partitions, 8},
		{"queue.rocketmq.name_servers", cfg.Queue.RocketMQ.NameServers, []string{"10.0.0.2:9876", "10.0.0.3:9876"}},
		{"queue.rocketmq.suspend_time", cfg.Queue.RocketMQ.SuspendTime, 250 * time.Millisecond},
		{"gateway.admit_linger (0 turns it off)", cfg.Gateway.AdmitLinger, time.Duration(0)},
		{"payment.grace", cfg.Payment.Grace, 250 * time.Millisecond},
		{"queue.expiry_topic", cfg.Queue.ExpiryTopic, "expiries"},
		{"notifier.max_conns_per_user", cfg.Notifier.MaxConnsPerUser, 2},
		{"notifier.max_conns_per_ip", cfg.Notifier.MaxConnsPerIP, 40},
		{"notifier.max_conns", cfg.Notifier.MaxConns, 500},
		{"notifier.fd_reserve", cfg.Notifier.FDReserve, 64},
		{"notifier.poll_rate", cfg.Notifier.PollRate, 2},
		{"notifier.poll_burst", cfg.Notifier.PollBurst, 4},
		{"notifier.subscribe_rate", cfg.Notifier.SubscribeRate, 6},
		{"notifier.subscribe_burst", cfg.Notifier.SubscribeBurst, 8},
		{"gateway.cached_unknown_ids", cfg.Gateway.CachedUnknownIDs, 64},
		{"gateway.cached_campaigns (untouched)", cfg.Gateway.CachedCampaigns, 10_000},
		{"redis.key_retention", cfg.Redis.KeyRetention, 36 * time.Hour},
		{"worker.max_queue_delay", cfg.Worker.MaxQueueDelay, 90 * time.Second},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestRateLimitKeys: the six rate limits are declared once (model.RateLimits)
// and keep their keys directly under gateway, in the file and in the
// environment.
func TestRateLimitKeys(t *testing.T) {
	want := model.RateLimits{UserRate: 1, UserBurst: 2, CampaignRate: 3, CampaignBurst: 4, IPRate: 5, IPBurst: 6}
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := "gateway:\n  user_rate: 1\n  user_burst: 2\n  campaign_rate: 3\n  campaign_burst: 4\n  ip_rate: 5\n  ip_burst: 6\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile, err := Load(path, map[string]string{})
	if err != nil {
		t.Fatalf("load yaml: %v", err)
	}
	if fromFile.Gateway.RateLimits != want {
		t.Errorf("from the file: got %+v, want %+v", fromFile.Gateway.RateLimits, want)
	}
	fromEnv, err := Load("", map[string]string{
		"FLASHSALE_GATEWAY_USER_RATE": "1", "FLASHSALE_GATEWAY_USER_BURST": "2",
		"FLASHSALE_GATEWAY_CAMPAIGN_RATE": "3", "FLASHSALE_GATEWAY_CAMPAIGN_BURST": "4",
		"FLASHSALE_GATEWAY_IP_RATE": "5", "FLASHSALE_GATEWAY_IP_BURST": "6",
	})
	if err != nil {
		t.Fatalf("load env: %v", err)
	}
	if fromEnv.Gateway.RateLimits != want {
		t.Errorf("from the environment: got %+v, want %+v", fromEnv.Gateway.RateLimits, want)
	}
	if _, err := Load("", map[string]string{"FLASHSALE_GATEWAY_IP_BURST": "-1"}); err == nil || !strings.Contains(err.Error(), "gateway.*_rate") {
		t.Errorf("negative burst: got %v, want an error naming gateway.*_rate", err)
	}
}

func TestInvalidConfigNamesTheKey(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		env     map[string]string
		wantKey string
	}{
		{name: "unknown key", yaml: "queue:\n  drvier: memqueue\n", wantKey: "drvier"},
		{name: "bad driver", yaml: "queue:\n  driver: kafka\n", wantKey: "queue.driver"},
		{name: "zero batch", yaml: "queue:\n  batch_size: 0\n", wantKey: "queue.batch_size"},
		{name: "bad duration", yaml: "http:\n  read_timeout: soon\n", wantKey: "line 2"},
		{name: "drain delay too long", yaml: "http:\n  drain_delay: 10m\n", wantKey: "http.drain_delay"},
		{name: "negative drain delay", env: map[string]string{"FLASHSALE_HTTP_DRAIN_DELAY": "-1s"}, wantKey: "http.drain_delay"},
		{name: "short secret", yaml: "auth:\n  jwt_secret: short\n", wantKey: "auth.jwt_secret"},
		{name: "admin failures off", yaml: "auth:\n  admin_failures_per_minute: 0\n", wantKey: "auth.admin_failures_per_minute"},
		{name: "server redis without addr", yaml: "redis:\n  mode: server\n", wantKey: "redis.addr"},
		{name: "dev secrets with real redis", yaml: "redis:\n  mode: server\n  addr: r:6379\n", wantKey: "auth"},
		{name: "dev secrets with a cluster", yaml: "redis:\n  mode: cluster\n  addrs: [r1:7000]\n", wantKey: "auth"},
		{name: "unknown redis mode", yaml: "redis:\n  mode: sentinel\n", wantKey: "redis.mode"},
		{name: "cluster without addrs", yaml: "redis:\n  mode: cluster\n", wantKey: "redis.addrs"},
		{name: "cluster with a database", yaml: "redis:\n  mode: cluster\n  addrs: [r1:7000]\n  db: 2\n", wantKey: "redis.db"},
		{name: "cluster seed without port", env: map[string]string{"FLASHSALE_REDIS_MODE": "cluster", "FLASHSALE_REDIS_ADDRS": "r1:7000,r2"}, wantKey: "redis.addrs"},
		{name: "cluster reload too rare", yaml: "redis:\n  mode: cluster\n  addrs: [r1:7000]\n  cluster_reload_interval: 5m\n", wantKey: "redis.cluster_reload_interval"},
		{name: "bad log level", yaml: "log:\n  level: loud\n", wantKey: "log.level"},
		{name: "admit linger too long", yaml: "gateway:\n  admit_linger: 20ms\n", wantKey: "gateway.admit_linger"},
		{name: "key retention too short", yaml: "redis:\n  key_retention: 30m\n", wantKey: "redis.key_retention"},
		{name: "negative replica acks", env: map[string]string{"FLASHSALE_REDIS_MIN_REPLICAS_ACK": "-1"}, wantKey: "redis.min_replicas_ack"},
		{name: "replica acks from miniredis", yaml: "redis:\n  min_replicas_ack: 1\n", wantKey: "redis.min_replicas_ack"},
		{name: "replica ack timeout off", yaml: "redis:\n  replica_ack_timeout: 0s\n", wantKey: "redis.replica_ack_timeout"},
		{name: "no unknown ids cached", yaml: "gateway:\n  cached_unknown_ids: 0\n", wantKey: "gateway.cached_unknown_ids"},
		{name: "negative admit linger", env: map[string]string{"FLASHSALE_GATEWAY_ADMIT_LINGER": "-1ms"}, wantKey: "gateway.admit_linger"},
		{name: "bad env number", env: map[string]string{"FLASHSALE_QUEUE_PARTITIONS": "many"}, wantKey: "FLASHSALE_QUEUE_PARTITIONS"},
		{name: "rocketmq without name servers", yaml: "queue:\n  driver: rocketmq\n  rocketmq:\n    name_servers: []\n", wantKey: "queue.rocketmq.name_servers"},
		{name: "rocketmq name server without port", env: map[string]string{"FLASHSALE_QUEUE_DRIVER": "rocketmq", "FLASHSALE_QUEUE_ROCKETMQ_NAME_SERVERS": "namesrv"}, wantKey: "queue.rocketmq.name_servers"},
		{name: "rocketmq reconsumes fewer than the worker's attempts", yaml: "queue:\n  driver: rocketmq\n  rocketmq:\n    max_reconsume_times: 3\n", wantKey: "queue.rocketmq.max_reconsume_times"},
		{name: "rocketmq batch above the client's limit", yaml: "queue:\n  driver: rocketmq\n  batch_size: 2048\n", wantKey: "queue.batch_size"},
		{name: "rocketmq suspend too long", yaml: "queue:\n  driver: rocketmq\n  rocketmq:\n    suspend_time: 1h\n", wantKey: "queue.rocketmq.suspend_time"},
		{name: "rocketmq bad topic", yaml: "queue:\n  driver: rocketmq\n  topic: a.b\n", wantKey: "queue.topic"},
		{name: "unknown payment provider", yaml: "payment:\n  provider: paypal\n", wantKey: "payment.provider"},
		{name: "short webhook secret", env: map[string]string{"FLASHSALE_PAYMENT_WEBHOOK_SECRET": "short"}, wantKey: "payment.webhook_secret"},
		{name: "dev webhook secret with real redis", yaml: "redis:\n  mode: server\n  addr: r:6379\nauth:\n  jwt_secret: " + strings.Repeat("j", 32) + "\n  admin_token: admin-token\n  dev: false\n", wantKey: "payment.webhook_secret"},
		{name: "dev webhook secret with mysql", yaml: "database:\n  driver: mysql\n  dsn: u@tcp(db)/x\nauth:\n  jwt_secret: " + strings.Repeat("j", 32) + "\n  admin_token: admin-token\n  dev: false\n", wantKey: "payment.webhook_secret"},
		{name: "dev secrets with mysql", yaml: "database:\n  driver: mysql\n  dsn: u@tcp(db)/x\nauth:\n  dev: false\n", wantKey: "auth: the development secrets"},
		{name: "webhook tolerance zero", yaml: "payment:\n  webhook_tolerance: 0s\n", wantKey: "payment.webhook_tolerance"},
		{name: "grace zero", yaml: "payment:\n  grace: 0s\n", wantKey: "payment.grace"},
		{name: "sweep interval too short", yaml: "payment:\n  sweep_interval: 1ms\n", wantKey: "payment.sweep_interval"},
		{name: "queue delay too short", yaml: "worker:\n  max_queue_delay: 100ms\n", wantKey: "worker.max_queue_delay"},
		{name: "grace within two publishes", yaml: "gateway:\n  publish_timeout: 3s\n", wantKey: "worker.not_enqueued_grace"},
		{name: "grace beyond the queue delay", yaml: "worker:\n  max_queue_delay: 2s\n", wantKey: "worker.not_enqueued_grace"},
		{name: "expiry topic is the purchase topic", yaml: "queue:\n  expiry_topic: flashsale-purchases\n", wantKey: "queue.expiry_topic"},
		{name: "rocketmq bad expiry topic", yaml: "queue:\n  driver: rocketmq\n  expiry_topic: a.b\n", wantKey: "queue.expiry_topic"},
		{name: "rocketmq group too long for its expiry group", yaml: "queue:\n  driver: rocketmq\n  group: " + strings.Repeat("g", 125) + "\n", wantKey: "queue.group"},
		{name: "rocketmq bad log level", yaml: "queue:\n  driver: rocketmq\n  rocketmq:\n    log_level: loud\n", wantKey: "queue.rocketmq.log_level"},
		{name: "no WebSocket per user", yaml: "notifier:\n  max_conns_per_user: 0\n", wantKey: "notifier.max_conns_per_*"},
		{name: "no WebSocket per address", env: map[string]string{"FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP": "0"}, wantKey: "notifier.max_conns_per_*"},
		{name: "negative descriptor reserve", yaml: "notifier:\n  fd_reserve: -1\n", wantKey: "notifier.max_conns"},
		{name: "no poll burst", yaml: "notifier:\n  poll_burst: 0\n", wantKey: "notifier.*_rate"},
		{name: "jwks without issuer", yaml: "auth:\n  jwks_url: https://idp.example/.well-known/jwks.json\n  audience: api\n", wantKey: "auth.issuer"},
		{name: "jwks without audience", env: map[string]string{"FLASHSALE_AUTH_JWKS_URL": "https://idp.example/jwks", "FLASHSALE_AUTH_ISSUER": "https://idp.example/"}, wantKey: "auth.audience"},
		{name: "jwks url not a URL", yaml: "auth:\n  jwks_url: idp.example/jwks\n  issuer: i\n  audience: a\n", wantKey: "auth.jwks_url"},
		{name: "unknown algorithm", yaml: "auth:\n  algorithms: [RS256, none]\n", wantKey: "auth.algorithms"},
		{name: "provider algorithm without jwks", env: map[string]string{"FLASHSALE_AUTH_ALGORITHMS": "RS256"}, wantKey: "auth.algorithms"},
		{name: "jwks refresh too often", yaml: "auth:\n  jwks_url: https://idp.example/jwks\n  issuer: i\n  audience: a\n  jwks_refresh: 1s\n", wantKey: "auth.jwks_refresh"},
		{name: "no subscribe rate", env: map[string]string{"FLASHSALE_NOTIFIER_SUBSCRIBE_RATE": "0"}, wantKey: "notifier.*_rate"},
		{name: "dev secrets with a queue redis", yaml: "queue:\n  redis:\n    mode: server\n    addr: q:6379\n", wantKey: "auth.dev"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.yaml != "" {
				path = filepath.Join(t.TempDir(), "c.yaml")
				if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			env := tc.env
			if env == nil {
				env = map[string]string{}
			}
			_, err := Load(path, env)
			if err == nil || !strings.Contains(err.Error(), tc.wantKey) {
				t.Fatalf("got %v, want an error naming %q", err, tc.wantKey)
			}
		})
	}
}

// TestRedisCluster: redis.mode cluster takes its seed nodes from YAML or
// from FLASHSALE_REDIS_ADDRS (comma-separated), and the slot map's reload
// interval defaults short (see config.Redis).
func TestRedisCluster(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := "redis:\n  mode: cluster\n  addrs: [r1:7000, r2:7001]\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{"FLASHSALE_AUTH_JWT_SECRET": strings.Repeat("j", 32), "FLASHSALE_AUTH_ADMIN_TOKEN": "admin-token",
		"FLASHSALE_AUTH_DEV": "false", "FLASHSALE_PAYMENT_WEBHOOK_SECRET": strings.Repeat("w", 32)}
	cfg, err := Load(path, secrets)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if want := []string{"r1:7000", "r2:7001"}; !reflect.DeepEqual(cfg.Redis.Addrs, want) || cfg.Redis.ClusterReloadInterval != 2*time.Second {
		t.Fatalf("got addrs %v, reload %v; want %v, 2s", cfg.Redis.Addrs, cfg.Redis.ClusterReloadInterval, want)
	}
	secrets["FLASHSALE_REDIS_ADDRS"] = "10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000"
	secrets["FLASHSALE_REDIS_CLUSTER_RELOAD_INTERVAL"] = "500ms"
	if cfg, err = Load(path, secrets); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if want := []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"}; !reflect.DeepEqual(cfg.Redis.Addrs, want) ||
		cfg.Redis.ClusterReloadInterval != 500*time.Millisecond {
		t.Fatalf("got addrs %v, reload %v; want %v, 500ms", cfg.Redis.Addrs, cfg.Redis.ClusterReloadInterval, want)
	}
	// The environment alone switches a file written for one server.
	secrets["FLASHSALE_REDIS_MODE"] = "cluster"
	if cfg, err = Load(filepath.Join("..", "..", "configs", "production.yaml"), secrets); err != nil || cfg.Redis.Mode != "cluster" {
		t.Fatalf("production.yaml with FLASHSALE_REDIS_MODE=cluster: got %q, %v; want cluster, nil", cfg.Redis.Mode, err)
	}
}

// TestQueueRedis: queue.redis puts the redisstream driver in a Redis of its
// own, with redis's keys checked under its own name; unset, the queue stays
// in the stock's Redis.
func TestQueueRedis(t *testing.T) {
	real := map[string]string{"FLASHSALE_AUTH_JWT_SECRET": strings.Repeat("j", 32), "FLASHSALE_AUTH_ADMIN_TOKEN": "admin-token",
		"FLASHSALE_AUTH_DEV": "false", "FLASHSALE_PAYMENT_WEBHOOK_SECRET": strings.Repeat("w", 32),
		"FLASHSALE_REDIS_MODE": "server", "FLASHSALE_REDIS_ADDR": "stock:6379"}
	tests := []struct {
		name    string
		env     map[string]string
		wantKey string // "" for no error
	}{
		{name: "unset", env: map[string]string{}},
		{name: "server", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "server", "FLASHSALE_QUEUE_REDIS_ADDR": "queue:6379"}},
		{name: "cluster", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "cluster", "FLASHSALE_QUEUE_REDIS_ADDRS": "q1:7000,q2:7000"}},
		{name: "server without addr", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "server"}, wantKey: "queue.redis.addr"},
		{name: "embedded", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "embedded"}, wantKey: "queue.redis.mode"},
		{name: "unknown mode", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "sentinel", "FLASHSALE_QUEUE_REDIS_ADDR": "queue:6379"}, wantKey: "queue.redis.mode"},
		{name: "another driver", env: map[string]string{"FLASHSALE_QUEUE_DRIVER": "rocketmq", "FLASHSALE_QUEUE_REDIS_MODE": "server",
			"FLASHSALE_QUEUE_REDIS_ADDR": "queue:6379"}, wantKey: "queue.redis.mode"},
		{name: "cluster with a database", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "cluster", "FLASHSALE_QUEUE_REDIS_ADDRS": "q1:7000",
			"FLASHSALE_QUEUE_REDIS_DB": "1"}, wantKey: "queue.redis.db"},
		{name: "cluster seed without port", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "cluster", "FLASHSALE_QUEUE_REDIS_ADDRS": "q1"}, wantKey: "queue.redis.addrs"},
		{name: "no pool", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "server", "FLASHSALE_QUEUE_REDIS_ADDR": "queue:6379",
			"FLASHSALE_QUEUE_REDIS_POOL_SIZE": "0"}, wantKey: "queue.redis.pool_size"},
		{name: "timeout too short", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "server", "FLASHSALE_QUEUE_REDIS_ADDR": "queue:6379",
			"FLASHSALE_QUEUE_REDIS_TIMEOUT": "1ms"}, wantKey: "queue.redis.timeout"},
		{name: "negative replica acks", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "server", "FLASHSALE_QUEUE_REDIS_ADDR": "queue:6379",
			"FLASHSALE_QUEUE_REDIS_MIN_REPLICAS_ACK": "-1"}, wantKey: "queue.redis.min_replicas_ack"},
		{name: "key retention", env: map[string]string{"FLASHSALE_QUEUE_REDIS_MODE": "server", "FLASHSALE_QUEUE_REDIS_ADDR": "queue:6379",
			"FLASHSALE_QUEUE_REDIS_KEY_RETENTION": "24h"}, wantKey: "queue.redis.key_retention"},
		// Unset, its keys are not read: the queue is in the stock's Redis.
		{name: "unset with a stray key", env: map[string]string{"FLASHSALE_QUEUE_REDIS_TIMEOUT": "1ms"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := maps.Clone(real)
			maps.Copy(env, tc.env)
			cfg, err := Load("", env)
			switch {
			case tc.wantKey == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tc.wantKey != "" && (err == nil || !strings.Contains(err.Error(), tc.wantKey)):
				t.Fatalf("got %v, want an error naming %q", err, tc.wantKey)
			case err != nil:
				return
			}
			if cfg.Redis.Addr != "stock:6379" || cfg.Queue.Redis.Mode != tc.env["FLASHSALE_QUEUE_REDIS_MODE"] {
				t.Fatalf("got redis.addr %q, queue.redis.mode %q; want stock:6379, %q", cfg.Redis.Addr, cfg.Queue.Redis.Mode,
					tc.env["FLASHSALE_QUEUE_REDIS_MODE"])
			}
		})
	}
}

// TestProviderKeys: the identity provider's keys are read from YAML and
// from FLASHSALE_AUTH_* variables.
func TestProviderKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := "auth:\n  jwks_url: https://idp.example/.well-known/jwks.json\n  issuer: https://idp.example/\n  audience: api\n  jwks_refresh: 30m\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path, map[string]string{"FLASHSALE_AUTH_AUDIENCE": "shop-api", "FLASHSALE_AUTH_ALGORITHMS": "ES256,HS256",
		"FLASHSALE_AUTH_JWKS_UNKNOWN_KID": "10s"})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := Provider{JWKSURL: "https://idp.example/.well-known/jwks.json", Issuer: "https://idp.example/", Audience: "shop-api",
		Algorithms: []string{"ES256", "HS256"}, JWKSRefresh: 30 * time.Minute, JWKSUnknownKID: 10 * time.Second}
	if !reflect.DeepEqual(cfg.Auth.Provider, want) {
		t.Fatalf("got %+v, want %+v", cfg.Auth.Provider, want)
	}
}

// TestDevModeRefusedWithRealServices: auth.dev (serve prints tokens at
// start) is refused with a real Redis or MySQL, even when every secret is a
// real one; it stays the embedded default's.
func TestDevModeRefusedWithRealServices(t *testing.T) {
	real := map[string]string{
		"FLASHSALE_AUTH_JWT_SECRET":        strings.Repeat("s", 40),
		"FLASHSALE_AUTH_ADMIN_TOKEN":       "admin-secret-token",
		"FLASHSALE_PAYMENT_WEBHOOK_SECRET": strings.Repeat("w", 32),
		"FLASHSALE_AUTH_DEV":               "true",
	}
	tests := []struct {
		name string
		env  map[string]string
	}{
		{"real redis", map[string]string{"FLASHSALE_REDIS_MODE": "server", "FLASHSALE_REDIS_ADDR": "r:6379"}},
		{"mysql", map[string]string{"FLASHSALE_DATABASE_DRIVER": "mysql", "FLASHSALE_DATABASE_DSN": "u@tcp(db)/x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := maps.Clone(real)
			maps.Copy(env, tc.env)
			if _, err := Load("", env); err == nil || !strings.Contains(err.Error(), "auth.dev") {
				t.Fatalf("got %v, want an error naming auth.dev", err)
			}
			env["FLASHSALE_AUTH_DEV"] = "false"
			if _, err := Load("", env); err != nil {
				t.Fatalf("with auth.dev false: got %v, want no error", err)
			}
		})
	}
	if _, err := Load("", real); err != nil {
		t.Fatalf("embedded services in dev mode with real secrets: got %v, want no error", err)
	}
}

func TestMaskedHidesSecrets(t *testing.T) {
	c := Default()
	c.Database.DSN = "flashsale:hunter2@tcp(mysql:3306)/flashsale"
	c.Redis.Password = "redispw"
	c.Queue.Redis.Password = "queuepw"
	m := c.Masked()
	s := strings.Join([]string{m.Auth.JWTSecret, m.Auth.AdminToken, m.Redis.Password, m.Queue.Redis.Password, m.Database.DSN, m.Payment.WebhookSecret}, " ")
	for _, secret := range []string{DevJWTSecret, DevAdminToken, "hunter2", "redispw", "queuepw", DevWebhookSecret} {
		if strings.Contains(s, secret) {
			t.Errorf("masked config still contains %q: %s", secret, s)
		}
	}
	if m.Database.DSN != "flashsale:***@tcp(mysql:3306)/flashsale" {
		t.Errorf("got dsn %q, want the password masked", m.Database.DSN)
	}
}

// TestUnknownEnvRefused: a FLASHSALE_ variable that names no key fails at
// start, naming the variable and the key it was probably meant to be; the
// tests' own FLASHSALE_TEST_ variables pass, and every key is accepted.
func TestUnknownEnvRefused(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string // "" for no error
	}{
		{name: "misspelt key", env: map[string]string{"FLASHSALE_REDIS_ADRR": "r:6379"},
			want: "unknown variable FLASHSALE_REDIS_ADRR (did you mean FLASHSALE_REDIS_ADDR?)"},
		{name: "swapped letters", env: map[string]string{"FLASHSALE_QUEUE_DIRVER": "memqueue"},
			want: "FLASHSALE_QUEUE_DIRVER (did you mean FLASHSALE_QUEUE_DRIVER?)"},
		{name: "lower case", env: map[string]string{"FLASHSALE_log_level": "warn"},
			want: "FLASHSALE_log_level (did you mean FLASHSALE_LOG_LEVEL?)"},
		{name: "nothing close", env: map[string]string{"FLASHSALE_COLOUR": "blue"},
			want: "unknown variable FLASHSALE_COLOUR:"},
		{name: "every unknown one named", env: map[string]string{"FLASHSALE_HTTP_ADR": "x", "FLASHSALE_SOAK": "3"},
			want: "FLASHSALE_HTTP_ADR (did you mean FLASHSALE_HTTP_ADDR?), FLASHSALE_SOAK"},
		{name: "test variables allowed", env: map[string]string{"FLASHSALE_TEST_REDIS_ADDR": "r:6379", "FLASHSALE_TEST_ANYTHING": "1"}},
		{name: "other prefixes ignored", env: map[string]string{"FLASHSALEX": "1", "HOME": "/root"}},
		{name: "nested and inlined keys", env: map[string]string{"FLASHSALE_QUEUE_ROCKETMQ_SUSPEND_TIME": "2s", "FLASHSALE_GATEWAY_IP_RATE": "5"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load("", tc.env)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestEveryKeyHasAVariable: each key's own variable is accepted, so the
// unknown-variable check cannot refuse a real key.
func TestEveryKeyHasAVariable(t *testing.T) {
	cfg := Default()
	params, err := env.GetFieldParamsWithOptions(&cfg, env.Options{Prefix: EnvPrefix})
	if err != nil {
		t.Fatal(err)
	}
	if len(params) < 60 {
		t.Fatalf("got %d keys, want every key of the config (over 60)", len(params))
	}
	for _, p := range params {
		if err := unknownEnv(&cfg, env.Options{Prefix: EnvPrefix, Environment: map[string]string{p.Key: "x"}}); err != nil {
			t.Errorf("%s: got %v, want it known", p.Key, err)
		}
	}
}

// TestTestVariablesAllowed: the variables internal/testenv reads, which
// child processes of the tests inherit, are the ones Load lets pass.
func TestTestVariablesAllowed(t *testing.T) {
	for _, name := range []string{testenv.RedisAddrEnv, testenv.MySQLDSNEnv, testenv.SoakEnv} {
		if !strings.HasPrefix(name, TestEnvPrefix) {
			t.Errorf("testenv reads %s, want it under %s", name, TestEnvPrefix)
		}
	}
}
