package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/metrics"
)

// TestDocsMetrics holds docs/OPERATIONS.md's metrics table equal to the
// flashsale families a running system (every role) and `flashsale
// reconcile --metrics-file` export.
func TestDocsMetrics(t *testing.T) {
	section := docSection(t, "docs/OPERATIONS.md", "Metrics")
	documented := map[string]bool{}
	for _, m := range metricRow.FindAllStringSubmatch(section, -1) {
		documented[m[1]] = true
	}
	cfg := realConfig(t, "redisstream")
	sys := startSystemOf(t, cfg, roleSet{gateway: true, worker: true, notifier: true})
	exported := describedFamilies(sys.Metrics.Registry)
	for f := range describedFamilies(metrics.NewReconcile().Registry) {
		exported[f] = true
	}
	for f := range exported {
		if strings.HasPrefix(f, "flashsale_") && !documented[f] {
			t.Errorf("%s is exported but not in docs/OPERATIONS.md's metrics table", f)
		}
	}
	for f := range documented {
		if !exported[f] {
			t.Errorf("docs/OPERATIONS.md's metrics table has %s, which nothing exports", f)
		}
	}
}

// metricRow is a row of the metrics table: | `flashsale_…` | or with ⏱.
var metricRow = regexp.MustCompile("(?m)^\\| `(flashsale_[a-z0-9_]+)`")
