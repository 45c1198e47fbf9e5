package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// benchStore returns a store on the test Redis and a preloaded campaign with
// stock enough for any b.N, whose keys are deleted at cleanup.
func benchStore(b *testing.B) (*Store, model.Campaign) {
	b.Helper()
	s := New(testenv.Redis(b))
	c := model.Campaign{ID: testenv.Name(b, "bench"), Name: "bench", Stock: model.MaxStock, PerUserLimit: model.MaxQuantity,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
	if _, err := s.Rebuild(b.Context(), c, nil, nil); err != nil {
		b.Fatalf("load: %v", err)
	}
	b.Cleanup(func() {
		// b.Context is already cancelled when cleanups run.
		k := campaignKeys(c.ID)
		_ = s.rdb.Del(context.Background(), k.meta, k.stock, k.soldout, k.counters, k.users, k.results, k.idem,
			k.released, k.admissions, k.campaignLimit, k.userLimits, k.ipLimits).Err()
	})
	return s, c
}

// benchRequestID is a valid, unique request id without the cost of a random
// source, so the benchmark measures Redis and not crypto/rand.
func benchRequestID(campaignID string, n int) string {
	return model.FormatRequestID(campaignID, fmt.Sprintf("%032x", n))
}

// BenchmarkDeduct measures deduct.lua, one call per batch, every request a
// success by a distinct user (the most writes a request can cost). The
// deductions/s metric is what one worker partition can decide.
func BenchmarkDeduct(b *testing.B) {
	for _, size := range []int{1, 16, 128, 512} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			s, c := benchStore(b)
			batch := make([]model.Deduction, size)
			n := 0
			for b.Loop() {
				for i := range batch {
					n++
					batch[i] = model.Deduction{RequestID: benchRequestID(c.ID, n), UserID: fmt.Sprintf("u%d", n), Quantity: 1, OrderID: "o"}
				}
				r, err := s.Deduct(b.Context(), c.ID, batch)
				if err != nil {
					b.Fatalf("Deduct: %v", err)
				}
				if r.Results[size-1].Status != model.StatusSuccess {
					b.Fatalf("Deduct: got %s, want success", r.Results[size-1].Status)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "deductions/s")
		})
	}
}

// BenchmarkAdmit measures admit.lua with both rate limits on, one call per
// batch: the gateway's share of Redis work per purchase.
func BenchmarkAdmit(b *testing.B) {
	limits := model.RateLimits{UserRate: 1_000_000, UserBurst: 1_000_000, CampaignRate: 1_000_000, CampaignBurst: 1_000_000}
	for _, size := range []int{1, 16, 128, 512} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			s, c := benchStore(b)
			batch := make([]model.AdmitRequest, size)
			n := 0
			for b.Loop() {
				for i := range batch {
					n++
					batch[i] = model.AdmitRequest{RequestID: benchRequestID(c.ID, n), CampaignID: c.ID, UserID: fmt.Sprintf("u%d", n%10_000),
						Quantity: 1, IdempotencyKey: fmt.Sprintf("k%d", n)}
				}
				adms, err := s.Admit(b.Context(), c.ID, batch, limits)
				if err != nil {
					b.Fatalf("Admit: %v", err)
				}
				if adms[size-1].Code != model.Admitted {
					b.Fatalf("Admit: got code %d, want %d", adms[size-1].Code, model.Admitted)
				}
			}
			// The users' rate-limit keys expire on their own within a second.
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "admitted/s")
		})
	}
}

