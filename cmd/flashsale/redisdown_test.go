package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestAdminStatsRedisDown: a gateway process whose Redis is down (its own
// redis-server, killed) answers admin stats 503 unavailable (not 500
// internal), and what go-redis has to say about it reaches the JSON log as
// JSON, rate-limited.
func TestAdminStatsRedisDown(t *testing.T) {
	testenv.SkipShort(t, "a fault test: Redis down")
	rs := startRedisServer(t)
	cfg := realConfig(t, "redisstream")
	cfg.Redis.Addr = rs.addr()
	bin := buildBinary(t)
	env := append(processEnv(cfg), "FLASHSALE_LOG_FORMAT=json", "FLASHSALE_LOG_LEVEL=warn")
	gw := startRole(t, bin, "gateway", env)
	c := gw.client(t, cfg)
	campaign := testenv.Name(t, "rdown-")
	c.openCampaign(campaign, 10, 1)

	rs.kill()
	began := time.Now()
	const reads = 12
	for i := range reads {
		var e struct{ Code string }
		sent := time.Now()
		if code := c.do("GET", "/admin/v1/campaigns/"+campaign+"/stats", c.admin, nil, nil, &e); code != http.StatusServiceUnavailable || e.Code != "unavailable" {
			t.Fatalf("stats %d with Redis down: got %d %q, want 503 unavailable", i, code, e.Code)
		}
		t.Logf("stats %d answered 503 after %v", i, time.Since(sent).Round(time.Millisecond))
	}
	elapsed := time.Since(began)
	rs.start()
	testenv.Eventually(t, 30*time.Second, "stats after Redis is back", func() (bool, string) {
		code := c.do("GET", "/admin/v1/campaigns/"+campaign+"/stats", c.admin, nil, nil, nil)
		return code == http.StatusOK, http.StatusText(code)
	})
	if err := gw.stop(); err != nil {
		t.Fatalf("gateway stop: %v", err)
	}

	var fromRedis, suppressed int
	for line := range strings.Lines(gw.stderr.String()) {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		if entry["library"] == "go-redis" {
			fromRedis++
			if n, ok := entry["suppressed"].(float64); ok {
				suppressed += int(n)
			}
		}
	}
	// Each window lets redisLogBurst lines through; the outage and the
	// recovery span at most this many windows.
	windows := int((time.Since(began))/redisLogWindow) + 2
	if fromRedis == 0 || fromRedis > windows*redisLogBurst {
		t.Errorf("got %d go-redis lines in %v, want between 1 and %d (%d per %v)", fromRedis, elapsed, windows*redisLogBurst, redisLogBurst, redisLogWindow)
	}
	t.Logf("%d stats reads in %v; %d go-redis lines logged, %d reported suppressed", reads, elapsed, fromRedis, suppressed)
}

// TestRedisLogRateLimited: the go-redis adapter writes up to the burst per
// window, drops the rest and names how many it dropped on the next line it
// writes.
func TestRedisLogRateLimited(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(1_000_000, 0)
	l := &redisLog{log: slog.New(slog.NewJSONHandler(&out, nil)), window: 10 * time.Second, burst: 3, now: func() time.Time { return now }}
	for i := range 10 {
		l.Printf(context.Background(), "redis: failed to dial %d", i)
	}
	now = now.Add(10 * time.Second)
	l.Printf(context.Background(), "redis: failed to dial %d", 10)

	var got []string
	for line := range strings.Lines(out.String()) {
		var e struct {
			Level, Msg string
			Suppressed int
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		got = append(got, e.Level+" "+e.Msg+" suppressed="+string(rune('0'+e.Suppressed)))
	}
	want := []string{"WARN failed to dial 0 suppressed=0", "WARN failed to dial 1 suppressed=0", "WARN failed to dial 2 suppressed=0",
		"WARN failed to dial 10 suppressed=7"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got lines\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
