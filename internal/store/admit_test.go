package store

import (
	"fmt"
	"sync"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// admitCall is one request of an Admit batch in a table; rid is a label.
type admitCall struct {
	rid, user, key, ip string
	qty                int64 // 0 = 1
	want               model.AdmitCode
	wantRID            string // label of the request id Admit must return; "" = none
}

func TestAdmit(t *testing.T) {
	tests := []struct {
		name         string
		notLoaded    bool
		limits       model.RateLimits
		calls        []admitCall
		wantAdmitted int64
	}{
		{
			name: "new requests are queued",
			calls: []admitCall{
				{rid: "r1", user: "u1", key: "k1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", want: model.Admitted, wantRID: "r2"},
			},
			wantAdmitted: 2,
		},
		{
			name: "same key same user in one batch returns the first request",
			calls: []admitCall{
				{rid: "r1", user: "u1", key: "k1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u1", key: "k1", want: model.AdmitExisting, wantRID: "r1"},
				{rid: "r3", user: "u2", key: "k1", want: model.Admitted, wantRID: "r3"},
			},
			wantAdmitted: 2,
		},
		{
			// The IETF Idempotency-Key draft: a key is one request, whatever
			// else is sent with it.
			name: "same key same user other quantity in one batch is refused",
			calls: []admitCall{
				{rid: "r1", user: "u1", key: "k1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u1", key: "k1", qty: 2, want: model.AdmitKeyReused},
				{rid: "r3", user: "u1", key: "k1", want: model.AdmitExisting, wantRID: "r1"},
			},
			wantAdmitted: 1,
		},
		{
			name: "same request id twice counts once",
			calls: []admitCall{
				{rid: "r1", user: "u1", key: "k1", want: model.Admitted, wantRID: "r1"},
				{rid: "r1", user: "u1", key: "k1", want: model.Admitted, wantRID: "r1"},
			},
			wantAdmitted: 1,
		},
		{
			name:      "campaign not loaded",
			notLoaded: true,
			calls:     []admitCall{{rid: "r1", user: "u1", key: "k1", want: model.AdmitNotLoaded}},
		},
		{
			name:   "user over its burst is refused, others are not",
			limits: model.RateLimits{UserRate: 1, UserBurst: 2},
			calls: []admitCall{
				{rid: "r1", user: "u1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u1", want: model.Admitted, wantRID: "r2"},
				{rid: "r3", user: "u1", want: model.AdmitUserRateLimited},
				{rid: "r4", user: "u2", want: model.Admitted, wantRID: "r4"},
			},
			wantAdmitted: 3,
		},
		{
			name:   "campaign over its burst is refused",
			limits: model.RateLimits{CampaignRate: 1, CampaignBurst: 2},
			calls: []admitCall{
				{rid: "r1", user: "u1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", want: model.Admitted, wantRID: "r2"},
				{rid: "r3", user: "u3", want: model.AdmitCampaignRateLimited},
			},
			wantAdmitted: 2,
		},
		{
			name:   "client IP over its burst is refused across users",
			limits: model.RateLimits{IPRate: 1, IPBurst: 2, UserRate: 100, UserBurst: 100},
			calls: []admitCall{
				{rid: "r1", user: "u1", ip: "10.0.0.1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", ip: "10.0.0.1", want: model.Admitted, wantRID: "r2"},
				{rid: "r3", user: "u3", ip: "10.0.0.1", want: model.AdmitIPRateLimited},
				{rid: "r4", user: "u3", ip: "10.0.0.2", want: model.Admitted, wantRID: "r4"},
				{rid: "r5", user: "u4", want: model.Admitted, wantRID: "r5"}, // unknown IP: not limited
			},
			wantAdmitted: 4,
		},
		{
			name:   "IP limit on, no request with a known IP",
			limits: model.RateLimits{IPRate: 1, IPBurst: 1},
			calls: []admitCall{
				{rid: "r1", user: "u1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", want: model.Admitted, wantRID: "r2"},
			},
			wantAdmitted: 2,
		},
		{
			// An IP refusal must not use up the user's own allowance.
			name:   "IP refusal leaves the user limit alone",
			limits: model.RateLimits{IPRate: 1, IPBurst: 1, UserRate: 1, UserBurst: 1},
			calls: []admitCall{
				{rid: "r1", user: "u1", ip: "10.0.0.1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u2", ip: "10.0.0.1", want: model.AdmitIPRateLimited},
				{rid: "r3", user: "u2", ip: "10.0.0.2", want: model.Admitted, wantRID: "r3"},
			},
			wantAdmitted: 2,
		},
		{
			// A user refused by its own limit must not use up the campaign's.
			name:   "user refusal leaves the campaign limit alone",
			limits: model.RateLimits{UserRate: 1, UserBurst: 1, CampaignRate: 1, CampaignBurst: 2},
			calls: []admitCall{
				{rid: "r1", user: "u1", want: model.Admitted, wantRID: "r1"},
				{rid: "r2", user: "u1", want: model.AdmitUserRateLimited},
				{rid: "r3", user: "u2", want: model.Admitted, wantRID: "r3"},
			},
			wantAdmitted: 2,
		},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(t, 10, 2)
				if !tt.notLoaded {
					mustLoad(t, s, c)
				}
				ids := newLabels(c.ID)
				batch := make([]model.AdmitRequest, len(tt.calls))
				for i, call := range tt.calls {
					batch[i] = model.AdmitRequest{RequestID: ids.rid(call.rid), CampaignID: c.ID, UserID: call.user, Quantity: max(call.qty, 1), IdempotencyKey: call.key, ClientIP: call.ip}
				}
				got, err := s.Admit(t.Context(), c.ID, batch, tt.limits)
				if err != nil {
					t.Fatalf("Admit: %v", err)
				}
				for i, call := range tt.calls {
					wantRID := ""
					if call.wantRID != "" {
						wantRID = ids.rid(call.wantRID)
					}
					if got[i].Code != call.want || got[i].RequestID != wantRID {
						t.Errorf("request %d (%s): got code %d id %q, want code %d id %q", i, call.rid, got[i].Code, got[i].RequestID, call.want, wantRID)
					}
					// A replay in the batch of its first request sees it queued.
					wantResult := model.Result{}
					if call.want == model.AdmitExisting {
						wantResult = model.Result{RequestID: wantRID, CampaignID: c.ID, UserID: call.user, Status: model.StatusQueued, Quantity: 1}
					}
					if seqless(t, got[i].Result) != wantResult {
						t.Errorf("request %d (%s): got result %+v, want %+v", i, call.rid, got[i].Result, wantResult)
					}
					limited := call.want == model.AdmitUserRateLimited || call.want == model.AdmitCampaignRateLimited || call.want == model.AdmitIPRateLimited
					if limited != (got[i].RetryAfter > 0) {
						t.Errorf("request %d (%s): got retry after %v, want it set only when rate limited", i, call.rid, got[i].RetryAfter)
					}
				}
				st := mustStats(t, s, c.ID)
				if st.Admitted != tt.wantAdmitted || st.Queued() != tt.wantAdmitted {
					t.Errorf("admitted/queued: got %d/%d, want %d/%d", st.Admitted, st.Queued(), tt.wantAdmitted, tt.wantAdmitted)
				}
				for i, call := range tt.calls {
					if call.want == model.Admitted {
						if r := mustResult(t, s, batch[i].RequestID); r.Status != model.StatusQueued || r.UserID != call.user {
							t.Errorf("Result(%s): got %s for %s, want queued for %s", call.rid, r.Status, r.UserID, call.user)
						}
					} else if call.want != model.AdmitExisting || call.rid != call.wantRID {
						mustNoResult(t, s, batch[i].RequestID)
					}
				}
			})
		}
	})
}

