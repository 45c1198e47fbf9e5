package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// BenchmarkDeductReplicaAck measures deduct.lua on the shared test cluster
// without a wait (ack=0) and with WAIT for one replica (ack=1), in the same
// run: the cost of redis.min_replicas_ack (docs/BENCHMARKS.md, issue 18).
func BenchmarkDeductReplicaAck(b *testing.B) {
	rdb := testenv.RedisCluster(b)
	for _, size := range []int{16, 128} {
		for _, ack := range []int{0, 1} {
			b.Run(fmt.Sprintf("batch=%d/ack=%d", size, ack), func(b *testing.B) {
				s := New(rdb, WithReplicaAck(ReplicaAck{Replicas: ack, Timeout: time.Second}))
				c := model.Campaign{ID: testenv.Name(b, "bench"), Name: "bench", Stock: model.MaxStock, PerUserLimit: model.MaxQuantity,
					StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
				if _, err := s.Rebuild(b.Context(), c, nil, nil); err != nil {
					b.Fatalf("load: %v", err)
				}
				batch := make([]model.Deduction, size)
				n := 0
				for b.Loop() {
					for i := range batch {
						n++
						batch[i] = model.Deduction{RequestID: benchRequestID(c.ID, n), UserID: fmt.Sprintf("u%d", n), Quantity: 1, OrderID: "o"}
					}
					if _, err := s.Deduct(b.Context(), c.ID, batch); err != nil {
						b.Fatalf("Deduct: %v", err)
					}
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "deductions/s")
			})
		}
	}
}
