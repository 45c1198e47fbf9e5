package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// BenchmarkHandleReplicaAck is BenchmarkHandle's all-success case on the
// shared test cluster, without a wait for replicas (ack=0) and with
// redis.min_replicas_ack 1 (ack=1), in the same run: what WAIT costs a
// partition once the order INSERT and the publication are counted too
// (docs/BENCHMARKS.md, issue 18).
func BenchmarkHandleReplicaAck(b *testing.B) {
	rdb := testenv.RedisCluster(b)
	for _, size := range []int{128, 512} {
		for _, ack := range []int{0, 1} {
			b.Run(fmt.Sprintf("batch=%d/ack=%d", size, ack), func(b *testing.B) {
				st := store.New(rdb, store.WithReplicaAck(store.ReplicaAck{Replicas: ack, Timeout: time.Second}))
				db, err := sqlstore.Open(b.Context(), sqlstore.DriverMySQL, testenv.MySQLDSN(b))
				if err != nil {
					b.Fatalf("open db: %v", err)
				}
				b.Cleanup(func() { _ = db.Close() })
				c := model.Campaign{ID: testenv.Name(b, "wr-"), Name: "bench", Stock: model.MaxStock, PerUserLimit: 1,
					StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
				if _, err := db.CreateCampaign(b.Context(), c); err != nil {
					b.Fatalf("create campaign: %v", err)
				}
				if c, err = reconcile.Load(b.Context(), db, st, c.ID); err != nil {
					b.Fatalf("load: %v", err)
				}
				handle := queue.Serial(New(discard(), st, db, metrics.New(), Options{}).Decide)
				n := 0
				for b.Loop() {
					b.StopTimer()
					msgs := benchMessages(c, n, size)
					n += size
					b.StartTimer()
					if err := handle(b.Context(), msgs); err != nil {
						b.Fatalf("handle: %v", err)
					}
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "deductions/s")
			})
		}
	}
}