// callAlone is one request admitted in a call of its own; rid is a label.
type callAlone struct {
	rid, user, key string
	wantRID        string // label of the request id Admit must return
	wantExisting   bool
}

// TestAdmitAcrossCalls: what one call stores, the next call sees — the
// Idempotency-Key dedupe and a retried request id, one request per call.
func TestAdmitAcrossCalls(t *testing.T) {
	tests := []struct {
		name         string
		calls        []callAlone
		wantAdmitted int64
		wantQueued   []string // labels with a queued result
		wantMissing  []string // labels without any result
	}{
		{
			name:         "new request is queued",
			calls:        []callAlone{{rid: "r1", user: "u1", key: "k1", wantRID: "r1"}},
			wantAdmitted: 1,
			wantQueued:   []string{"r1"},
		},
		{
			name: "same key same user returns the first request",
			calls: []callAlone{
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r2", user: "u1", key: "k1", wantRID: "r1", wantExisting: true},
			},
			wantAdmitted: 1,
			wantQueued:   []string{"r1"},
			wantMissing:  []string{"r2"},
		},
		{
			name: "same key different user is a new request",
			calls: []callAlone{
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r2", user: "u2", key: "k1", wantRID: "r2"},
			},
			wantAdmitted: 2,
			wantQueued:   []string{"r1", "r2"},
		},
		{
			name: "different keys same user are new requests",
			calls: []callAlone{
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r2", user: "u1", key: "k2", wantRID: "r2"},
			},
			wantAdmitted: 2,
			wantQueued:   []string{"r1", "r2"},
		},
		{
			name: "no key is never deduplicated",
			calls: []callAlone{
				{rid: "r1", user: "u1", wantRID: "r1"},
				{rid: "r2", user: "u1", wantRID: "r2"},
			},
			wantAdmitted: 2,
			wantQueued:   []string{"r1", "r2"},
		},
		{
			// go-redis retries a script whose reply was lost; the retry must not
			// count the request twice, or Queued never drains.
			name: "same request id admitted twice counts once",
			calls: []callAlone{
				{rid: "r1", user: "u1", wantRID: "r1"},
				{rid: "r1", user: "u1", wantRID: "r1"},
			},
			wantAdmitted: 1,
			wantQueued:   []string{"r1"},
		},
		{
			// The key already points at this very request: it is a retry, not a
			// duplicate, so the caller must still go on and publish it.
			name: "same request id and key admitted twice is not existing",
			calls: []callAlone{
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r1", user: "u1", key: "k1", wantRID: "r1"},
				{rid: "r2", user: "u1", key: "k1", wantRID: "r1", wantExisting: true},
			},
			wantAdmitted: 1,
			wantQueued:   []string{"r1"},
			wantMissing:  []string{"r2"},
		},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(t, 10, 2)
				mustLoad(t, s, c)
				ids := newLabels(c.ID)
				for i, call := range tt.calls {
					rid, existing := mustAdmit(t, s, model.AdmitRequest{
						RequestID: ids.rid(call.rid), CampaignID: c.ID, UserID: call.user, Quantity: 2, IdempotencyKey: call.key,
					})
					if rid != ids.rid(call.wantRID) || existing != call.wantExisting {
						t.Errorf("call %d: got (%s, %v), want (%s, %v)", i, rid, existing, ids.rid(call.wantRID), call.wantExisting)
					}
				}
				st := mustStats(t, s, c.ID)
				if st.Admitted != tt.wantAdmitted || st.Queued() != tt.wantAdmitted {
					t.Errorf("admitted/queued: got %d/%d, want %d/%d", st.Admitted, st.Queued(), tt.wantAdmitted, tt.wantAdmitted)
				}
				users := map[string]string{}
				for _, call := range tt.calls {
					if _, ok := users[call.rid]; !ok {
						users[call.rid] = call.user
					}
				}
				for _, l := range tt.wantQueued {
					want := model.Result{RequestID: ids.rid(l), CampaignID: c.ID, UserID: users[l], Status: model.StatusQueued, Quantity: 2}
					if got := seqless(t, mustResult(t, s, ids.rid(l))); got != want {
						t.Errorf("Result(%s): got %+v, want %+v", l, got, want)
					}
				}
				for _, l := range tt.wantMissing {
					mustNoResult(t, s, ids.rid(l))
				}
			})
		}
	})
}

