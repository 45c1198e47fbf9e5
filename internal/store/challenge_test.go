package store

import (
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

// gatedCall is one request of an Admit batch on a gated campaign; rid and
// challenge are labels ("" challenge: none).
type gatedCall struct {
	rid, user, key, challenge string
	qty                       int64 // 0 = 1
	want                      model.AdmitCode
	wantRID                   string // label of the request id Admit must return; "" = none
}

// TestAdmitChallenge: admit.lua spends a challenge when it admits, refuses
// it for any other purchase before counting anything of it, and lets the
// same keyed purchase through to its first request.
func TestAdmitChallenge(t *testing.T) {
	tests := []struct {
		name         string
		limits       model.RateLimits
		batches      [][]gatedCall
		wantAdmitted int64
	}{
		{
			name: "two purchases of one challenge in one batch",
			batches: [][]gatedCall{{
				{rid: "r1", user: "u1", challenge: "A", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u1", challenge: "A", want: model.AdmitChallengeSpent},
				{rid: "r3", user: "u1", challenge: "B", want: model.Admitted, wantRID: "r3"},
			}},
			wantAdmitted: 2,
		},
		{
			name: "spent by an earlier call",
			batches: [][]gatedCall{
				{{rid: "r1", user: "u1", challenge: "A", want: model.Admitted, wantRID: "r1"}},
				{{rid: "r2", user: "u1", challenge: "A", want: model.AdmitChallengeSpent}},
			},
			wantAdmitted: 1,
		},
		{
			name: "another key is another purchase",
			batches: [][]gatedCall{
				{{rid: "r1", user: "u1", key: "k1", challenge: "A", want: model.Admitted, wantRID: "r1"}},
				{{rid: "r2", user: "u1", key: "k2", challenge: "A", want: model.AdmitChallengeSpent}},
				{{rid: "r3", user: "u1", challenge: "A", want: model.AdmitChallengeSpent}},
			},
			wantAdmitted: 1,
		},
		{
			name: "the same keyed purchase gets its first request, in the batch and after",
			batches: [][]gatedCall{
				{
					{rid: "r1", user: "u1", key: "k1", challenge: "A", want: model.Admitted, wantRID: "r1"},
					{rid: "r2", user: "u1", key: "k1", challenge: "A", want: model.AdmitExisting, wantRID: "r1"},
				},
				{{rid: "r3", user: "u1", key: "k1", challenge: "A", want: model.AdmitExisting, wantRID: "r1"}},
			},
			wantAdmitted: 1,
		},
		{
			// A burst of two: had r2 taken a token, r3 would be limited.
			name:   "refused before the rate limits",
			limits: model.RateLimits{UserRate: 1, UserBurst: 2, IPRate: 1, IPBurst: 2, CampaignRate: 1, CampaignBurst: 2},
			batches: [][]gatedCall{
				{{rid: "r1", user: "u1", challenge: "A", want: model.Admitted, wantRID: "r1"}},
				{
					{rid: "r2", user: "u1", challenge: "A", want: model.AdmitChallengeSpent},
					{rid: "r3", user: "u1", challenge: "B", want: model.Admitted, wantRID: "r3"},
				},
			},
			wantAdmitted: 2,
		},
		{
			name:   "a request refused by a limit leaves its challenge",
			limits: model.RateLimits{UserRate: 1, UserBurst: 1},
			batches: [][]gatedCall{{
				{rid: "r1", user: "u1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u1", challenge: "A", want: model.AdmitUserRateLimited},
				{rid: "r3", user: "u2", challenge: "A", want: model.Admitted, wantRID: "r3"},
			}},
			wantAdmitted: 2,
		},
		{
			name: "a reused key leaves its challenge",
			batches: [][]gatedCall{
				{{rid: "r1", user: "u1", key: "k1", want: model.Admitted, wantRID: "r1"}},
				{
					{rid: "r2", user: "u1", key: "k1", qty: 2, challenge: "A", want: model.AdmitKeyReused},
					{rid: "r3", user: "u1", key: "k1", challenge: "A", want: model.AdmitExisting, wantRID: "r1"},
					{rid: "r4", user: "u2", challenge: "A", want: model.Admitted, wantRID: "r4"},
				},
			},
			wantAdmitted: 2,
		},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(t, 10, 2)
				mustLoad(t, s, c)
				ids := newLabels(c.ID)
				expires := time.Now().Add(time.Minute)
				for b, calls := range tt.batches {
					batch := make([]model.AdmitRequest, len(calls))
					for i, call := range calls {
						batch[i] = model.AdmitRequest{RequestID: ids.rid(call.rid), CampaignID: c.ID, UserID: call.user,
							Quantity: max(call.qty, 1), IdempotencyKey: call.key, ClientIP: "10.0.0.1"}
						if call.challenge != "" {
							batch[i].Challenge = model.ChallengePass{ID: call.challenge, ExpiresAt: expires}
						}
					}
					got, err := s.Admit(t.Context(), c.ID, batch, tt.limits)
					if err != nil {
						t.Fatalf("batch %d: Admit: %v", b, err)
					}
					for i, call := range calls {
						wantRID := ""
						if call.wantRID != "" {
							wantRID = ids.rid(call.wantRID)
						}
						if got[i].Code != call.want || got[i].RequestID != wantRID {
							t.Errorf("batch %d request %s: got code %d id %q, want code %d id %q", b, call.rid, got[i].Code, got[i].RequestID, call.want, wantRID)
						}
						if call.want != model.AdmitChallengeSpent {
							continue
						}
						// Nothing of a refused request is stored.
						mustNoResult(t, s, batch[i].RequestID)
						if f := idemField(call.user, call.key); f != "" && call.key != "k1" {
							if n, err := s.rdb.HExists(t.Context(), campaignKeys(c.ID).idem, f).Result(); err != nil || n {
								t.Errorf("batch %d request %s: idempotency record: got %v, %v; want none", b, call.rid, n, err)
							}
						}
					}
				}
				if st := mustStats(t, s, c.ID); st.Admitted != tt.wantAdmitted || st.Queued() != tt.wantAdmitted {
					t.Errorf("admitted/queued: got %d/%d, want %d/%d", st.Admitted, st.Queued(), tt.wantAdmitted, tt.wantAdmitted)
				}
			})
		}
	})
}

