package store

import (
	_ "embed"
	"testing"

	"github.com/redis/go-redis/v9"
)

// What the admissions set costs admit.lua: one ZADD of a member naming the
// call's requests, against the script as it was before it
// (testdata/admit_before_record.lua, test only), pair by pair as
// BenchmarkAdmitPosition (docs/BENCHMARKS.md, "The record of admissions").

//go:embed testdata/admit_before_record.lua
var admitBeforeRecord string

// BenchmarkAdmitRecord admits batches of 30 on each side in turn, in the
// shape of BenchmarkAdmitPosition; nothing is decided, so today's
// admissions set grows as a sale's backlog does.
func BenchmarkAdmitRecord(b *testing.B) {
	benchAdmitPairs(b, 30, scriptPairs(b, "record", func(s *Store, today bool) {
		if !today {
			s.admit = redis.NewScript(admitBeforeRecord)
		}
	}))
}
