// Package metrics defines flashsale's Prometheus collectors, one set per
// process, registered on a registry the caller owns (no global state).
package metrics

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Role names a process's role; each exports the families of its own work
// besides those every process exports.
type Role string

// The roles.
const (
	Gateway  Role = "gateway"
	Worker   Role = "worker"
	Notifier Role = "notifier"
)

// Metrics holds every collector the roles update. Each process registers
// only the families of the roles it runs (New); the collectors of the
// others exist but are not exported, so code updates them unconditionally.
type Metrics struct {
	Registry *prometheus.Registry
	role     string // the roles joined by "+", build_info's role label

	// Every process.
	buildInfo       *prometheus.GaugeVec // version, role
	Requests        *CounterVec          // route, code
	RequestDuration *prometheus.HistogramVec
	RedisUp         prometheus.Gauge   // 0 during an outage (store.Guard)
	RedisOutages    prometheus.Counter // outages begun
	// The listeners' connection budgets (httpapi.ConnBudget).
	ConnsRefused *CounterVec // listener, reason
	ConnsClosed  *CounterVec // listener, reason
	// Degraded mode (gateway, worker): campaigns decided in MySQL while
	// Redis is out.
	Degraded          *prometheus.GaugeVec // role
	DegradedDecisions *CounterVec          // role, result
	DegradedSeconds   *CounterVec          // role
	// Gateway.
	Refusals         *CounterVec          // reason
	PublishLatency   prometheus.Histogram // seconds
	PublishUnknown   prometheus.Counter   // requests published with an unknown outcome, kept admitted
	MaybeNotEnqueued prometheus.Counter   // admissions answered 503 that may hold a queued marker (the not-enqueued sweep ends them)
	LatePayments     prometheus.Counter   // payments for orders that had ended
	CachedCampaigns  *prometheus.GaugeVec // kind: known, unknown (ids naming no campaign)
	// Gateway and worker: the Lua scripts they run (ScriptHook), and the
	// campaigns they restored from MySQL after Redis lost them
	// (reconcile.Restorer).
	ScriptDuration *prometheus.HistogramVec // script
	Restores       *CounterVec              // trigger
	// Worker.
	WorkerBatchSize prometheus.Histogram // messages per Lua call
	Deductions      *CounterVec          // result
	PersistLatency  prometheus.Histogram // seconds
	PoisonMessages  prometheus.Counter
	HeldBatches     prometheus.Counter     // deliveries held (queue.ErrHeld)
	NotEnqueued     prometheus.Counter     // requests the not-enqueued sweep rejected: no worker saw them
	LeaseEvents     *prometheus.CounterVec // topic, event (PartitionEvent)
	PartitionsOwned *prometheus.GaugeVec   // topic
	// ReplicaAckLatency and ReplicaShortfalls follow redis.min_replicas_ack
	// (ObserveReplicaAck).
	ReplicaAckLatency prometheus.Histogram // seconds
	ReplicaShortfalls prometheus.Counter
	// BucketTransfers and BucketUnitsMoved count stock moved between a
	// campaign's buckets (ObserveTransfer).
	BucketTransfers  *prometheus.CounterVec // outcome
	BucketUnitsMoved prometheus.Counter
	// Notifier.
	ResultsDelivered       *CounterVec // channel: ws, poll
	WebSocketClients       prometheus.Gauge
	WebSocketSubscriptions prometheus.Gauge
	ResultsChannels        prometheus.Gauge // campaigns whose results channel the notifier subscribes to
}

// WatchConnections exports the connections a listener holds open, read
// from open at each scrape.
func (m *Metrics) WatchConnections(listener string, open func() int) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flashsale_http_connections", Help: "Connections a listener holds open, WebSockets included.",
		ConstLabels: prometheus.Labels{"listener": listener},
	}, func() float64 { return float64(open()) }))
}

