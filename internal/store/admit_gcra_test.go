package store

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// TestAdmitLimiterMatchesRedisRate: admit.lua's rate limits are a port of
// go-redis/redis_rate's GCRA into the batch script (the library needs a round
// trip per key per request, which a coalesced admit batch cannot afford). This
// test holds the port to the library: the same requests at the same instants
// — miniredis's clock drives both scripts' TIME — must get the same
// allow/deny decisions and the same retry-after.
func TestAdmitLimiterMatchesRedisRate(t *testing.T) {
	tests := []struct {
		name        string
		rate, burst int
	}{
		{"1 per second, burst 1", 1, 1},
		{"5 per second, burst 10", 5, 10},
		{"50 per second, burst 3", 50, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := miniredis.RunT(t)
			clock := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
			m.SetTime(clock)
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { _ = rdb.Close() })
			s := New(rdb)
			lib := redis_rate.NewLimiter(rdb)
			c := newCampaign(t, 1_000_000, 1_000_000)
			mustLoad(t, s, c)
			limits := model.RateLimits{UserRate: tc.rate, UserBurst: tc.burst}
			libLimit := redis_rate.Limit{Rate: tc.rate, Burst: tc.burst, Period: time.Second}

			rng := rand.New(rand.NewPCG(1, uint64(tc.rate)))
			users := []string{"ann", "ben", "cat"}
			decisions := map[bool]int{}
			for step := range 300 {
				// Bursts (no time passing) mixed with gaps around the interval.
				if rng.IntN(4) == 0 {
					clock = clock.Add(time.Duration(rng.IntN(2*1000/tc.rate+1)) * time.Millisecond)
					m.SetTime(clock)
				}
				user := users[rng.IntN(len(users))]
				got, err := s.Admit(t.Context(), c.ID, []model.AdmitRequest{{RequestID: newRequestID(c.ID), CampaignID: c.ID,
					UserID: user, Quantity: 1}}, limits)
				if err != nil {
					t.Fatalf("step %d: admit: %v", step, err)
				}
				want, err := lib.Allow(t.Context(), "lib:"+user, libLimit)
				if err != nil {
					t.Fatalf("step %d: redis_rate: %v", step, err)
				}
				gotAllowed := got[0].Code == model.Admitted
				decisions[gotAllowed]++
				if gotAllowed != (want.Allowed == 1) {
					t.Fatalf("step %d (%s at %s): admit.lua allowed=%v, redis_rate allowed=%v", step, user, clock.Format("15:04:05.000"), gotAllowed, want.Allowed == 1)
				}
				if !gotAllowed {
					if d := got[0].RetryAfter - want.RetryAfter; d > time.Millisecond || d < -time.Millisecond {
						t.Fatalf("step %d: retry after %s, redis_rate says %s", step, got[0].RetryAfter, want.RetryAfter)
					}
				}
			}
			if decisions[true] == 0 || decisions[false] == 0 {
				t.Fatalf("got %d allowed and %d refused: the sequence must exercise both", decisions[true], decisions[false])
			}
		})
	}
}
