package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestServeLocalConfig: configs/local.yaml is what the README says — real
// Redis and MySQL on this machine, the queue on Redis Streams, secrets from
// the environment — and `serve --config configs/local.yaml` sells on them.
// Only what isolates the test is overridden: its own database and topics,
// and the test Redis's address.
func TestServeLocalConfig(t *testing.T) {
	path := filepath.Join("..", "..", "configs", "local.yaml")
	secrets := map[string]string{
		"FLASHSALE_AUTH_JWT_SECRET":        testJWTSecret,
		"FLASHSALE_AUTH_ADMIN_TOKEN":       testAdminToken,
		"FLASHSALE_PAYMENT_WEBHOOK_SECRET": testWebhookSecret,
	}
	if _, err := config.Load(path, map[string]string{}); err == nil || !strings.Contains(err.Error(), "auth.jwt_secret") {
		t.Fatalf("without secrets: got %v, want an error naming auth.jwt_secret", err)
	}
	cfg, err := config.Load(path, secrets)
	if err != nil {
		t.Fatalf("load local.yaml: %v", err)
	}
	if cfg.Redis.Mode != "server" || cfg.Redis.Addr != "127.0.0.1:6379" || cfg.Database.Driver != "mysql" ||
		!strings.Contains(cfg.Database.DSN, "@tcp(127.0.0.1:3306)/") || cfg.Queue.Driver != "redisstream" || cfg.Auth.Dev {
		t.Fatalf("got redis %s %s, db %s %s, queue %s, dev %v; want server 127.0.0.1:6379, mysql on 127.0.0.1:3306, redisstream, not dev",
			cfg.Redis.Mode, cfg.Redis.Addr, cfg.Database.Driver, cfg.Database.DSN, cfg.Queue.Driver, cfg.Auth.Dev)
	}

	env := map[string]string{
		"FLASHSALE_REDIS_ADDR":         testenv.RedisAddr(t),
		"FLASHSALE_DATABASE_DSN":       testenv.MySQLDSN(t),
		"FLASHSALE_QUEUE_TOPIC":        testenv.Topic(t),
		"FLASHSALE_QUEUE_EXPIRY_TOPIC": testenv.Topic(t),
		"FLASHSALE_LOG_LEVEL":          "warn",
	}
	for k, v := range secrets {
		env[k] = v
	}
	base, _ := serveInProcess(t, []string{"serve", "--config", path}, env)
	c := newClient(t, base, config.Auth{JWTSecret: testJWTSecret, JWTLeeway: time.Second, AdminToken: testAdminToken})
	var ready map[string]string
	testenv.Eventually(t, 20*time.Second, "readyz 200", func() (bool, string) {
		return c.do("GET", "/readyz", "", nil, nil, &ready) == http.StatusOK, fmt.Sprintf("%v", ready)
	})
	if ready["redis"] != "ok" || ready["mysql"] != "ok" || ready["queue"] != "ok" {
		t.Errorf("readyz: got %v, want redis, mysql and queue ok", ready)
	}
	id := testenv.Name(t, "local-")
	c.openCampaign(id, 5, 1)
	if o := c.buy("alice", id); o.CampaignID != id || o.Status != "pending_payment" {
		t.Errorf("order: got %+v, want alice's pending order in %s", o, id)
	}
}
