package store

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// What the queue position (issue 17 item 2) costs the scripts: admit.lua's
// sequence number and deduct.lua's "decided" watermark, against the
// scripts as they were before it (testdata/*_before_position.lua, test
// only), on the same Redis in the same process, call by call in turn
// (docs/BENCHMARKS.md, "Issue 17: the gate and the queue position on the
// accept path").

var (
	//go:embed testdata/admit_before_position.lua
	admitBeforePosition string
	//go:embed testdata/deduct_before_position.lua
	deductBeforePosition string
)

// positionPair is one side of the pairs: a store running one of the two
// scripts on a campaign of its own, and what its calls cost.
type positionPair struct {
	name      string
	s         *Store
	c         model.Campaign
	calls, n  int64 // script calls, requests
	usec, dur int64 // Redis's time in the script (µs), the caller's wait (ns)
}

// positionPairs returns today's side and the baseline's, with the scripts
// set by script (admit or deduct).
func positionPairs(b *testing.B, script func(s *Store, today bool)) []*positionPair {
	return scriptPairs(b, "position", script)
}

// scriptPairs returns today's side, named today, and the baseline's, with
// the scripts set by script.
func scriptPairs(b *testing.B, today string, script func(s *Store, today bool)) []*positionPair {
	b.Helper()
	var out []*positionPair
	for _, side := range []struct {
		name  string
		today bool
	}{{today, true}, {"baseline", false}} {
		s, c := benchStore(b)
		script(s, side.today)
		out = append(out, &positionPair{name: side.name, s: s, c: c})
	}
	return out
}

// measure runs call on side p and adds what it cost: EVALSHA's usec in
// INFO commandstats around it (only p's call runs in between on a Redis
// nothing else uses), and the wall time the caller waited.
func (p *positionPair) measure(b *testing.B, requests int, call func() error) {
	b.Helper()
	_, u0 := evalshaStats(b, p.s.rdb)
	t0 := time.Now()
	if err := call(); err != nil {
		b.Fatalf("%s: %v", p.name, err)
	}
	p.dur += time.Since(t0).Nanoseconds()
	_, u1 := evalshaStats(b, p.s.rdb)
	p.usec += u1 - u0
	p.calls++
	p.n += int64(requests)
}

// report writes both sides' figures and their ratio.
func reportPairs(b *testing.B, pairs []*positionPair, unit string) {
	b.Helper()
	for _, p := range pairs {
		b.ReportMetric(float64(p.usec)/float64(p.n), p.name+"-redis-us/"+unit)
		b.ReportMetric(float64(p.dur)/1e3/float64(p.calls), p.name+"-wait-us/call")
	}
	if pairs[1].usec > 0 {
		b.ReportMetric(float64(pairs[0].usec)/float64(pairs[1].usec), "redis-ratio")
	}
	if pairs[1].dur > 0 {
		b.ReportMetric(float64(pairs[0].dur)/float64(pairs[1].dur), "wait-ratio")
	}
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
// against the baseline, pair by pair: each iteration admits a batch on
// each side, in turn (the order swapped every iteration), so both see the
// same machine. The shape is .ci/bench.sh's admit stage: 256 shoppers from
// one address, user and IP limits on, no Idempotency-Key, batches of 30
// (the stage's 25-29 per call) and of 1. Figures: Redis's own time in the
// script per purchase on each side (EVALSHA's usec in INFO commandstats:
// exact on a private Redis, mixed with everyone else's scripts on a shared
// one), the caller's wait per call, and the ratios position/baseline;
// ns/op is both sides and the INFO calls, not a figure.
func BenchmarkAdmitPosition(b *testing.B) {
	for _, size := range []int{1, 30} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			benchAdmitPairs(b, size, positionPairs(b, func(s *Store, today bool) {
				if !today {
					s.admit = redis.NewScript(admitBeforePosition)
				}
			}))
		})
	}
}

// benchAdmitPairs admits batches of size on each side of pairs in turn, the
// order swapped every iteration: 256 shoppers from one address, user and IP
// limits on, no Idempotency-Key.
func benchAdmitPairs(b *testing.B, size int, pairs []*positionPair) {
	limits := model.RateLimits{UserRate: 1_000_000, UserBurst: 1_000_000, IPRate: 1_000_000, IPBurst: 1_000_000}
	batch := make([]model.AdmitRequest, size)
	n := 0
	for i := 0; b.Loop(); i++ {
		for k := range pairs {
			p := pairs[(i+k)%2]
			for j := range batch {
				n++
				batch[j] = model.AdmitRequest{RequestID: benchRequestID(p.c.ID, n), CampaignID: p.c.ID,
					UserID: fmt.Sprintf("bench%d", n%256), Quantity: 1, ClientIP: "127.0.0.1"}
			}
			p.measure(b, size, func() error {
				adms, err := p.s.Admit(b.Context(), p.c.ID, batch, limits)
				if err == nil && adms[size-1].Code != model.Admitted {
					err = fmt.Errorf("admit: got code %d, want %d", adms[size-1].Code, model.Admitted)
				}
				return err
			})
		}
	}
	reportPairs(b, pairs, "admit")
}

// BenchmarkDeductPosition is deduct.lua with the watermark (position)
// against the baseline, pair by pair as BenchmarkAdmitPosition: each side
// decides batches of 128 requests that today's admit.lua admitted just
// before (so their markers carry sequence numbers and every batch raises
// the watermark); only the deduction is measured.
func BenchmarkDeductPosition(b *testing.B) {
	const size = 128
	pairs := positionPairs(b, func(s *Store, today bool) {
		if !today {
			s.deduct = redis.NewScript(deductBeforePosition)
		}
	})
	adm := make([]model.AdmitRequest, size)
	batch := make([]model.Deduction, size)
	n := 0
	for i := 0; b.Loop(); i++ {
		for k := range pairs {
			p := pairs[(i+k)%2]
			for j := range batch {
				n++
				id, user := benchRequestID(p.c.ID, n), fmt.Sprintf("u%d", n)
				adm[j] = model.AdmitRequest{RequestID: id, CampaignID: p.c.ID, UserID: user, Quantity: 1}
				batch[j] = model.Deduction{RequestID: id, UserID: user, Quantity: 1, OrderID: "o"}
			}
			if _, err := p.s.Admit(b.Context(), p.c.ID, adm, model.RateLimits{}); err != nil {
				b.Fatalf("Admit: %v", err)
			}
			p.measure(b, size, func() error {
				r, err := p.s.Deduct(b.Context(), p.c.ID, batch)
				if err == nil && r.Results[size-1].Status != model.StatusSuccess {
					err = fmt.Errorf("deduct: got %s, want success", r.Results[size-1].Status)
				}
				return err
			})
		}
	}
	reportPairs(b, pairs, "deduction")
}
