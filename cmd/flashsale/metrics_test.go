package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// startSystemOf runs roles in this process until the test ends, and
// returns the running system.
func startSystemOf(t *testing.T, cfg config.Config, roles roleSet) *system {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sys, err := start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), roles)
	if err != nil {
		cancel()
		t.Fatalf("start %s: %v", roles, err)
	}
	t.Cleanup(func() {
		cancel()
		if err := sys.Wait(); err != nil {
			t.Errorf("%s shutdown: %v", roles, err)
		}
	})
	return sys
}

// exposition is one scrape of /metrics.
type exposition struct {
	families map[string]bool // from the # TYPE lines
	samples  []string        // every sample line
}

func scrape(t *testing.T, base string) exposition {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("GET %s/metrics: %v", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: got %d, want 200", base, resp.StatusCode)
	}
	e := exposition{families: map[string]bool{}}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		line := lines.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			e.families[strings.Fields(rest)[0]] = true
		} else if line != "" && !strings.HasPrefix(line, "#") {
			e.samples = append(e.samples, line)
		}
	}
	return e
}

// value returns the value of the sample whose line starts with prefix (name
// and labels as exposed), and whether there is one.
func (e exposition) value(prefix string) (float64, bool) {
	for _, s := range e.samples {
		if strings.HasPrefix(s, prefix) {
			v, err := strconv.ParseFloat(s[strings.LastIndexByte(s, ' ')+1:], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// describedFamilies lists the families a registry can export, from its
// collectors' descriptors: unlike a scrape, it includes vectors that have
// no series yet.
func describedFamilies(reg *prometheus.Registry) map[string]bool {
	ch := make(chan *prometheus.Desc)
	go func() { reg.Describe(ch); close(ch) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	out := map[string]bool{}
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

// roleFamilies are the families each role exports besides the common ones:
// what an operator finds on its /metrics (docs/OPERATIONS.md, "Metrics").
var roleFamilies = map[string][]string{
	"gateway": {"flashsale_admit_refusals_total", "flashsale_queue_publish_seconds", "flashsale_late_payments_total",
		"flashsale_redis_script_seconds", "flashsale_stock_remaining", "flashsale_restores_total"},
	"worker": {"flashsale_worker_batch_size", "flashsale_deductions_total", "flashsale_order_persist_seconds",
		"flashsale_worker_poison_messages_total", "flashsale_redis_script_seconds", "flashsale_restores_total", "flashsale_queue_lease_events_total",
		"flashsale_queue_partitions_owned", "flashsale_queue_lag_messages", "flashsale_queue_pending_messages",
		"flashsale_queue_oldest_message_age_seconds"},
	"notifier": {"flashsale_results_delivered_total", "flashsale_websocket_clients", "flashsale_websocket_subscriptions"},
}

// commonFamilies are exported by every process.
var commonFamilies = []string{"flashsale_build_info", "flashsale_http_requests_total",
	"flashsale_http_request_duration_seconds", "flashsale_dependency_up", "go_goroutines", "process_cpu_seconds_total"}

// TestMetricsPerRole runs a gateway, a worker and a notifier as separate
// systems on real Redis, MySQL and Redis Streams, makes one sale go
// through them, and scrapes each: every role's /metrics has the common
// families and its own, with values that match the sale, and none of
// another role's.
func TestMetricsPerRole(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	systems := map[string]*system{
		"gateway":  startSystemOf(t, cfg, roleSet{gateway: true}),
		"worker":   startSystemOf(t, cfg, roleSet{worker: true}),
		"notifier": startSystemOf(t, cfg, roleSet{notifier: true}),
	}
	gw := newClient(t, "http://"+systems["gateway"].Addr(), cfg.Auth)
	nt := newClient(t, "http://"+systems["notifier"].Addr(), cfg.Auth)
	campaign := testenv.Name(t, "metrics-")
	gw.openCampaign(campaign, 5, 1)
	code, rid := gw.tryBuy(campaign, "alice")
	if code != http.StatusAccepted {
		t.Fatalf("purchase: got %d, want 202", code)
	}
	if r := nt.waitFinal("alice", rid, 30*time.Second); r.Status != "success" {
		t.Fatalf("result: got %s, want success", r.Status)
	}
	if code, _ := gw.tryBuy("no-such-campaign", "alice"); code != http.StatusNotFound {
		t.Fatalf("purchase of an unknown campaign: got %d, want 404", code)
	}
	gw.settle(campaign, 30*time.Second)

	// The worker takes its partitions in the background.
	owned := `flashsale_queue_partitions_owned{topic="` + cfg.Queue.Topic + `"}`
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%s %d", owned, cfg.Queue.Partitions), func() (bool, string) {
		v, _ := scrape(t, "http://"+systems["worker"].Addr()).value(owned)
		return v == float64(cfg.Queue.Partitions), fmt.Sprintf("got %v", v)
	})
	scrapes := map[string]exposition{}
	for role, sys := range systems {
		// Twice: a worker's first request may be this scrape.
		scrape(t, "http://"+sys.Addr())
		scrapes[role] = scrape(t, "http://"+sys.Addr())
	}
	for role, e := range scrapes {
		t.Run(role, func(t *testing.T) {
			described := describedFamilies(systems[role].Metrics.Registry)
			for _, f := range append(append([]string{}, commonFamilies...), roleFamilies[role]...) {
				if !e.families[f] {
					t.Errorf("/metrics lacks %s", f)
				}
			}
			own := map[string]bool{}
			for _, f := range roleFamilies[role] {
				own[f] = true
			}
			for other, fams := range roleFamilies {
				for _, f := range fams {
					if own[f] {
						continue
					}
					if e.families[f] || described[f] {
						t.Errorf("exports %s, a family of the %s", f, other)
					}
				}
			}
			if _, ok := e.value(`flashsale_build_info{role="` + role + `",version="` + version + `"} 1`); !ok {
				t.Errorf("no flashsale_build_info{role=%q,version=%q} 1", role, version)
			}
			if v, ok := e.value(`flashsale_dependency_up{dependency="redis"}`); !ok || v != 1 {
				t.Errorf("dependency_up redis: got %v (present %v), want 1", v, ok)
			}
		})
	}

	// Values that follow from the sale.
	checks := []struct {
		role, sample string
		want         float64
	}{
		{"gateway", `flashsale_stock_remaining{campaign="` + campaign + `"}`, 4},
		{"gateway", `flashsale_admit_refusals_total{reason="campaign"}`, 1},
		{"gateway", `flashsale_redis_script_seconds_count{script="admit"}`, 1},
		{"gateway", `flashsale_dependency_up{dependency="mysql"}`, 1},
		{"worker", `flashsale_deductions_total{result="success"}`, 1},
		{"worker", `flashsale_redis_script_seconds_count{script="deduct"}`, 1},
		{"worker", `flashsale_queue_lease_events_total{event="acquired",topic="` + cfg.Queue.Topic + `"}`, float64(cfg.Queue.Partitions)},
		{"worker", `flashsale_queue_lag_messages{partition="0",topic="` + cfg.Queue.Topic + `"}`, 0},
		{"notifier", `flashsale_results_delivered_total{channel="poll"}`, 1},
	}
	for _, c := range checks {
		if got, ok := scrapes[c.role].value(c.sample); !ok || got != c.want {
			t.Errorf("%s: %s: got %v (present %v), want %v", c.role, c.sample, got, ok, c.want)
		}
	}
}
