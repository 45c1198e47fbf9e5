package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reconcile holds the outcome of one `flashsale reconcile` run, on a
// registry of its own with nothing else on it: the command writes it to a
// file for node_exporter's textfile collector (a one-shot command has
// nothing to scrape), which must not see a second set of Go runtime
// families.
type Reconcile struct {
	Registry    *prometheus.Registry
	differences *prometheus.GaugeVec // campaign, kind
	lastRun     *prometheus.GaugeVec // campaign
}

// NewReconcile creates and registers the reconciliation families.
func NewReconcile() *Reconcile {
	r := &Reconcile{
		Registry: prometheus.NewRegistry(),
		differences: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flashsale_reconcile_differences",
			Help: "Differences between Redis and MySQL the last reconciliation of a campaign found, by kind (oversold: its active orders hold more units than its stock).",
		}, []string{"campaign", "kind"}),
		lastRun: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flashsale_reconcile_last_run_timestamp_seconds", Help: "When a campaign was last reconciled (Unix time).",
		}, []string{"campaign"}),
	}
	r.Registry.MustRegister(r.differences, r.lastRun)
	return r
}

// Record sets a campaign's differences: the count of each of kinds (zero
// unless counted in found) and the time of the run.
func (r *Reconcile) Record(campaign string, kinds []string, found map[string]int, at time.Time) {
	for _, k := range kinds {
		r.differences.WithLabelValues(campaign, k).Set(float64(found[k]))
	}
	r.lastRun.WithLabelValues(campaign).Set(float64(at.UnixMilli()) / 1000)
}