// TestAdmitNotLoaded: a campaign that was never preloaded is refused per
// request, and the refusal writes nothing.
func TestAdmitNotLoaded(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 10, 1) // never preloaded
		rid := newRequestID(c.ID)
		got, err := s.Admit(t.Context(), c.ID, []model.AdmitRequest{{RequestID: rid, CampaignID: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: "k1"}}, model.RateLimits{})
		if err != nil || len(got) != 1 || got[0] != (model.AdmitReply{Code: model.AdmitNotLoaded}) {
			t.Fatalf("Admit: got (%+v, %v), want one %d answer", got, err, model.AdmitNotLoaded)
		}
		k := campaignKeys(c.ID)
		n, err := s.rdb.Exists(t.Context(), k.results, k.idem, k.counters, k.stock, k.meta).Result()
		if err != nil {
			t.Fatalf("EXISTS: %v", err)
		}
		if n != 0 {
			t.Errorf("keys written by a refused Admit: got %d, want 0", n)
		}
		mustNoResult(t, s, rid)
	})
}

// TestAdmitIdempotencyRace: concurrent batches carrying one shopper's key
// under different request ids must agree on exactly one winner.
func TestAdmitIdempotencyRace(t *testing.T) { forEachServer(t, testAdmitIdempotencyRace) }

