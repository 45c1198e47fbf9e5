package main

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/metrics"
)

// The files an operator loads into Prometheus and Grafana.
const (
	alertsFile    = "../../deploy/prometheus/alerts.yml"
	dashboardFile = "../../deploy/grafana/flashsale.json"
)

// TestDeployMetricsExist keeps deploy/ honest about the code: every
// flashsale family its alert rules and dashboard query is exported by a
// running system (all roles, with the redisstream queue) or by
// `flashsale reconcile --metrics-file`; every recording rule they use is
// defined; and every family the roles export has a place on the dashboard.
// That each expression parses is checked by .ci/deploycheck, with
// Prometheus's own parsers.
func TestDeployMetricsExist(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	sys := startSystemOf(t, cfg, roleSet{gateway: true, worker: true, notifier: true})
	exported := describedFamilies(sys.Metrics.Registry)
	for f := range describedFamilies(metrics.NewReconcile().Registry) {
		exported[f] = true
	}
	known := func(name string) bool {
		if exported[name] {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
				return true
			}
		}
		return false
	}

	alerts := mustRead(t, alertsFile)
	dashboard := mustRead(t, dashboardFile)
	family := regexp.MustCompile(`\bflashsale_[a-zA-Z0-9_]+`)
	recording := regexp.MustCompile(`\bflashsale:[a-zA-Z0-9_:]+`)
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*- record: (\S+)`).FindAllStringSubmatch(alerts, -1) {
		defined[m[1]] = true
	}
	for file, text := range map[string]string{alertsFile: alerts, dashboardFile: dashboard} {
		for _, name := range family.FindAllString(text, -1) {
			if !known(name) {
				t.Errorf("%s names %s, which no role nor reconcile exports", file, name)
			}
		}
		for _, name := range recording.FindAllString(text, -1) {
			if !defined[name] {
				t.Errorf("%s uses the recording rule %s, which %s does not define", file, name, alertsFile)
			}
		}
	}

	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(dashboard), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: got uid %q and %d panels, want a uid and panels", dashboardFile, d.UID, len(d.Panels))
	}
	ids := map[int]bool{}
	queried := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("%s: panel id %d used twice", dashboardFile, p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
		}
		for _, q := range p.Targets {
			if q.Expr == "" {
				t.Errorf("%s: panel %q has an empty query", dashboardFile, p.Title)
			}
			for _, name := range family.FindAllString(q.Expr, -1) {
				queried[name] = true
			}
		}
	}
	var missing []string
	for f := range describedFamilies(sys.Metrics.Registry) {
		if !strings.HasPrefix(f, "flashsale_") {
			continue
		}
		on := queried[f]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			on = on || queried[f+suffix]
		}
		if !on {
			missing = append(missing, f)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%s shows nothing of %v", dashboardFile, missing)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