// New creates the collectors and registers, on a fresh registry, those
// every process exports (the Go runtime's and the process's, build info,
// HTTP requests) and those of the given roles; with no role given, those of
// every role.
func New(roles ...Role) *Metrics {
	if len(roles) == 0 {
		roles = []Role{Gateway, Worker, Notifier}
	}
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = string(r)
	}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		role:     strings.Join(names, "+"),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flashsale_build_info", Help: "Always 1: the version and the roles this process runs.",
		}, []string{"version", "role"}),
		Requests: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_http_requests_total", Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flashsale_http_request_duration_seconds", Help: "HTTP request latency by route (WebSocket upgrades excluded: they last as long as the connection).",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}, []string{"route"}),
		Refusals: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_admit_refusals_total", Help: "Purchase requests refused at the gateway, by reason.",
		}, []string{"reason"}),
		PublishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_queue_publish_seconds", Help: "Queue publish latency.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		PublishUnknown: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_publish_unknown_total",
			Help: "Purchase requests whose publish outcome was unknown (the queue may have stored them), admitted all the same.",
		}),
		MaybeNotEnqueued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_maybe_not_enqueued_total",
			Help: "Purchases answered 503 whose admission may have been stored all the same (admit.lua's reply lost, or a withdraw that failed), with no message: a stored one is rejected (not_enqueued) by the workers' not-enqueued sweep.",
		}),
		NotEnqueued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_not_enqueued_total",
			Help: "Admitted requests the workers' not-enqueued sweep rejected (not_enqueued): still queued once the queue had moved past them: a request admitted worker.not_enqueued_grace after them decided; or, worker.max_queue_delay after their admission, one numbered after them decided; or their sale ended worker.max_queue_delay ago (never published, or lost).",
		}),
		LatePayments: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_late_payments_total",
			Help: "Payments that arrived for an order already expired or cancelled, recorded refund_required.",
		}),
		ScriptDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flashsale_redis_script_seconds", Help: "Lua script call latency by script (a pipelined call counts its pipeline's round trip).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"script"}),
		Restores: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_restores_total",
			Help: "Campaigns this process rebuilt from MySQL after Redis lost them (restart, failover to a replica a load behind), without an operator, by what noticed: admit (a gateway), deduct (a worker's batch), ledger_moved (a worker's orders refused by MySQL), poll (a notifier's poll or subscribe of a request Redis no longer knows), handback (a campaign MySQL decided while Redis was out, given back to Redis).",
		}, []string{"trigger"}),
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
		PoisonMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_worker_poison_messages_total", Help: "Messages given up after repeated failures.",
		}),
		HeldBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_worker_held_batches_total",
			Help: "Deliveries of a batch held rather than decided or stored: its campaign paused or not loaded, Redis or MySQL unable to take it. Redelivered for as long as the hold lasts, never given up.",
		}),
		LeaseEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_queue_lease_events_total",
			Help: "Queue partitions this process's consumers acquired, released (a stop, a rebalance) or lost (the lease expired or was taken), by topic.",
		}, []string{"topic", "event"}),
		PartitionsOwned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flashsale_queue_partitions_owned", Help: "Queue partitions this process's consumers hold, by topic.",
		}, []string{"topic"}),
		ReplicaAckLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flashsale_replica_ack_seconds", Help: "Latency of a Redis write (a deduction, a queue publish, a transfer or release) together with its WAIT for redis.min_replicas_ack replicas (one round trip).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		ReplicaShortfalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_replica_ack_shortfalls_total", Help: "Writes that fewer than redis.min_replicas_ack replicas acknowledged in time: a deduction's batch was handed back, a publish answered as of unknown outcome, a transfer or release left to be repeated.",
		}),
		BucketTransfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_bucket_transfers_total", Help: "Stock transfers between a bucketed campaign's buckets, by outcome: moved, empty (the donor had none), recovered (a pending one completed), failed (left pending).",
		}, []string{"outcome"}),
		BucketUnitsMoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_bucket_units_moved_total", Help: "Units moved between a bucketed campaign's buckets (moved and recovered transfers).",
		}),
		ResultsDelivered: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_results_delivered_total", Help: "Final results delivered to shoppers, by channel.",
		}, []string{"channel"}),
		WebSocketClients: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_websocket_clients", Help: "Open WebSocket connections.",
		}),
		WebSocketSubscriptions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_websocket_subscriptions", Help: "Request ids WebSocket clients wait on.",
		}),
		ResultsChannels: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_results_channels", Help: "Campaigns whose sharded results channel the notifier subscribes to: those its shoppers wait on, and for 30 s after.",
		}),
		ConnsRefused: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_http_connections_refused_total",
			Help: "Connections a listener refused, by reason: per_ip (the address holds http.max_conns_per_ip; 429), process (http.max_conns open and none to close for room; 503), fd_limit (the accept failed: the process is out of descriptors).",
		}, []string{"listener", "reason"}),
		ConnsClosed: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_http_connections_closed_total",
			Help: "Connections a listener closed to make room at http.max_conns, by reason: idle (the one idle longest between requests), slow_header (one that had not sent its first request within a second).",
		}, []string{"listener", "reason"}),
		RedisUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_redis_up", Help: "1 while Redis answers this process's calls, 0 from a call that got no answer within redis.timeout to the next answer.",
		}),
		RedisOutages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_redis_outages_total", Help: "Redis outages this process saw begin: a call got no answer within redis.timeout after the last one that did.",
		}),
		Degraded: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flashsale_degraded_campaigns", Help: "Campaigns this process decides in MySQL because Redis does not answer (degraded mode), by role.",
		}, []string{"role"}),
		DegradedDecisions: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_degraded_decisions_total", Help: "Purchases this process decided in MySQL while Redis was out (degraded mode), by role and result.",
		}, []string{"role", "result"}),
		DegradedSeconds: newCounterVec(prometheus.CounterOpts{
			Name: "flashsale_degraded_seconds_total", Help: "Seconds campaigns spent decided in MySQL by this process, added when each is decided in Redis again, by role.",
		}, []string{"role"}),
		CachedCampaigns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flashsale_gateway_cached_campaigns",
			Help: "Campaign ids in the gateway's cache: known campaigns, and unknown ids (bounded, short-lived).",
		}, []string{"kind"}),
	}
	m.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.buildInfo, m.Requests, m.RequestDuration, m.ConnsRefused, m.ConnsClosed, m.RedisUp, m.RedisOutages, m.Degraded, m.DegradedDecisions, m.DegradedSeconds)
	m.RedisUp.Set(1)
	has := func(r Role) bool { return slices.Contains(roles, r) }
	if has(Gateway) {
		m.Registry.MustRegister(m.Refusals, m.PublishLatency, m.PublishUnknown, m.MaybeNotEnqueued, m.LatePayments, m.CachedCampaigns)
	}
	if has(Gateway) || has(Worker) {
		m.Registry.MustRegister(m.ScriptDuration, m.Restores)
	}
	if has(Gateway) {
		m.Restores.WithLabelValues("admit")
	}
	if has(Worker) {
		m.Restores.WithLabelValues("deduct")
		m.Restores.WithLabelValues("ledger_moved")
	}
	if has(Worker) {
		m.Registry.MustRegister(m.WorkerBatchSize, m.Deductions, m.PersistLatency, m.PoisonMessages, m.HeldBatches, m.NotEnqueued, m.LeaseEvents, m.PartitionsOwned,
			m.ReplicaAckLatency, m.ReplicaShortfalls, m.BucketTransfers, m.BucketUnitsMoved)
		for _, o := range []string{"moved", "empty", "recovered", "failed"} {
			m.BucketTransfers.WithLabelValues(o)
		}
		// Zero from the start, so a rate over them has a first point.
		for _, r := range []string{"success", "sold_out", "limit_exceeded", "rejected"} {
			m.Deductions.WithLabelValues(r)
		}
	}
	if has(Notifier) {
		m.Registry.MustRegister(m.ResultsDelivered, m.WebSocketClients, m.WebSocketSubscriptions, m.ResultsChannels)
		m.ResultsDelivered.WithLabelValues("ws")
		m.ResultsDelivered.WithLabelValues("poll")
	}
	return m
}