func testAdmitIdempotencyRace(t *testing.T, s *Store) {
	const goroutines, perBatch = 32, 8
	c := newCampaign(t, 10, 1)
	mustLoad(t, s, c)
	var (
		mu       sync.Mutex
		admitted []string
		answers  = map[string]int{} // request id answered -> how many times
		wg       sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			batch := make([]model.AdmitRequest, perBatch)
			for i := range batch {
				batch[i] = model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: "k1"}
			}
			got, err := s.Admit(t.Context(), c.ID, batch, model.RateLimits{})
			if err != nil {
				t.Errorf("Admit: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, a := range got {
				if a.Code == model.Admitted {
					admitted = append(admitted, batch[i].RequestID)
				}
				answers[a.RequestID]++
			}
		})
	}
	wg.Wait()
	if len(admitted) != 1 {
		t.Fatalf("got %d admitted requests, want exactly 1", len(admitted))
	}
	if len(answers) != 1 || answers[admitted[0]] != goroutines*perBatch {
		t.Errorf("answers: got %v, want every one of %d to name %s", answers, goroutines*perBatch, admitted[0])
	}
	if st := mustStats(t, s, c.ID); st.Admitted != 1 {
		t.Errorf("admitted: got %d, want 1", st.Admitted)
	}
}

// TestWithdrawBatch: one Withdraw call for a whole failed publish.
func TestWithdrawBatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 10, 1)
		mustLoad(t, s, c)
		var batch []model.AdmitRequest
		for i := range 3 {
			batch = append(batch, model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: fmt.Sprintf("u%d", i), Quantity: 1, IdempotencyKey: "k"})
		}
		if _, err := s.Admit(t.Context(), c.ID, batch, model.RateLimits{}); err != nil {
			t.Fatalf("Admit: %v", err)
		}
		// A request a worker already decided keeps its result.
		mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: batch[0].RequestID, UserID: "u0", Quantity: 1, OrderID: "o1"}})
		mustWithdraw(t, s, batch...)
		if r := mustResult(t, s, batch[0].RequestID); r.Status != model.StatusSuccess {
			t.Errorf("decided request: got %s, want %s", r.Status, model.StatusSuccess)
		}
		for _, a := range batch[1:] {
			mustNoResult(t, s, a.RequestID)
		}
		if st := mustStats(t, s, c.ID); st.Admitted != 1 || st.Queued() != 0 {
			t.Errorf("admitted/queued: got %d/%d, want 1/0", st.Admitted, st.Queued())
		}
	})
}

