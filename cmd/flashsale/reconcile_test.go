package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestReconcileCommand runs `flashsale reconcile` against a real sale: clean,
// it agrees; after Redis is corrupted, it names the difference and fails.
func TestReconcileCommand(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	campaign := testenv.Name(t, "recon-")
	c.openCampaign(campaign, 5, 1)
	for _, u := range []string{"ann", "ben"} {
		if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(u), `{"quantity":1}`, nil, nil); code != http.StatusAccepted {
			t.Fatalf("purchase: got %d", code)
		}
	}
	c.settle(campaign, 10*time.Second)
	env := commandEnv(cfg)
	reconcile := func(flags ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"reconcile", "--campaign", campaign}, flags...), &out, env, logTo(io.Discard))
		return out.String(), err
	}
	if out, err := reconcile(); err != nil || !strings.Contains(out, "0 differences") {
		t.Fatalf("clean sale: got %v\n%s\nwant agreement", err, out)
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr})
	defer rdb.Close()
	rdb.HIncrBy(t.Context(), "fs:{"+campaign+"}:counters", "sold", 1)
	out, err := reconcile()
	if err == nil || !strings.Contains(out, "sold_mismatch") {
		t.Fatalf("corrupted Redis: got %v\n%s\nwant a failure naming sold_mismatch", err, out)
	}
	// Repair needs a sale no worker decides: ended, or paused.
	if out, err := reconcile("--repair"); err == nil {
		t.Fatalf("repair of an open sale: got nil\n%s\nwant a refusal", out)
	}
	if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/pause", c.admin, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("pause: got %d", code)
	}
	if out, err := reconcile("--repair"); err != nil || !strings.Contains(out, "after repair: campaign "+campaign+": stock 5, Redis sold 2") {
		t.Fatalf("repair of a paused sale: got %v\n%s\nwant 2 sold, no difference left", err, out)
	}
	if out, err := reconcile(); err != nil || !strings.Contains(out, "0 differences") {
		t.Fatalf("after repair: got %v\n%s\nwant agreement", err, out)
	}
	var helpOut bytes.Buffer
	if err := run(context.Background(), []string{"reconcile"}, &helpOut, env, logTo(io.Discard)); err == nil || !strings.Contains(helpOut.String(), "Usage: flashsale reconcile") {
		t.Fatalf("reconcile without --campaign: got %v %q, want usage and an error", err, helpOut.String())
	}
}

// commandEnv is the environment of a one-shot command (reconcile, archive)
// pointed at the Redis and MySQL of cfg, a real-services test config.
func commandEnv(cfg config.Config) map[string]string {
	env := map[string]string{
		"FLASHSALE_REDIS_MODE":             cfg.Redis.Mode,
		"FLASHSALE_REDIS_ADDR":             cfg.Redis.Addr,
		"FLASHSALE_DATABASE_DRIVER":        "mysql",
		"FLASHSALE_DATABASE_DSN":           cfg.Database.DSN,
		"FLASHSALE_AUTH_JWT_SECRET":        testJWTSecret,
		"FLASHSALE_AUTH_ADMIN_TOKEN":       testAdminToken,
		"FLASHSALE_AUTH_DEV":               "false",
		"FLASHSALE_PAYMENT_WEBHOOK_SECRET": testWebhookSecret,
	}
	if cfg.Redis.Mode == "cluster" {
		env["FLASHSALE_REDIS_ADDRS"] = strings.Join(cfg.Redis.Addrs, ",")
	}
	return env
}
