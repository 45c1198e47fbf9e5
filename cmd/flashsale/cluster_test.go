package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestWholePathRaceCluster: TestWholePathRace's sale with redis.mode
// cluster on the shared test cluster (the queue on Redis Streams, its
// partitions over the masters), then `flashsale reconcile` on the cluster:
// Redis and MySQL agree.
func TestWholePathRaceCluster(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	cfg.Redis.Mode, cfg.Redis.Addr, cfg.Redis.Addrs = "cluster", "", testenv.ClusterAddrs(t)
	cfg.Gateway.UserRate, cfg.Gateway.UserBurst = 100, 100
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := startSystem(t, cfg)
	campaign := testenv.Name(t, "race-")
	const stock, limit = 100, 1
	c.openCampaign(campaign, stock, limit)
	runSale(t, c, campaign, stock, limit)

	var out bytes.Buffer
	err := run(context.Background(), []string{"reconcile", "--campaign", campaign}, &out, commandEnv(cfg), logTo(io.Discard))
	if err != nil || !strings.Contains(out.String(), "0 differences") {
		t.Fatalf("reconcile on the cluster: got %v\n%s\nwant agreement", err, out.String())
	}
}

// TestLoadtestCluster: `flashsale loadtest` against a cluster deployment (a
// gateway, a notifier and a worker as separate processes, redis.mode
// cluster): it reaches flashsale over HTTP and WebSocket only, so it works
// unchanged, and its invariants hold.
func TestLoadtestCluster(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	cfg.Redis.Mode, cfg.Redis.Addr, cfg.Redis.Addrs = "cluster", "", testenv.ClusterAddrs(t)
	bin := buildBinary(t)
	env := append(processEnv(cfg), "FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP=100000")
	gw := startRole(t, bin, "gateway", env)
	ntf := startRole(t, bin, "notifier", env)
	startRole(t, bin, "worker", env)
	out, err := runLoadtestCmd(t, "--admin-token", testAdminToken, "--jwt-secret", testJWTSecret, "--campaign", testenv.Name(t, "ltcluster-"),
		"--shoppers", "300", "--stock", "40", "--concurrency", "16", "--settle", "30s",
		"--url", "http://"+gw.addr, "--results-url", "http://"+ntf.addr, "--json")
	if err != nil {
		t.Fatalf("loadtest: got error %v, want none; output:\n%s", err, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	if !rep.OK || rep.Successes != 40 {
		t.Fatalf("got ok %v, %d successes; want ok, 40: %+v", rep.OK, rep.Successes, rep.Invariants)
	}
}