// TestAdmitChallengeKey: a spent challenge's key holds the purchase's
// holder and expires with the challenge.
func TestAdmitChallengeKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 10, 2)
		mustLoad(t, s, c)
		expires := time.Now().Add(90 * time.Second)
		r := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: "k1",
			Challenge: model.ChallengePass{ID: "A", ExpiresAt: expires}}
		if _, existing := mustAdmit(t, s, r); existing {
			t.Fatalf("got an existing request, want a new one")
		}
		key := challengeKey(c.ID, "A")
		if v, err := s.rdb.Get(t.Context(), key).Result(); err != nil || v != "kk1" {
			t.Errorf("challenge key: got %q, %v; want %q", v, err, "kk1")
		}
		ttl, err := s.rdb.TTL(t.Context(), key).Result()
		if err != nil || ttl <= 60*time.Second || ttl > 91*time.Second {
			t.Errorf("challenge key TTL: got %v, %v; want about 90s", ttl, err)
		}
	})
}

// TestAdmitChallengeRace: many purchases of one challenge at once, in calls
// of their own; exactly one is admitted.
func TestAdmitChallengeRace(t *testing.T) {
	s := backends()[0].store(t)
	c := newCampaign(t, 100, 2)
	mustLoad(t, s, c)
	const n = 32
	codes := make([]model.AdmitCode, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u" + string(rune('a'+i%26)), Quantity: 1,
				Challenge: model.ChallengePass{ID: "A", ExpiresAt: time.Now().Add(time.Minute)}}
			got, err := s.Admit(t.Context(), c.ID, []model.AdmitRequest{r}, model.RateLimits{})
			if err == nil {
				codes[i] = got[0].Code
			}
			errs[i] = err
		})
	}
	wg.Wait()
	admitted := 0
	for i := range n {
		switch {
		case errs[i] != nil:
			t.Fatalf("purchase %d: %v", i, errs[i])
		case codes[i] == model.Admitted:
			admitted++
		case codes[i] != model.AdmitChallengeSpent:
			t.Errorf("purchase %d: got code %d, want %d or %d", i, codes[i], model.Admitted, model.AdmitChallengeSpent)
		}
	}
	if st := mustStats(t, s, c.ID); admitted != 1 || st.Admitted != 1 {
		t.Errorf("admitted: got %d answered, %d counted; want 1", admitted, st.Admitted)
	}
}
