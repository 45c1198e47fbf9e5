package metrics

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
)

// described lists the families a registry would export, from its
// collectors' descriptors: unlike Gather, it includes vectors that have no
// series yet.
func described(reg *prometheus.Registry) map[string]bool {
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

// gathered returns the families of reg with their series.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// TestRoles: each role's registry holds the families every process exports
// and its own, and none of another role's.
func TestRoles(t *testing.T) {
	common := []string{"flashsale_build_info", "flashsale_http_requests_total", "flashsale_http_request_duration_seconds",
		"go_goroutines", "process_cpu_seconds_total"}
	own := map[Role][]string{
		Gateway: {"flashsale_admit_refusals_total", "flashsale_queue_publish_seconds", "flashsale_late_payments_total",
			"flashsale_redis_script_seconds"},
		Worker: {"flashsale_worker_batch_size", "flashsale_deductions_total", "flashsale_order_persist_seconds",
			"flashsale_worker_poison_messages_total", "flashsale_redis_script_seconds", "flashsale_queue_lease_events_total",
			"flashsale_queue_partitions_owned", "flashsale_replica_ack_seconds", "flashsale_replica_ack_shortfalls_total"},
		Notifier: {"flashsale_results_delivered_total", "flashsale_websocket_clients", "flashsale_websocket_subscriptions", "flashsale_results_channels"},
	}
	tests := []struct {
		name  string
		roles []Role
	}{
		{"gateway", []Role{Gateway}},
		{"worker", []Role{Worker}},
		{"notifier", []Role{Notifier}},
		{"gateway and notifier", []Role{Gateway, Notifier}},
		{"no role given: every role", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New(tc.roles...)
			m.SetBuildInfo("v1.2.3")
			got := described(m.Registry)
			runs := tc.roles
			if runs == nil {
				runs = []Role{Gateway, Worker, Notifier}
			}
			want := map[string]bool{}
			for _, f := range common {
				want[f] = true
			}
			for _, r := range runs {
				for _, f := range own[r] {
					want[f] = true
				}
			}
			for f := range want {
				if !got[f] {
					t.Errorf("family %s missing", f)
				}
			}
			for r, fams := range own {
				for _, f := range fams {
					if got[f] && !want[f] {
						t.Errorf("family %s of role %s exported, want only %v's", f, r, runs)
					}
				}
			}
			role := make([]string, len(runs))
			for i, r := range runs {
				role[i] = string(r)
			}
			info := gathered(t, m.Registry)["flashsale_build_info"]
			if info == nil || len(info.GetMetric()) != 1 {
				t.Fatalf("build info: got %v, want one series", info)
			}
			labels := map[string]string{}
			for _, l := range info.GetMetric()[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["version"] != "v1.2.3" || labels["role"] != strings.Join(role, "+") {
				t.Errorf("build info labels: got %v, want version v1.2.3, role %s", labels, strings.Join(role, "+"))
			}
		})
	}
}

// TestPartitionEvent: every lease event is counted by topic and event, and
// the partitions held follow them.
func TestPartitionEvent(t *testing.T) {
	m := New(Worker)
	for _, e := range []string{"acquired", "acquired", "acquired", "released", "lost"} {
		m.PartitionEvent("purchases", 0, e)
	}
	m.PartitionEvent("expiry", 1, "acquired")
	tests := []struct {
		name string
		c    prometheus.Collector
		want float64
	}{
		{"acquired", m.LeaseEvents.WithLabelValues("purchases", "acquired"), 3},
		{"released", m.LeaseEvents.WithLabelValues("purchases", "released"), 1},
		{"lost", m.LeaseEvents.WithLabelValues("purchases", "lost"), 1},
		{"owned purchases", m.PartitionsOwned.WithLabelValues("purchases"), 1},
		{"owned expiry", m.PartitionsOwned.WithLabelValues("expiry"), 1},
	}
	for _, tc := range tests {
		var d dto.Metric
		if err := tc.c.(prometheus.Metric).Write(&d); err != nil {
			t.Fatal(err)
		}
		got := d.GetCounter().GetValue() + d.GetGauge().GetValue()
		if got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// histogramCount is how many observations h's child of labels has.
func histogramCount(t *testing.T, h *prometheus.HistogramVec, labels ...string) uint64 {
	t.Helper()
	var d dto.Metric
	if err := h.WithLabelValues(labels...).(prometheus.Metric).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount()
}

// TestScriptHook: script calls are timed by script name, whether sent by
// hash, by source, or in a pipeline; the NOSCRIPT refusal before a first
// EVAL is not.
func TestScriptHook(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	known, unknown := redis.NewScript("return 1"), redis.NewScript("return 2")
	m := New(Worker)
	rdb.AddHook(m.ScriptHook(map[string]string{known.Hash(): "known"}))
	ctx := context.Background()
	// The first Run is refused NOSCRIPT and sent again with its source.
	for range 2 {
		if err := known.Run(ctx, rdb, nil).Err(); err != nil {
			t.Fatalf("run: %v", err)
		}
	}
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		known.Eval(ctx, p, nil)
		known.EvalSha(ctx, p, nil)
		return nil
	}); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	if err := unknown.Run(ctx, rdb, nil).Err(); err != nil {
		t.Fatalf("run: %v", err)
	}
	rdb.Get(ctx, "not a script")
	if got := histogramCount(t, m.ScriptDuration, "known"); got != 4 {
		t.Errorf("known: got %d observations, want 4 (EVAL, EVALSHA, two pipelined)", got)
	}
	if got := histogramCount(t, m.ScriptDuration, "other"); got != 1 {
		t.Errorf("other: got %d observations, want 1", got)
	}
}

// TestGinMiddlewareDuration: one latency series per route template; a
// WebSocket upgrade, which lasts as long as its connection, is counted
// but not timed.
func TestGinMiddlewareDuration(t *testing.T) {
	gin.SetMode(gin.TestMode)
	m := New()
	e := gin.New()
	e.Use(m.GinMiddleware())
	e.GET("/items/:id", func(c *gin.Context) { c.Status(http.StatusOK) })
	e.GET("/ws", func(c *gin.Context) { c.Status(http.StatusBadRequest) })
	for _, path := range []string{"/items/1", "/items/2", "/nowhere"} {
		e.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	ws := httptest.NewRequest(http.MethodGet, "/ws", nil)
	ws.Header.Set("Connection", "Upgrade")
	ws.Header.Set("Upgrade", "websocket")
	e.ServeHTTP(httptest.NewRecorder(), ws)
	tests := []struct {
		route string
		want  uint64
	}{
		{"/items/:id", 2},
		{"unmatched", 1},
		{"/ws", 0},
	}
	for _, tc := range tests {
		if got := histogramCount(t, m.RequestDuration, tc.route); got != tc.want {
			t.Errorf("%s: got %d observations, want %d", tc.route, got, tc.want)
		}
	}
	if got := value(t, m.Requests.CounterVec.WithLabelValues("/ws", "400")); got != 1 {
		t.Errorf("/ws requests: got %v, want 1", got)
	}
}

// byLabel returns the values of family name in reg, keyed by the value of
// label ("": every label value, sorted and joined by commas).
func byLabel(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	f := gathered(t, reg)[name]
	if f == nil {
		return out
	}
	for _, s := range f.GetMetric() {
		key := []string{}
		for _, l := range s.GetLabel() {
			if l.GetName() == label || label == "" {
				key = append(key, l.GetValue())
			}
		}
		slices.Sort(key)
		out[strings.Join(key, ",")] = s.GetGauge().GetValue()
	}
	return out
}

// TestWatch: the scrape-time families report what their reads return; a
// failed read leaves its family out without failing the scrape.
func TestWatch(t *testing.T) {
	m := New()
	m.WatchDependencies(map[string]func(context.Context) error{
		"redis": func(context.Context) error { return nil },
		"mysql": func(context.Context) error { return errors.New("down") },
	})
	m.WatchBacklog([]string{"purchases", "broken"}, func(_ context.Context, topic string) ([]Backlog, error) {
		if topic == "broken" {
			return nil, errors.New("unreachable")
		}
		return []Backlog{{Partition: 0, Lag: 3, Pending: 2, OldestAge: 1500 * time.Millisecond}, {Partition: 1}}, nil
	})
	stockFails := false
	m.WatchStock(func(context.Context) (map[string]int64, error) {
		if stockFails {
			return nil, errors.New("unreachable")
		}
		return map[string]int64{"spring": 7, "summer": 0}, nil
	})

	if got := byLabel(t, m.Registry, "flashsale_dependency_up", "dependency"); got["redis"] != 1 || got["mysql"] != 0 || len(got) != 2 {
		t.Errorf("dependency_up: got %v, want redis 1, mysql 0", got)
	}
	if got := byLabel(t, m.Registry, "flashsale_queue_lag_messages", ""); got["0,purchases"] != 3 || got["1,purchases"] != 0 || len(got) != 2 {
		t.Errorf("lag: got %v, want partition 0 at 3 and 1 at 0, of purchases only", got)
	}
	if got := byLabel(t, m.Registry, "flashsale_queue_pending_messages", ""); got["0,purchases"] != 2 {
		t.Errorf("pending: got %v, want partition 0 at 2", got)
	}
	if got := byLabel(t, m.Registry, "flashsale_queue_oldest_message_age_seconds", ""); got["0,purchases"] != 1.5 {
		t.Errorf("oldest: got %v, want partition 0 at 1.5", got)
	}
	if got := byLabel(t, m.Registry, "flashsale_stock_remaining", "campaign"); got["spring"] != 7 || got["summer"] != 0 || len(got) != 2 {
		t.Errorf("stock: got %v, want spring 7, summer 0", got)
	}
	stockFails = true
	if got := byLabel(t, m.Registry, "flashsale_stock_remaining", "campaign"); len(got) != 0 {
		t.Errorf("stock after a failed read: got %v, want no series", got)
	}
}
