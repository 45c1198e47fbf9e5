package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// BenchmarkDeductShards measures deduct.lua on one Redis and on the cluster
// with the same load: 6 campaigns (on the cluster, 2 per master), 8 callers
// each deciding batches of 128 of a campaign of its own turn, as 8 worker
// partitions do. The deductions/s of the two show what sharding gives on
// this machine; .ci/bench.sh runs it (BENCH_REDIS_CLUSTER=1) and
// docs/BENCHMARKS.md ("Issue 18") records it.
func BenchmarkDeductShards(b *testing.B) {
	for _, srv := range []struct {
		name string
		rdb  func(b *testing.B) redis.UniversalClient
	}{
		{"redis", func(b *testing.B) redis.UniversalClient { return testenv.Redis(b) }},
		{"cluster", func(b *testing.B) redis.UniversalClient { return testenv.RedisCluster(b) }},
	} {
		b.Run(srv.name, func(b *testing.B) {
			s := New(srv.rdb(b))
			campaigns := benchCampaigns(b, s, 6)
			const batchSize, callers = 128, 8
			var n, next atomic.Int64
			b.SetParallelism(callers) // × GOMAXPROCS goroutines; Redis, not this process, is the bottleneck
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				c := campaigns[int(next.Add(1))%len(campaigns)]
				batch := make([]model.Deduction, batchSize)
				for pb.Next() {
					base := n.Add(batchSize)
					for i := range batch {
						id := base + int64(i)
						batch[i] = model.Deduction{RequestID: benchRequestID(c.ID, int(id)), UserID: fmt.Sprintf("u%d", id), Quantity: 1, OrderID: "o"}
					}
					r, err := s.Deduct(context.Background(), c.ID, batch)
					if err != nil {
						b.Errorf("Deduct: %v", err)
						return
					}
					if r.Results[batchSize-1].Status != model.StatusSuccess {
						b.Errorf("Deduct: got %s, want success", r.Results[batchSize-1].Status)
						return
					}
				}
			})
			b.ReportMetric(float64(n.Load())/b.Elapsed().Seconds(), "deductions/s")
		})
	}
}

// benchCampaigns preloads k campaigns with stock enough for any b.N; on a
// cluster they are picked so that every master holds as many.
func benchCampaigns(b *testing.B, s *Store, k int) []model.Campaign {
	b.Helper()
	perMaster := map[string]int{}
	masters := 1
	cc, isCluster := s.rdb.(*redis.ClusterClient)
	if isCluster {
		var m atomic.Int64
		if err := cc.ForEachMaster(b.Context(), func(context.Context, *redis.Client) error { m.Add(1); return nil }); err != nil {
			b.Fatal(err)
		}
		masters = int(m.Load())
	}
	var out []model.Campaign
	for tries := 0; len(out) < k && tries < 1000; tries++ {
		c := model.Campaign{ID: testenv.Name(b, "bench"), Name: "bench", Stock: model.MaxStock, PerUserLimit: model.MaxQuantity,
			StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
		addr := "redis"
		if isCluster {
			m, err := cc.MasterForKey(b.Context(), campaignKeys(c.ID).meta)
			if err != nil {
				b.Fatal(err)
			}
			addr = m.Options().Addr
		}
		if perMaster[addr] >= (k+masters-1)/masters {
			continue
		}
		perMaster[addr]++
		if _, err := s.Rebuild(b.Context(), c, nil, nil); err != nil {
			b.Fatalf("load: %v", err)
		}
		out = append(out, c)
	}
	if len(out) < k {
		b.Fatalf("got %d campaigns spread over %d masters, want %d", len(out), masters, k)
	}
	return out
}
