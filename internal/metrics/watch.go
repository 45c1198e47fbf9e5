package metrics

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The families below are read when Prometheus scrapes, from where the state
// lives (Redis, the database, the queue), rather than kept up to date by the
// code that changes it: several processes change it, and a value read at
// scrape time is never stale. A read that fails leaves its family out of
// that scrape rather than failing the scrape, so the other families, among
// them flashsale_dependency_up, still say what is wrong.

// scrapeTimeout bounds each read a scrape makes; Prometheus's own default
// scrape timeout is 10 s.
const scrapeTimeout = 3 * time.Second

// collector is a prometheus.Collector of fixed descriptors whose values
// collect reads at scrape time.
type collector struct {
	descs   []*prometheus.Desc
	collect func(ctx context.Context, ch chan<- prometheus.Metric)
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	c.collect(ctx, ch)
}

// WatchDependencies exports flashsale_dependency_up{dependency}: 1 while the
// check of that name (those /readyz runs: redis, mysql or sqlite, queue,
// notifier) passes, 0 while it fails. The checks run concurrently.
func (m *Metrics) WatchDependencies(checks map[string]func(context.Context) error) {
	up := prometheus.NewDesc("flashsale_dependency_up",
		"Whether a dependency this process needs answers its readiness check (1) or not (0).", []string{"dependency"}, nil)
	m.Registry.MustRegister(collector{descs: []*prometheus.Desc{up}, collect: func(ctx context.Context, ch chan<- prometheus.Metric) {
		var wg sync.WaitGroup
		for name, check := range checks {
			wg.Go(func() {
				v := 1.0
				if check(ctx) != nil {
					v = 0
				}
				ch <- prometheus.MustNewConstMetric(up, prometheus.GaugeValue, v, name)
			})
		}
		wg.Wait()
	}})
}

// Backlog is what waits in one queue partition (queue.Backlog).
type Backlog struct {
	Partition    int
	Lag, Pending int64
	OldestAge    time.Duration
}

// WatchBacklog exports, per topic and partition, the messages not yet
// handed to a consumer (flashsale_queue_lag_messages), those handed out and
// not acknowledged (flashsale_queue_pending_messages) and the age of the
// oldest unacknowledged one (flashsale_queue_oldest_message_age_seconds),
// read with read for each of topics.
func (m *Metrics) WatchBacklog(topics []string, read func(ctx context.Context, topic string) ([]Backlog, error)) {
	labels := []string{"topic", "partition"}
	lag := prometheus.NewDesc("flashsale_queue_lag_messages",
		"Messages of a queue partition not yet handed to any consumer.", labels, nil)
	pending := prometheus.NewDesc("flashsale_queue_pending_messages",
		"Messages of a queue partition handed to a consumer and not acknowledged.", labels, nil)
	oldest := prometheus.NewDesc("flashsale_queue_oldest_message_age_seconds",
		"Age of a queue partition's oldest unacknowledged message (0 when it is empty): how long the longest-waiting request has waited for its result.", labels, nil)
	m.Registry.MustRegister(collector{descs: []*prometheus.Desc{lag, pending, oldest}, collect: func(ctx context.Context, ch chan<- prometheus.Metric) {
		for _, topic := range topics {
			backlog, err := read(ctx, topic)
			if err != nil {
				continue
			}
			for _, b := range backlog {
				p := strconv.Itoa(b.Partition)
				ch <- prometheus.MustNewConstMetric(lag, prometheus.GaugeValue, float64(b.Lag), topic, p)
				ch <- prometheus.MustNewConstMetric(pending, prometheus.GaugeValue, float64(b.Pending), topic, p)
				ch <- prometheus.MustNewConstMetric(oldest, prometheus.GaugeValue, b.OldestAge.Seconds(), topic, p)
			}
		}
	}})
}

// WatchStock exports flashsale_stock_remaining{campaign}, the units left on
// sale of each campaign read returns (campaign id → units).
func (m *Metrics) WatchStock(read func(ctx context.Context) (map[string]int64, error)) {
	remaining := prometheus.NewDesc("flashsale_stock_remaining",
		"Units still on sale, per campaign whose sale is open and loaded into Redis.", []string{"campaign"}, nil)
	m.Registry.MustRegister(collector{descs: []*prometheus.Desc{remaining}, collect: func(ctx context.Context, ch chan<- prometheus.Metric) {
		stock, err := read(ctx)
		if err != nil {
			return
		}
		for id, units := range stock {
			ch <- prometheus.MustNewConstMetric(remaining, prometheus.GaugeValue, float64(units), id)
		}
	}})
}
