package main

import (
	"bytes"
	"context"
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