// ObserveRedis records a Redis outage's start (up false) or end
// (store.Guard.Observe).
func (m *Metrics) ObserveRedis(up bool) {
	if up {
		m.RedisUp.Set(1)
		return
	}
	m.RedisUp.Set(0)
	m.RedisOutages.Inc()
}

// ObserveReplicaAck records one deduction's wait for replicas
// (store.ReplicaAck.Observe) that wanted replicas; a wait answered by fewer
// is a shortfall.
func (m *Metrics) ObserveReplicaAck(latency time.Duration, acked, wanted int) {
	m.ReplicaAckLatency.Observe(latency.Seconds())
	if acked < wanted {
		m.ReplicaShortfalls.Inc()
	}
}

// ObserveTransfer records one stock transfer between buckets
// (store.WithTransferObserver).
func (m *Metrics) ObserveTransfer(outcome string, units int64) {
	m.BucketTransfers.WithLabelValues(outcome).Inc()
	m.BucketUnitsMoved.Add(float64(units))
}

// SetBuildInfo sets flashsale_build_info to 1 for version and this
// process's roles.
func (m *Metrics) SetBuildInfo(version string) {
	m.buildInfo.WithLabelValues(version, m.role).Set(1)
}

// PartitionEvent counts a queue consumer's lease event and keeps the count
// of partitions held (queue.PartitionObserver).
func (m *Metrics) PartitionEvent(topic string, _ int, event string) {
	m.LeaseEvents.WithLabelValues(topic, event).Inc()
	switch event {
	case "acquired":
		m.PartitionsOwned.WithLabelValues(topic).Inc()
	case "released", "lost":
		m.PartitionsOwned.WithLabelValues(topic).Dec()
	}
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
	var counters sync.Map  // key → prometheus.Counter
	var durations sync.Map // route → prometheus.Observer
	return func(c *gin.Context) {
		start := time.Now()
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
		if c.IsWebsocket() {
			return
		}
		obs, ok := durations.Load(k.route)
		if !ok {
			obs, _ = durations.LoadOrStore(k.route, m.RequestDuration.WithLabelValues(k.route))
		}
		Since(obs.(prometheus.Observer), start)
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
