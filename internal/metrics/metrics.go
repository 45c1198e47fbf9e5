// Package metrics defines flashsale's Prometheus collectors, one set per
// process, registered on a registry the caller owns (no global state).
package metrics

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds every collector the roles update.
type Metrics struct {
	Registry         *prometheus.Registry
	Requests         *CounterVec          // route, code
	Refusals         *CounterVec          // reason
	PublishLatency   prometheus.Histogram // seconds
	WorkerBatchSize  prometheus.Histogram // messages per Lua call
	Deductions       *CounterVec          // result
	PersistLatency   prometheus.Histogram // seconds
	ResultsDelivered *CounterVec          // channel: ws, poll
	WebSocketClients prometheus.Gauge     //
	PoisonMessages   prometheus.Counter   //
	LatePayments     prometheus.Counter   // payments for orders that had ended
}

// New creates and registers the collectors on a fresh registry.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &Metrics{
		Registry: reg,
		Requests: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_http_requests_total", Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		Refusals: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_admit_refusals_total", Help: "Purchase requests refused at the gateway, by reason.",
		}, []string{"reason"}),
		PublishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_queue_publish_seconds", Help: "Queue publish latency.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		WorkerBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_worker_batch_size", Help: "Requests deducted per Lua call.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		Deductions: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_deductions_total", Help: "Final results decided by the worker, by result.",
		}, []string{"result"}),
		PersistLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_order_persist_seconds", Help: "Latency of one batched order insert.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		ResultsDelivered: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_results_delivered_total", Help: "Final results delivered to shoppers, by channel.",
		}, []string{"channel"}),
		WebSocketClients: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_websocket_clients", Help: "Open WebSocket connections.",
		}),
		PoisonMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_worker_poison_messages_total", Help: "Messages given up after repeated failures.",
		}),
		LatePayments: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_late_payments_total",
			Help: "Payments that arrived for an order already expired or cancelled, recorded refund_required.",
		}),
	}
	for _, c := range []prometheus.Collector{m.Requests, m.Refusals, m.PublishLatency, m.WorkerBatchSize,
		m.Deductions, m.PersistLatency, m.ResultsDelivered, m.WebSocketClients, m.PoisonMessages, m.LatePayments} {
		f(c)
	}
	return m
}

// GinMiddleware counts requests by route template (not raw path, so ids do
// not explode the label set) and status code. The counter of each route and
// code is looked up once and kept: there are a few dozen, and formatting the
// code and hashing both labels on every request is measurable on the
// sold-out path, which does little else.
func (m *Metrics) GinMiddleware() gin.HandlerFunc {
	type key struct {
		route string
		code  int
	}
	var counters sync.Map // key → prometheus.Counter
	return func(c *gin.Context) {
		c.Next()
		k := key{route: c.FullPath(), code: c.Writer.Status()}
		if k.route == "" {
			k.route = "unmatched"
		}
		ctr, ok := counters.Load(k)
		if !ok {
			ctr, _ = counters.LoadOrStore(k, m.Requests.WithLabelValues(k.route, strconv.Itoa(k.code)))
		}
		ctr.(prometheus.Counter).Inc()
	}
}

// CounterVec is a prometheus.CounterVec that keeps the child of every label
// value it hands out. flashsale's label values are few and fixed (statuses,
// refusal reasons, channels), and the plain WithLabelValues hashes them and
// takes a lock on every call, on paths that run once per request. Children
// are never deleted: Delete or Reset on the embedded vector would leave the
// kept ones counting outside the registry.
type CounterVec struct {
	*prometheus.CounterVec
	children sync.Map // label values joined by "\xff" → prometheus.Counter
}

func newCounterVec(opts prometheus.CounterOpts, labels []string) *CounterVec {
	return &CounterVec{CounterVec: prometheus.NewCounterVec(opts, labels)}
}

// WithLabelValues returns the counter of the label values, as
// prometheus.CounterVec.WithLabelValues does (and panics as it does on a
// wrong number of values).
func (v *CounterVec) WithLabelValues(lvs ...string) prometheus.Counter {
	key := ""
	if len(lvs) == 1 {
		key = lvs[0]
	} else {
		key = strings.Join(lvs, "\xff")
	}
	if c, ok := v.children.Load(key); ok {
		return c.(prometheus.Counter)
	}
	c, _ := v.children.LoadOrStore(key, v.CounterVec.WithLabelValues(lvs...))
	return c.(prometheus.Counter)
}

// Since observes the seconds since start on h.
func Since(h prometheus.Observer, start time.Time) { h.Observe(time.Since(start).Seconds()) }
