package store

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// What the queue position (issue 17 item 2) costs the scripts: admit.lua's
// sequence number and deduct.lua's "decided" watermark, against the
// scripts as they were before it (testdata/*_before_position.lua, test
// only), on the same Redis in the same binary. Run the two sides
// interleaved, one process each, and compare medians (docs/BENCHMARKS.md,
// "Issue 17: the gate and the queue position on the accept path").

var (
	//go:embed testdata/admit_before_position.lua
	admitBeforePosition string
	//go:embed testdata/deduct_before_position.lua
	deductBeforePosition string
)

// positionSides are the two scripts of each pair: today's and the baseline.
var positionSides = []struct {
	name          string
	admit, deduct string
}{
	{name: "position", admit: admitSource, deduct: deductSource},
	{name: "baseline", admit: admitBeforePosition, deduct: deductBeforePosition},
}

// evalshaStats returns Redis's EVALSHA calls and microseconds so far (INFO
// commandstats). Only a Redis nothing else uses gives a benchmark's own.
func evalshaStats(b *testing.B, rdb redis.UniversalClient) (calls, usec int64) {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatalf("info commandstats: %v", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return calls, usec
}

// BenchmarkAdmitPosition is admit.lua with the sequence number (position)
// and without it (baseline), in the shape of .ci/bench.sh's admit stage:
// 256 shoppers from one address, user and IP limits on, no
// Idempotency-Key, batches of 30 (the stage's 25-29 per call) and of 1.
// redis-us/admit is Redis's own time in the script per purchase (EVALSHA's
// usec in INFO commandstats): exact on a private Redis, mixed with
// everyone else's scripts on a shared one.
func BenchmarkAdmitPosition(b *testing.B) {
	limits := model.RateLimits{UserRate: 1_000_000, UserBurst: 1_000_000, IPRate: 1_000_000, IPBurst: 1_000_000}
	for _, side := range positionSides {
		b.Run(side.name, func(b *testing.B) {
			for _, size := range []int{1, 30} {
				b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
					s, c := benchStore(b)
					s.admit = redis.NewScript(side.admit)
					batch := make([]model.AdmitRequest, size)
					n := 0
					calls0, usec0 := evalshaStats(b, s.rdb)
					for b.Loop() {
						for i := range batch {
							n++
							batch[i] = model.AdmitRequest{RequestID: benchRequestID(c.ID, n), CampaignID: c.ID,
								UserID: fmt.Sprintf("bench%d", n%256), Quantity: 1, ClientIP: "127.0.0.1"}
						}
						adms, err := s.Admit(b.Context(), c.ID, batch, limits)
						if err != nil {
							b.Fatalf("Admit: %v", err)
						}
						if adms[size-1].Code != model.Admitted {
							b.Fatalf("Admit: got code %d, want %d", adms[size-1].Code, model.Admitted)
						}
					}
					calls1, usec1 := evalshaStats(b, s.rdb)
					if calls1 > calls0 {
						b.ReportMetric(float64(usec1-usec0)/float64(n), "redis-us/admit")
					}
					b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "admitted/s")
				})
			}
		})
	}
}

// BenchmarkDeductPosition is deduct.lua with the watermark (position) and
// without it (baseline), deciding batches of 128 requests that admit.lua
// (today's, so their markers carry sequence numbers) admitted just before,
// outside the clock: every batch raises the watermark. redis-us/deduction
// is Redis's own time in deduct.lua per request, as BenchmarkAdmitPosition's.
func BenchmarkDeductPosition(b *testing.B) {
	const size = 128
	for _, side := range positionSides {
		b.Run(side.name, func(b *testing.B) {
			s, c := benchStore(b)
			s.deduct = redis.NewScript(side.deduct)
			adm := make([]model.AdmitRequest, size)
			batch := make([]model.Deduction, size)
			n := 0
			var usec int64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for i := range batch {
					n++
					id, user := benchRequestID(c.ID, n), fmt.Sprintf("u%d", n)
					adm[i] = model.AdmitRequest{RequestID: id, CampaignID: c.ID, UserID: user, Quantity: 1}
					batch[i] = model.Deduction{RequestID: id, UserID: user, Quantity: 1, OrderID: "o"}
				}
				if _, err := s.Admit(b.Context(), c.ID, adm, model.RateLimits{}); err != nil {
					b.Fatalf("Admit: %v", err)
				}
				_, usec0 := evalshaStats(b, s.rdb)
				b.StartTimer()
				r, err := s.Deduct(b.Context(), c.ID, batch)
				b.StopTimer()
				if err != nil {
					b.Fatalf("Deduct: %v", err)
				}
				if r.Results[size-1].Status != model.StatusSuccess {
					b.Fatalf("Deduct: got %s, want success", r.Results[size-1].Status)
				}
				_, usec1 := evalshaStats(b, s.rdb)
				usec += usec1 - usec0
				b.StartTimer()
			}
			b.ReportMetric(float64(usec)/float64(n), "redis-us/deduction")
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "deductions/s")
		})
	}
}
