package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestWorkerSIGTERMHandsOver: two worker processes share a topic with a
// lease TTL of five minutes; one gets SIGTERM, as in a rolling restart. It
// frees its partitions as it stops, logging each, and the other worker
// holds every partition within seconds, not after the TTL (or its
// quarter, when a worker retries a partition held by another).
func TestWorkerSIGTERMHandsOver(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	cfg.Queue.LeaseTTL = 5 * time.Minute
	bin := buildBinary(t)
	env := append(processEnv(cfg), "FLASHSALE_LOG_LEVEL=info")
	rdb := testenv.Redis(t)

	// holders counts the topic's held leases by worker process; a lease's
	// value starts with the consumer name, "<host>-<pid>-…".
	holders := func() map[int]int {
		out := map[int]int{}
		for p := range cfg.Queue.Partitions {
			v, err := rdb.Get(context.Background(), fmt.Sprintf("fsq:{%s:%d}:lease", cfg.Queue.Topic, p)).Result()
			if err != nil {
				continue
			}
			for _, f := range strings.Split(v, "-") {
				if pid, err := strconv.Atoi(f); err == nil {
					out[pid]++
					break
				}
			}
		}
		return out
	}
	waitFor := func(what string, cond func(map[int]int) bool) {
		t.Helper()
		// Far below the TTL-bound steps: 75 s, 100 s, 5 min.
		testenv.Eventually(t, 30*time.Second, what, func() (bool, string) {
			h := holders()
			return cond(h), fmt.Sprintf("leases by pid %v", h)
		})
	}

	a, b := startWorkerProcess(t, bin, env), startWorkerProcess(t, bin, env)
	pa, pb := a.cmd.Process.Pid, b.cmd.Process.Pid
	half := cfg.Queue.Partitions / 2
	waitFor("an even split", func(h map[int]int) bool { return h[pa] == half && h[pb] == half })

	logged := len(a.stderr.String())
	signalled := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-a.exited:
		if a.err != nil {
			t.Fatalf("worker after SIGTERM: %v\n%s", a.err, a.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("worker still running 30s after SIGTERM")
	}
	exited := time.Since(signalled)
	waitFor("the other worker to hold every partition", func(h map[int]int) bool { return h[pb] == cfg.Queue.Partitions })
	t.Logf("SIGTERM to exit: %s; to the other worker holding every partition: %s", exited.Round(time.Millisecond), time.Since(signalled).Round(time.Millisecond))

	released := 0
	for _, line := range strings.Split(a.stderr.String()[logged:], "\n") {
		if strings.Contains(line, "partition lease released") && strings.Contains(line, "topic="+cfg.Queue.Topic+" ") {
			released++
		}
	}
	if released != half {
		t.Errorf("the stopped worker logged %d leases of the topic released after SIGTERM, want %d:\n%s", released, half, a.stderr.String())
	}
	owned := `flashsale_queue_partitions_owned{topic="` + cfg.Queue.Topic + `"}`
	if v, ok := scrape(t, "http://"+b.addr).value(owned); !ok || v != float64(cfg.Queue.Partitions) {
		t.Errorf("%s of the remaining worker: got %v (present %v), want %d", owned, v, ok, cfg.Queue.Partitions)
	}
}