// BenchmarkAdmitLimits measures admit.lua in the shape of .ci/bench.sh's
// admit stage (batches of 30, one client IP, no Idempotency-Key) with the
// rate limits off, per user, and per user and IP (userip), and with 256 or
// 2048 shoppers (the name's number): a campaign's per-user TAT hash stays
// a listpack up to Redis's hash-max-listpack-entries (512 by default),
// which every field read and write then scans. Redis's CPU per purchase is the figure to compare
// (its /proc/<pid>/stat around the run; docs/BENCHMARKS.md).
func BenchmarkAdmitLimits(b *testing.B) {
	both := model.RateLimits{UserRate: 1_000_000, UserBurst: 1_000_000, IPRate: 1_000_000, IPBurst: 1_000_000}
	for _, tc := range []struct {
		name     string
		shoppers int
		limits   model.RateLimits
	}{
		{"none-256", 256, model.RateLimits{}},
		{"user-256", 256, model.RateLimits{UserRate: 1_000_000, UserBurst: 1_000_000}},
		{"userip-256", 256, both},
		{"userip-2048", 2048, both},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, c := benchStore(b)
			batch := make([]model.AdmitRequest, 30)
			n := 0
			for b.Loop() {
				for i := range batch {
					n++
					batch[i] = model.AdmitRequest{RequestID: benchRequestID(c.ID, n), CampaignID: c.ID,
						UserID: fmt.Sprintf("bench%d", n%tc.shoppers), Quantity: 1, ClientIP: "127.0.0.1"}
				}
				adms, err := s.Admit(b.Context(), c.ID, batch, tc.limits)
				if err != nil {
					b.Fatalf("Admit: %v", err)
				}
				if adms[len(batch)-1].Code != model.Admitted {
					b.Fatalf("Admit: got code %d, want %d", adms[len(batch)-1].Code, model.Admitted)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "admitted/s")
		})
	}
}

// BenchmarkDeductBuckets sells out one campaign of 20,000 units to 24,000
// distinct shoppers, 60 % of them in bucket 0 (which runs short and takes
// stock from the others), with one goroutine per bucket deciding its
// shoppers in batches of 128, as one worker per bucket partition would.
// deductions/s counts every request decided (success or sold out), the
// transfers included in the time. On one Redis the buckets share its one
// core: what it shows is the cost of the buckets, not a cluster's gain.
func BenchmarkDeductBuckets(b *testing.B) {
	const stock, demand, batchSize = 20_000, 24_000, 128
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			s := New(testenv.Redis(b))
			quota := make([]int, n)
			for i := range quota {
				quota[i] = demand * 4 / 10 / max(n-1, 1)
			}
			quota[0] = demand - quota[1%n]*(n-1)
			if n == 1 {
				quota[0] = demand
			}
			users := make([][]string, n)
			for i := 0; ; i++ {
				u := fmt.Sprintf("u%d", i)
				if bk := model.BucketOf(u, n); len(users[bk]) < quota[bk] {
					users[bk] = append(users[bk], u)
				}
				if done := func() bool {
					for bk := range users {
						if len(users[bk]) < quota[bk] {
							return false
						}
					}
					return true
				}(); done {
					break
				}
			}
			decided := 0
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				c := model.Campaign{ID: testenv.Name(b, "bkb"), Name: "bench", Stock: stock, PerUserLimit: 1, Buckets: n,
					StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour), Epoch: 1}
				if _, err := s.Rebuild(b.Context(), c, nil, nil); err != nil {
					b.Fatalf("load: %v", err)
				}
				b.StartTimer()
				errs := make(chan error, n)
				for bk := range n {
					go func() {
						tag := model.BucketTag(c.ID, bk, n)
						us := users[bk]
						for at := 0; at < len(us); at += batchSize {
							batch := make([]model.Deduction, 0, batchSize)
							for j, u := range us[at:min(at+batchSize, len(us))] {
								batch = append(batch, model.Deduction{RequestID: benchRequestID(tag, at+j), UserID: u, Quantity: 1, OrderID: u})
							}
							if _, err := s.Deduct(b.Context(), tag, batch); err != nil {
								errs <- err
								return
							}
						}
						errs <- nil
					}()
				}
				for range n {
					if err := <-errs; err != nil {
						b.Fatalf("Deduct: %v", err)
					}
				}
				decided += demand
				b.StopTimer()
				if st, err := s.Stats(b.Context(), c.ID); err != nil || st.Sold != stock || !st.SoldOut {
					b.Fatalf("after the sale: %+v, %v; want all %d sold", st, err, stock)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(decided)/b.Elapsed().Seconds(), "deductions/s")
			b.ReportMetric(b.Elapsed().Seconds()*1000/float64(b.N), "ms/sale")
		})
	}
}