// TestWithdraw: withdrawing one request, as the gateway does after a failed
// publish.
func TestWithdraw(t *testing.T) {
	tests := []struct {
		name string
		key  string
		// decide runs Deduct on the request before Withdraw.
		decide bool
		// other withdraws a different request id with the same key instead.
		other        bool
		times        int
		wantStatus   model.Status // "" = no result left
		wantAdmitted int64
		wantQueued   int64
		// wantKeyKept: a new request with the same key gets the first one.
		wantKeyKept bool
	}{
		{name: "queued with key is removed", key: "k1", times: 1},
		{name: "queued without key is removed", times: 1},
		{name: "twice decrements once", key: "k1", times: 2},
		{
			name: "final result is kept", key: "k1", decide: true, times: 1,
			wantStatus: model.StatusSuccess, wantAdmitted: 1, wantKeyKept: true,
		},
		{
			name: "another request's key entry is kept", key: "k1", other: true, times: 1,
			wantStatus: model.StatusQueued, wantAdmitted: 1, wantQueued: 1, wantKeyKept: true,
		},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(t, 10, 1)
				mustLoad(t, s, c)
				a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 1, IdempotencyKey: tt.key}
				mustAdmit(t, s, a)
				if tt.decide {
					r := mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: a.RequestID, UserID: a.UserID, Quantity: a.Quantity, OrderID: "o1"}})
					if r.Results[0].Status != model.StatusSuccess {
						t.Fatalf("Deduct: got %s, want %s", r.Results[0].Status, model.StatusSuccess)
					}
				}
				withdrawn := a
				if tt.other {
					withdrawn.RequestID = newRequestID(c.ID)
				}
				for range tt.times {
					mustWithdraw(t, s, withdrawn)
				}

				if tt.wantStatus == "" {
					mustNoResult(t, s, a.RequestID)
				} else if got := mustResult(t, s, a.RequestID); got.Status != tt.wantStatus {
					t.Errorf("Result status: got %s, want %s", got.Status, tt.wantStatus)
				}
				st := mustStats(t, s, c.ID)
				if st.Admitted != tt.wantAdmitted || st.Queued() != tt.wantQueued {
					t.Errorf("admitted/queued: got %d/%d, want %d/%d", st.Admitted, st.Queued(), tt.wantAdmitted, tt.wantQueued)
				}
				if tt.key == "" {
					return
				}
				retry := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: a.UserID, Quantity: 1, IdempotencyKey: tt.key}
				rid, existing := mustAdmit(t, s, retry)
				want, wantExisting := retry.RequestID, false
				if tt.wantKeyKept {
					want, wantExisting = a.RequestID, true
				}
				if rid != want || existing != wantExisting {
					t.Errorf("Admit with the same key after Withdraw: got (%s, %v), want (%s, %v)", rid, existing, want, wantExisting)
				}
			})
		}
	})
}

