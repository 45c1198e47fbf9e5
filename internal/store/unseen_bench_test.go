package store

import (
	_ "embed"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// What the unseen set costs the scripts: admit.lua's ZADD of the requests
// it admits and deduct.lua's ZREM of the ones it sees, against the scripts
// as they were before it (testdata/*_before_unseen.lua, test only: they
// recorded nothing at admission, and deduct.lua checked an empty record
// with one EXISTS), pair by pair as BenchmarkAdmitPosition
// (docs/BENCHMARKS.md, "The unseen set").

var (
	//go:embed testdata/admit_before_unseen.lua
	admitBeforeUnseen string
	//go:embed testdata/deduct_before_unseen.lua
	deductBeforeUnseen string
)

func unseenPairs(b *testing.B) []*positionPair {
	return scriptPairs(b, "unseen", func(s *Store, today bool) {
		if !today {
			s.admit = redis.NewScript(admitBeforeUnseen)
			s.deduct = redis.NewScript(deductBeforeUnseen)
		}
	})
}

// BenchmarkAdmitUnseen admits batches of 30 on each side in turn, in the
// shape of BenchmarkAdmitPosition; nothing is decided, so today's unseen
// set grows as a sale's backlog does.
func BenchmarkAdmitUnseen(b *testing.B) {
	const size = 30
	limits := model.RateLimits{UserRate: 1_000_000, UserBurst: 1_000_000, IPRate: 1_000_000, IPBurst: 1_000_000}
	pairs := unseenPairs(b)
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

// BenchmarkDeductUnseen decides batches of 128 on each side in turn, each
// admitted just before by that side's admit.lua and behind a backlog of
// 10,000 admitted requests no worker has seen; only the deduction is
// measured.
func BenchmarkDeductUnseen(b *testing.B) {
	const size, backlog = 128, 10_000
	pairs := unseenPairs(b)
	adm := make([]model.AdmitRequest, size)
	batch := make([]model.Deduction, size)
	n := 0
	admit := func(p *positionPair) {
		for j := range batch {
			n++
			id, user := benchRequestID(p.c.ID, n), fmt.Sprintf("u%d", n)
			adm[j] = model.AdmitRequest{RequestID: id, CampaignID: p.c.ID, UserID: user, Quantity: 1}
			batch[j] = model.Deduction{RequestID: id, UserID: user, Quantity: 1, OrderID: "o"}
		}
		if _, err := p.s.Admit(b.Context(), p.c.ID, adm, model.RateLimits{}); err != nil {
			b.Fatalf("Admit: %v", err)
		}
	}
	for _, p := range pairs {
		for range backlog / size {
			admit(p)
		}
	}
	for i := 0; b.Loop(); i++ {
		for k := range pairs {
			p := pairs[(i+k)%2]
			admit(p)
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
