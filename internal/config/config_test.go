package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

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

// normalize treats a nil and an empty origin list alike.
func normalize(c Config) Config {
	if len(c.Notifier.AllowedOrigins) == 0 {
		c.Notifier.AllowedOrigins = nil
	}
	if len(c.HTTP.TrustedProxies) == 0 {
		c.HTTP.TrustedProxies = nil
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
		{name: "short secret", yaml: "auth:\n  jwt_secret: short\n", wantKey: "auth.jwt_secret"},
		{name: "server redis without addr", yaml: "redis:\n  mode: server\n", wantKey: "redis.addr"},
		{name: "dev secrets with real redis", yaml: "redis:\n  mode: server\n  addr: r:6379\n", wantKey: "auth"},
		{name: "bad log level", yaml: "log:\n  level: loud\n", wantKey: "log.level"},
		{name: "admit linger too long", yaml: "gateway:\n  admit_linger: 20ms\n", wantKey: "gateway.admit_linger"},
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
		{name: "dev webhook secret with real redis", yaml: "redis:\n  mode: server\n  addr: r:6379\nauth:\n  jwt_secret: " + strings.Repeat("j", 32) + "\n  admin_token: admin-token\n", wantKey: "payment.webhook_secret"},
		{name: "webhook tolerance zero", yaml: "payment:\n  webhook_tolerance: 0s\n", wantKey: "payment.webhook_tolerance"},
		{name: "grace zero", yaml: "payment:\n  grace: 0s\n", wantKey: "payment.grace"},
		{name: "sweep interval too short", yaml: "payment:\n  sweep_interval: 1ms\n", wantKey: "payment.sweep_interval"},
		{name: "expiry topic is the purchase topic", yaml: "queue:\n  expiry_topic: flashsale-purchases\n", wantKey: "queue.expiry_topic"},
		{name: "rocketmq bad expiry topic", yaml: "queue:\n  driver: rocketmq\n  expiry_topic: a.b\n", wantKey: "queue.expiry_topic"},
		{name: "rocketmq group too long for its expiry group", yaml: "queue:\n  driver: rocketmq\n  group: " + strings.Repeat("g", 125) + "\n", wantKey: "queue.group"},
		{name: "rocketmq bad log level", yaml: "queue:\n  driver: rocketmq\n  rocketmq:\n    log_level: loud\n", wantKey: "queue.rocketmq.log_level"},
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

func TestMaskedHidesSecrets(t *testing.T) {
	c := Default()
	c.Database.DSN = "flashsale:hunter2@tcp(mysql:3306)/flashsale"
	c.Redis.Password = "redispw"
	m := c.Masked()
	s := strings.Join([]string{m.Auth.JWTSecret, m.Auth.AdminToken, m.Redis.Password, m.Database.DSN, m.Payment.WebhookSecret}, " ")
	for _, secret := range []string{DevJWTSecret, DevAdminToken, "hunter2", "redispw", DevWebhookSecret} {
		if strings.Contains(s, secret) {
			t.Errorf("masked config still contains %q: %s", secret, s)
		}
	}
	if m.Database.DSN != "flashsale:***@tcp(mysql:3306)/flashsale" {
		t.Errorf("got dsn %q, want the password masked", m.Database.DSN)
	}
}
