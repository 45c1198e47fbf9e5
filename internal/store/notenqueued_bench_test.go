package store

import (
	_ "embed"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// What the record of admissions costs admit.lua: one ZADD of a member
// naming the call's requests, against the script as it was before it
// (testdata/admit_before_record.lua, test only), pair by pair as
// BenchmarkAdmitPosition (docs/BENCHMARKS.md, "The record of admissions").

//go:embed testdata/admit_before_record.lua
var admitBeforeRecord string

// BenchmarkAdmitRecord admits batches of 30 on each side in turn, in the
// shape of BenchmarkAdmitPosition; nothing is decided, so today's record
// grows as a sale's backlog does.
func BenchmarkAdmitRecord(b *testing.B) {
	const size = 30
	limits := model.RateLimits{UserRate: 1_000_000, UserBurst: 1_000_000, IPRate: 1_000_000, IPBurst: 1_000_000}
	pairs := scriptPairs(b, "record", func(s *Store, today bool) {
		if !today {
			s.admit = redis.NewScript(admitBeforeRecord)
		}
	})
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
