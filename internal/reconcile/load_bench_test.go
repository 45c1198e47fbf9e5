package reconcile

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// BenchmarkLoad measures the stock ledger's rebuild from MySQL (Load: the
// epoch bump, reading the orders, one rebuild script), the recovery after a
// failover lost deductions (docs/RELIABILITY.md), for a campaign with 10k
// and 100k orders, on the test Redis and on the shared test cluster.
func BenchmarkLoad(b *testing.B) {
	for _, orders := range []int{10_000, 100_000} {
		for _, r := range []struct {
			name string
			rdb  func(b *testing.B) redis.UniversalClient
		}{
			{"redis", func(b *testing.B) redis.UniversalClient { return testenv.Redis(b) }},
			{"cluster", func(b *testing.B) redis.UniversalClient { return testenv.RedisCluster(b) }},
		} {
			b.Run(fmt.Sprintf("orders=%d/%s", orders, r.name), func(b *testing.B) {
				db, err := sqlstore.Open(b.Context(), sqlstore.DriverMySQL, testenv.MySQLDSN(b))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = db.Close() })
				st := store.New(r.rdb(b))
				start := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
				c := model.Campaign{ID: testenv.Name(b, "load-"), Name: "load", Stock: int64(orders), PerUserLimit: 1,
					StartAt: start, EndAt: start.Add(time.Hour)}
				if _, err := db.CreateCampaign(b.Context(), c); err != nil {
					b.Fatal(err)
				}
				if c, err = Load(b.Context(), db, st, c.ID); err != nil {
					b.Fatal(err)
				}
				now := time.Now()
				for from := 0; from < orders; from += 5000 {
					var batch []model.Order
					for i := from; i < min(from+5000, orders); i++ {
						rid := model.FormatRequestID(c.ID, fmt.Sprintf("%032x", i+1))
						batch = append(batch, model.Order{ID: model.OrderIDOf(rid), RequestID: rid, CampaignID: c.ID,
							UserID: fmt.Sprintf("u%d", i), Quantity: 1, Status: model.OrderPendingPayment,
							CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)})
					}
					if err := db.InsertOrders(b.Context(), batch, model.Epochs{c.ID: c.Epoch}); err != nil {
						b.Fatal(err)
					}
				}
				for b.Loop() {
					if _, err := Load(b.Context(), db, st, c.ID); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/rebuild")
			})
		}
	}
}
