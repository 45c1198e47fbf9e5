// Package metrics defines flashsale's Prometheus collectors, one set per
// process, registered on a registry the caller owns (no global state).
package metrics

import (
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds every collector the roles update.
type Metrics struct {
	Registry         *prometheus.Registry
	Requests         *prometheus.CounterVec // route, code
	Refusals         *prometheus.CounterVec // reason
	PublishLatency   prometheus.Histogram   // seconds
	WorkerBatchSize  prometheus.Histogram   // messages per Lua call
	Deductions       *prometheus.CounterVec // result
	PersistLatency   prometheus.Histogram   // seconds
	ResultsDelivered *prometheus.CounterVec // channel: ws, poll
	WebSocketClients prometheus.Gauge       //
	PoisonMessages   prometheus.Counter     //
}

// New creates and registers the collectors on a fresh registry.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &Metrics{
		Registry: reg,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_http_requests_total", Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		Refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_admission_refusals_total", Help: "Purchase requests refused at the gateway, by reason.",
		}, []string{"reason"}),
		PublishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_queue_publish_seconds", Help: "Queue publish latency.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		WorkerBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_worker_batch_size", Help: "Requests deducted per Lua call.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		Deductions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_deductions_total", Help: "Final results decided by the worker, by result.",
		}, []string{"result"}),
		PersistLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_order_persist_seconds", Help: "Latency of one batched order insert.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		ResultsDelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_results_delivered_total", Help: "Final results delivered to shoppers, by channel.",
		}, []string{"channel"}),
		WebSocketClients: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_websocket_clients", Help: "Open WebSocket connections.",
		}),
		PoisonMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_worker_poison_messages_total", Help: "Messages given up after repeated failures.",
		}),
	}
	for _, c := range []prometheus.Collector{m.Requests, m.Refusals, m.PublishLatency, m.WorkerBatchSize,
		m.Deductions, m.PersistLatency, m.ResultsDelivered, m.WebSocketClients, m.PoisonMessages} {
		f(c)
	}
	return m
}

// GinMiddleware counts requests by route template (not raw path, so ids do
// not explode the label set) and status code.
func (m *Metrics) GinMiddleware() gin.HandlerFunc {
	return func(c *gin.Context) {
		c.Next()
		route := c.FullPath()
		if route == "" {
			route = "unmatched"
		}
		m.Requests.WithLabelValues(route, strconv.Itoa(c.Writer.Status())).Inc()
	}
}

// Since observes the seconds since start on h.
func Since(h prometheus.Observer, start time.Time) { h.Observe(time.Since(start).Seconds()) }
