package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"flashsale/internal/metrics"
	"flashsale/internal/sqlstore"
	"flashsale/internal/store"
	"flashsale/internal/testenv"
	"flashsale/model"
	"flashsale/queue"
)

// BenchmarkHandle measures the worker's whole handler on real Redis and
// MariaDB: decode, one deduct.lua call, the batched order INSERT and the
// results publication, per delivered batch. deductions/s is what one
// partition (one campaign) can decide; the queue's own read and
// acknowledgement are not included.
//
// "success" sells every request (an order row each: the insert-heavy case);
// "flash sale" sells the first 1,000 units and answers sold_out after, the
// mix of a real sale.
func BenchmarkHandle(b *testing.B) {
	for _, tc := range []struct {
		name  string
		stock int64
	}{
		{"success", model.MaxStock},
		{"flash_sale", 1000},
	} {
		for _, size := range []int{128, 512} {
			b.Run(fmt.Sprintf("%s/batch=%d", tc.name, size), func(b *testing.B) {
				benchHandle(b, tc.stock, size)
			})
		}
	}
}

func benchHandle(b *testing.B, stock int64, size int) {
	st := store.New(testenv.Redis(b))
	db, err := sqlstore.Open(b.Context(), sqlstore.DriverMySQL, testenv.MySQLDSN(b))
	if err != nil {
		b.Fatalf("open db: %v", err)
	}
	b.Cleanup(func() { _ = db.Close() })
	c := model.Campaign{ID: testenv.UniqueName("wb-"), Name: "bench", Stock: stock, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
	if _, err := db.CreateCampaign(b.Context(), c); err != nil {
		b.Fatalf("create campaign: %v", err)
	}
	if _, err := st.Preload(b.Context(), c, time.Now(), false); err != nil {
		b.Fatalf("preload: %v", err)
	}
	b.Cleanup(func() {
		// b.Context is already cancelled when cleanups run.
		ctx := context.Background()
		keys, _ := st.Client().Keys(ctx, "fs:{"+c.ID+"}*").Result()
		if len(keys) > 0 {
			_ = st.Client().Del(ctx, keys...).Err()
		}
	})
	w := New(discard(), st, db, metrics.New(), Options{})
	msgs := make([]queue.Message, size)
	n := 0
	for b.Loop() {
		b.StopTimer()
		for i := range msgs {
			n++
			rid := model.FormatRequestID(c.ID, fmt.Sprintf("%032x", n))
			body, _ := model.EncodePurchaseRequest(model.PurchaseRequest{RequestID: rid, CampaignID: c.ID,
				UserID: fmt.Sprintf("u%d", n), Quantity: 1, AcceptedAt: time.Now()})
			msgs[i] = queue.Message{ID: rid, Key: c.ID, Body: body, Attempt: 1}
		}
		b.StartTimer()
		if err := w.Handle(b.Context(), msgs); err != nil {
			b.Fatalf("Handle: %v", err)
		}
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "deductions/s")
}