// TestAdmitReplay: an Idempotency-Key sent again gets its first request as
// it stands now (queued, or its final result), and with another body is
// refused and changes nothing; IdempotentRequest, which the gateway asks
// where it refuses without admitting, answers the same as Admit.
func TestAdmitReplay(t *testing.T) {
	tests := []struct {
		name string
		// before runs on the first request (quantity 2) before the replay.
		before     func(t *testing.T, s *Store, c model.Campaign, first model.AdmitRequest)
		replayQty  int64
		want       model.AdmitCode
		wantStatus model.Status // of the result the replay gets back
		wantOrder  string
	}{
		{name: "queued", replayQty: 2, want: model.AdmitExisting, wantStatus: model.StatusQueued},
		{
			name: "decided: success", replayQty: 2, want: model.AdmitExisting, wantStatus: model.StatusSuccess, wantOrder: "o1",
			before: func(t *testing.T, s *Store, c model.Campaign, first model.AdmitRequest) {
				mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: first.RequestID, UserID: first.UserID, Quantity: first.Quantity, OrderID: "o1"}})
			},
		},
		{
			name: "decided: rejected", replayQty: 2, want: model.AdmitExisting, wantStatus: model.StatusRejected,
			before: func(t *testing.T, s *Store, c model.Campaign, first model.AdmitRequest) {
				d := model.Deduction{RequestID: first.RequestID, UserID: first.UserID, Quantity: first.Quantity}
				if _, err := s.Reject(t.Context(), d, c.ID, model.ReasonNotEnqueued); err != nil {
					t.Fatalf("Reject: %v", err)
				}
			},
		},
		{name: "another quantity while queued", replayQty: 1, want: model.AdmitKeyReused},
		{
			name: "another quantity once decided", replayQty: 1, want: model.AdmitKeyReused,
			before: func(t *testing.T, s *Store, c model.Campaign, first model.AdmitRequest) {
				mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: first.RequestID, UserID: first.UserID, Quantity: first.Quantity, OrderID: "o1"}})
			},
		},
		{
			// Written before keys carried a fingerprint: any body matches.
			name: "key without a fingerprint", replayQty: 1, want: model.AdmitExisting, wantStatus: model.StatusQueued,
			before: func(t *testing.T, s *Store, c model.Campaign, first model.AdmitRequest) {
				k := campaignKeys(c.ID)
				if err := s.rdb.HSet(t.Context(), k.idem, idemField(first.UserID, first.IdempotencyKey), first.RequestID).Err(); err != nil {
					t.Fatalf("HSET: %v", err)
				}
			},
		},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(t, 10, 2)
				mustLoad(t, s, c)
				first := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 2, IdempotencyKey: "k1"}
				mustAdmit(t, s, first)
				if tt.before != nil {
					tt.before(t, s, c, first)
				}
				stBefore, resultBefore := mustStats(t, s, c.ID), mustResult(t, s, first.RequestID)
				replay := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: tt.replayQty, IdempotencyKey: "k1"}
				want := model.AdmitReply{Code: tt.want}
				if tt.want == model.AdmitExisting {
					want.RequestID, want.Result = first.RequestID, resultBefore
					if resultBefore.Status != tt.wantStatus || resultBefore.OrderID != tt.wantOrder {
						t.Fatalf("first request: got %s %q, want %s %q", resultBefore.Status, resultBefore.OrderID, tt.wantStatus, tt.wantOrder)
					}
				}

				looked, ok, err := s.IdempotentRequest(t.Context(), replay)
				if err != nil || !ok || looked != want {
					t.Errorf("IdempotentRequest: got (%+v, %v, %v), want (%+v, true, nil)", looked, ok, err, want)
				}
				got, err := s.Admit(t.Context(), c.ID, []model.AdmitRequest{replay}, model.RateLimits{})
				if err != nil || len(got) != 1 || got[0] != want {
					t.Fatalf("Admit: got (%+v, %v), want [%+v]", got, err, want)
				}

				if st := mustStats(t, s, c.ID); st.Admitted != stBefore.Admitted || st.Queued() != stBefore.Queued() {
					t.Errorf("admitted/queued: got %d/%d, want %d/%d", st.Admitted, st.Queued(), stBefore.Admitted, stBefore.Queued())
				}
				mustNoResult(t, s, replay.RequestID)
				if r := mustResult(t, s, first.RequestID); r != resultBefore {
					t.Errorf("first request's result: got %+v, want %+v", r, resultBefore)
				}
				// The key still names the first request, with its own body.
				again := first
				again.RequestID = newRequestID(c.ID)
				if rid, existing := mustAdmit(t, s, again); rid != first.RequestID || !existing {
					t.Errorf("the first body again: got (%s, %v), want (%s, true)", rid, existing, first.RequestID)
				}
			})
		}
	})
}

// TestAdmitKeyNamingNothing: a key whose request has no result (none is
// expected: withdraw.lua removes both) names nothing, for Admit and
// IdempotentRequest alike, and the next request with it is admitted anew.
func TestAdmitKeyNamingNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 10, 2)
		mustLoad(t, s, c)
		k := campaignKeys(c.ID)
		gone := newRequestID(c.ID)
		if err := s.rdb.HSet(t.Context(), k.idem, idemField("u1", "k1"), gone+"|1").Err(); err != nil {
			t.Fatalf("HSET: %v", err)
		}
		a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Quantity: 2, IdempotencyKey: "k1"}
		if got, ok, err := s.IdempotentRequest(t.Context(), a); err != nil || ok {
			t.Errorf("IdempotentRequest: got (%+v, %v, %v), want none", got, ok, err)
		}
		if rid, existing := mustAdmit(t, s, a); rid != a.RequestID || existing {
			t.Errorf("Admit: got (%s, %v), want (%s, false)", rid, existing, a.RequestID)
		}
		if v := s.rdb.HGet(t.Context(), k.idem, idemField("u1", "k1")).Val(); v != a.RequestID+"|2" {
			t.Errorf("idem value: got %q, want %q", v, a.RequestID+"|2")
		}
	})
}
