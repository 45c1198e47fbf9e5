package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/config"
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

// TestOpenRedisFindsPromotedReplica: the cluster client openRedis builds
// follows a failover within seconds: go-redis re-reads the slot map on
// MOVED but not when a master stops answering, so without the short
// redis.cluster_reload_interval it would keep failing on the dead master
// for up to a minute.
func TestOpenRedisFindsPromotedReplica(t *testing.T) {
	c := testenv.PrivateCluster(t, 3, 1)
	cfg := config.Default().Redis
	cfg.Mode, cfg.Addrs = "cluster", c.Addrs()[:1]
	sys := &system{}
	defer func() {
		for i := len(sys.closers) - 1; i >= 0; i-- {
			_ = sys.closers[i]()
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	rdb, err := openRedis(ctx, cfg, sys)
	if err != nil {
		t.Fatal(err)
	}
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("openRedis in cluster mode: got %T, want *redis.ClusterClient", rdb)
	}
	if err := cc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	master, err := cc.MasterForKey(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// The value reaches the replica before its master dies.
	if n, err := master.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: got %d, %v", n, err)
	}
	port, _ := strconv.Atoi(master.Options().Addr[strings.LastIndex(master.Options().Addr, ":")+1:])
	killed := time.Now()
	if err := c.Kill(port); err != nil {
		t.Fatal(err)
	}
	// The replica takes over after the node timeout (2 s) and an election;
	// the client must find it well before go-redis's default reload (60 s).
	testenv.Eventually(t, 25*time.Second, "the client to read k from the promoted replica", func() (bool, string) {
		v, err := cc.Get(ctx, "k").Result()
		return err == nil && v == "v", fmt.Sprintf("GET k: %q, %v", v, err)
	})
	t.Logf("served again %v after the kill", time.Since(killed).Round(100*time.Millisecond))
}
