package store

import (
	"errors"
	"maps"
	"reflect"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// ledgerOrder is an order of the test ledger, its request id from labels.
func ledgerOrder(ids *labels, label, orderID, user string, units int64, status model.OrderStatus) model.Order {
	return model.Order{ID: orderID, RequestID: ids.rid(label), CampaignID: ids.campaignID, UserID: user,
		Quantity: units, Status: status}
}

// TestRebuildRefusals: a load carries the refusals MySQL decided (the
// degraded mode) with the orders' successes, and keeps those Redis
// decided: each reads as it did, counts as admitted and finished by its
// status, and a redelivery of its request decides nothing again. A success
// Redis decided without an order goes.
func TestRebuildRefusals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 2, 1)
		mustLoad(t, s, c)
		ids := newLabels(c.ID)
		orders := []model.Order{ledgerOrder(ids, "r1", model.OrderIDOf(ids.rid("r1")), "alice", 1, model.OrderPendingPayment)}
		refusals := []model.Result{
			{RequestID: ids.rid("r2"), CampaignID: c.ID, UserID: "alice", Status: model.StatusLimitExceeded, Quantity: 1},
			{RequestID: ids.rid("r3"), CampaignID: c.ID, UserID: "bob", Status: model.StatusSoldOut, Quantity: 1},
		}
		// Decided in Redis before: carol's success, never stored, goes
		// (decided again); her refusal stays.
		carol := mustDeduct(t, s, c.ID, []model.Deduction{
			{RequestID: ids.rid("r4"), UserID: "carol", Quantity: 1, OrderID: model.OrderIDOf(ids.rid("r4"))},
			{RequestID: ids.rid("r5"), UserID: "carol", Quantity: 1, OrderID: model.OrderIDOf(ids.rid("r5"))},
		}).Results
		if carol[1].Status != model.StatusLimitExceeded {
			t.Fatalf("carol's second request: got %+v, want limit_exceeded", carol[1])
		}
		c.Epoch = 2
		if loaded, err := s.Rebuild(t.Context(), c, orders, refusals); err != nil || !loaded {
			t.Fatalf("Rebuild: got %v, %v; want loaded", loaded, err)
		}
		mustNoResult(t, s, ids.rid("r4"))
		if got := mustResult(t, s, ids.rid("r5")); got != carol[1] {
			t.Errorf("carol's refusal after the rebuild: got %+v, want %+v", got, carol[1])
		}
		want := model.Stats{Loaded: true, Stock: 2, Remaining: 1, Sold: 1, Admitted: 4,
			FinishedByStatus: finished(map[model.Status]int64{model.StatusSuccess: 1, model.StatusLimitExceeded: 2, model.StatusSoldOut: 1})}
		if got := mustStats(t, s, c.ID); !reflect.DeepEqual(got, want) {
			t.Errorf("Stats: got %+v, want %+v", got, want)
		}
		for _, r := range refusals {
			if got := mustResult(t, s, r.RequestID); got != r {
				t.Errorf("result of %s: got %+v, want %+v", r.RequestID, got, r)
			}
		}
		// bob's sold-out request again, with a unit left: it stays refused.
		again := mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: ids.rid("r3"), UserID: "bob", Quantity: 1, OrderID: model.OrderIDOf(ids.rid("r3"))}})
		if got := again.Results[0]; got.Status != model.StatusSoldOut {
			t.Errorf("redelivered refusal: got %+v, want sold_out as MySQL decided", got)
		}
	})
}

// TestRebuild: a campaign whose Redis state is stale (results, keys and
// counters of the old epoch) is rebuilt from its ledger, orders in every
// lifecycle state: only the active ones hold units, every order's request
// keeps its success, and the released hash makes a late release of an
// order that is no longer active change nothing.
func TestRebuild(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 10, 3)
		mustLoad(t, s, c)
		ids := newLabels(c.ID)
		// The old epoch's state: a success whose order never reached
		// MySQL, an Idempotency-Key, units of a buyer without orders.
		mustAdmit(t, s, model.AdmitRequest{RequestID: ids.rid("stale"), CampaignID: c.ID, UserID: "erin", Quantity: 2, IdempotencyKey: "k"})
		mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: ids.rid("stale"), UserID: "erin", Quantity: 2, OrderID: "o-stale"}})

		orders := []model.Order{
			ledgerOrder(ids, "r1", "o1", "alice", 2, model.OrderPendingPayment),
			ledgerOrder(ids, "r2", "o2", "bob", 1, model.OrderPaid),
			ledgerOrder(ids, "r3", "o3", "alice", 1, model.OrderExpired),
			ledgerOrder(ids, "r4", "o4", "carol", 2, model.OrderCancelled),
			ledgerOrder(ids, "r5", "o5", "dave", 1, model.OrderRefunded),
		}
		c.Epoch = 2
		mustRebuild(t, s, c, orders)

		want := model.Stats{Loaded: true, Stock: 10, Remaining: 7, Sold: 3, Admitted: 5,
			FinishedByStatus: finished(map[model.Status]int64{model.StatusSuccess: 5})}
		if got := mustStats(t, s, c.ID); !reflect.DeepEqual(got, want) {
			t.Errorf("Stats: got %+v, want %+v", got, want)
		}
		for user, units := range map[string]int64{"alice": 2, "bob": 1, "carol": 0, "dave": 0, "erin": 0} {
			if got := mustUserUnits(t, s, c.ID, user); got != units {
				t.Errorf("units of %s: got %d, want %d", user, got, units)
			}
		}
		for _, o := range orders {
			want := model.Result{RequestID: o.RequestID, CampaignID: c.ID, UserID: o.UserID, Status: model.StatusSuccess,
				OrderID: o.ID, Quantity: o.Quantity}
			if got := mustResult(t, s, o.RequestID); got != want {
				t.Errorf("result of %s: got %+v, want %+v", o.ID, got, want)
			}
		}
		mustNoResult(t, s, ids.rid("stale"))
		if a, ok, err := s.IdempotentRequest(t.Context(), model.AdmitRequest{CampaignID: c.ID, UserID: "erin", Quantity: 2, IdempotencyKey: "k"}); err != nil || ok {
			t.Errorf("Idempotency-Key of the old epoch: got %+v, %v, %v; want none", a, ok, err)
		}
		released, err := s.rdb.HGetAll(t.Context(), campaignKeys(c.ID).released).Result()
		if wantReleased := map[string]string{"o3": "1", "o4": "2", "o5": "1"}; err != nil || !maps.Equal(released, wantReleased) {
			t.Errorf("released: got %v (%v), want %v", released, err, wantReleased)
		}
		p, err := s.Projection(t.Context(), c.ID)
		wantP := model.Projection{Loaded: true, Epoch: 2, Stock: 10, Limit: 3, StartAt: c.StartAt.UTC(), EndAt: c.EndAt.UTC()}
		if err != nil || p != wantP {
			t.Errorf("Projection: got %+v, %v; want %+v", p, err, wantP)
		}

		// A release in flight for an order the rebuild saw final changes
		// nothing; one for an active order (expired just now) gives back.
		before := campaignState(t, s, c.ID)
		if mustRelease(t, s, c.ID, "o3", "alice", 1) {
			t.Errorf("release of expired o3 after the rebuild: got true, want false")
		}
		if after := campaignState(t, s, c.ID); !maps.Equal(before, after) {
			t.Errorf("release of expired o3 changed %v into %v", before, after)
		}
		if !mustRelease(t, s, c.ID, "o1", "alice", 2) {
			t.Errorf("release of active o1: got false, want true")
		}
		if st := mustStats(t, s, c.ID); st.Remaining != 9 || st.Sold != 1 || mustUserUnits(t, s, c.ID, "alice") != 0 {
			t.Errorf("after releasing o1: got remaining %d, sold %d, alice %d; want 9, 1, 0", st.Remaining, st.Sold, mustUserUnits(t, s, c.ID, "alice"))
		}

		// The rebuilt state decides: a redelivered request with an order
		// keeps it, under the new epoch; alice may buy within her limit.
		r := mustDeduct(t, s, c.ID, []model.Deduction{
			{RequestID: ids.rid("r2"), UserID: "bob", Quantity: 1, OrderID: "o-again"},
			{RequestID: ids.rid("r6"), UserID: "alice", Quantity: 3, OrderID: "o6"},
		})
		if r.Epoch != 2 || r.Results[0].OrderID != "o2" || r.Results[1].Status != model.StatusSuccess {
			t.Errorf("deduct after the rebuild: got epoch %d, %+v; want epoch 2, o2 kept, o6 a success", r.Epoch, r.Results)
		}
	})
}

// TestRebuildSoldOut: active orders holding the whole stock leave nothing
// and set the sold-out flag; expired orders' units are back.
func TestRebuildSoldOut(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 3, 3)
		ids := newLabels(c.ID)
		mustRebuild(t, s, c, []model.Order{
			ledgerOrder(ids, "r1", "o1", "alice", 2, model.OrderPaid),
			ledgerOrder(ids, "r2", "o2", "bob", 1, model.OrderPendingPayment),
		})
		if st := mustStats(t, s, c.ID); st.Remaining != 0 || !st.SoldOut || !mustSoldOut(t, s, c.ID) {
			t.Fatalf("got remaining %d, sold out %v; want 0, true", st.Remaining, st.SoldOut)
		}
		r := mustDeduct(t, s, c.ID, []model.Deduction{{RequestID: ids.rid("r3"), UserID: "carol", Quantity: 1, OrderID: "o3"}})
		if r.Results[0].Status != model.StatusSoldOut {
			t.Fatalf("deduct: got %s, want %s", r.Results[0].Status, model.StatusSoldOut)
		}

		c.Epoch++
		mustRebuild(t, s, c, []model.Order{
			ledgerOrder(ids, "r1", "o1", "alice", 2, model.OrderPaid),
			ledgerOrder(ids, "r2", "o2", "bob", 1, model.OrderExpired),
		})
		if st := mustStats(t, s, c.ID); st.Remaining != 1 || st.SoldOut || mustSoldOut(t, s, c.ID) {
			t.Fatalf("got remaining %d, sold out %v; want 1, false", st.Remaining, st.SoldOut)
		}
	})
}

// TestRebuildRefused: a load under an epoch Redis holds already, or an
// older one, and a ledger holding more than the stock change nothing; a
// campaign loaded before epochs existed counts as epoch 0.
func TestRebuildRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 5, 2)
		c.Epoch = 3
		ids := newLabels(c.ID)
		mustRebuild(t, s, c, []model.Order{ledgerOrder(ids, "r1", "o1", "alice", 1, model.OrderPaid)})
		before := campaignState(t, s, c.ID)
		for _, epoch := range []model.Epoch{3, 2} {
			older := c
			older.Epoch = epoch
			if loaded, err := s.Rebuild(t.Context(), older, nil, nil); err != nil || loaded {
				t.Errorf("Rebuild under epoch %d with Redis at 3: got %v, %v; want false, nil", epoch, loaded, err)
			}
		}
		over := c
		over.Epoch = 4
		_, err := s.Rebuild(t.Context(), over, []model.Order{
			ledgerOrder(ids, "r1", "o1", "alice", 2, model.OrderPaid),
			ledgerOrder(ids, "r2", "o2", "bob", 4, model.OrderPendingPayment),
		}, nil)
		if !errors.Is(err, model.ErrConflict) {
			t.Errorf("Rebuild of 6 active units into stock 5: got %v, want %v", err, model.ErrConflict)
		}
		if after := campaignState(t, s, c.ID); !maps.Equal(before, after) {
			t.Errorf("refused rebuilds changed %v into %v", before, after)
		}

		// Loaded before epochs: meta has no epoch field.
		if err := s.rdb.HDel(t.Context(), campaignKeys(c.ID).meta, "epoch").Err(); err != nil {
			t.Fatal(err)
		}
		if p, err := s.Projection(t.Context(), c.ID); err != nil || !p.Loaded || p.Epoch != 0 {
			t.Fatalf("Projection without an epoch: got %+v, %v; want loaded, epoch 0", p, err)
		}
		c.Epoch = 1
		mustRebuild(t, s, c, nil)
	})
}

// TestDeductHolds: a campaign with no stock in Redis, never loaded or
// lost, and a paused one, decide nothing and write nothing; once loaded or
// resumed the same batch is decided.
func TestDeductHolds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 5, 1)
		ids := newLabels(c.ID)
		batch := []model.Deduction{
			{RequestID: ids.rid("r1"), UserID: "alice", Quantity: 1, OrderID: "o1"},
			{RequestID: ids.rid("r2"), UserID: "bob", Quantity: 0, OrderID: "o2"}, // bad, but held too
		}
		hold := func(t *testing.T, want error) {
			t.Helper()
			before := campaignState(t, s, c.ID)
			r, err := s.Deduct(t.Context(), c.ID, batch)
			if !errors.Is(err, want) || len(r.Results) != 0 {
				t.Fatalf("Deduct: got %+v, %v; want no results, %v", r, err, want)
			}
			if after := campaignState(t, s, c.ID); !maps.Equal(before, after) {
				t.Fatalf("held Deduct changed %v into %v", before, after)
			}
			mustNoResult(t, s, ids.rid("r1"))
			mustNoResult(t, s, ids.rid("r2"))
		}
		t.Run("never loaded", func(t *testing.T) { hold(t, model.ErrNotLoaded) })

		mustLoad(t, s, c)
		t.Run("paused", func(t *testing.T) {
			c.Paused = true
			if ok, err := s.SetPaused(t.Context(), c); err != nil || !ok {
				t.Fatalf("SetPaused: got %v, %v; want true, nil", ok, err)
			}
			hold(t, model.ErrPaused)
			if p, err := s.Projection(t.Context(), c.ID); err != nil || !p.Paused {
				t.Fatalf("Projection: got %+v, %v; want paused", p, err)
			}
			// A flag read under another epoch is not written.
			other := c
			other.Epoch, other.Paused = c.Epoch+1, false
			if ok, err := s.SetPaused(t.Context(), other); err != nil || ok {
				t.Fatalf("SetPaused under another epoch: got %v, %v; want false, nil", ok, err)
			}
			hold(t, model.ErrPaused)
			c.Paused = false
			if ok, err := s.SetPaused(t.Context(), c); err != nil || !ok {
				t.Fatalf("SetPaused(resume): got %v, %v; want true, nil", ok, err)
			}
		})
		t.Run("lost", func(t *testing.T) {
			k := campaignKeys(c.ID)
			if err := s.rdb.Del(t.Context(), k.meta, k.stock).Err(); err != nil {
				t.Fatal(err)
			}
			hold(t, model.ErrNotLoaded)
			if ok, err := s.SetPaused(t.Context(), c); err != nil || ok {
				t.Fatalf("SetPaused of a lost campaign: got %v, %v; want false, nil", ok, err)
			}
		})
		c.Epoch++
		mustLoad(t, s, c)
		r := mustDeduct(t, s, c.ID, batch)
		if r.Epoch != c.Epoch || r.Results[0].Status != model.StatusSuccess || r.Results[1].Reason != model.ReasonBadMessage {
			t.Fatalf("Deduct once loaded: got %+v, want epoch %d, a success and a bad message", r, c.Epoch)
		}
	})
}

// TestProjection: nothing before a load, then the values and epoch of the
// last load.
func TestProjection(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 7, 2)
		if p, err := s.Projection(t.Context(), c.ID); err != nil || p != (model.Projection{}) {
			t.Fatalf("Projection before a load: got %+v, %v; want zero", p, err)
		}
		c.Paused, c.Epoch = true, 5
		mustLoad(t, s, c)
		want := model.Projection{Loaded: true, Epoch: 5, Stock: 7, Limit: 2, StartAt: c.StartAt.UTC(), EndAt: c.EndAt.UTC(), Paused: true}
		if p, err := s.Projection(t.Context(), c.ID); err != nil || p != want {
			t.Fatalf("Projection: got %+v, %v; want %+v", p, err, want)
		}
	})
}

// TestDecidedWithoutMarker: a request decided (or given up on) without the
// queued marker admit.lua stores — a rebuild wiped it — counts as admitted
// then, once, so every final result has its admission and none is queued.
func TestDecidedWithoutMarker(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 5, 5)
		mustLoad(t, s, c)
		ids := newLabels(c.ID)
		mustAdmit(t, s, model.AdmitRequest{RequestID: ids.rid("marked"), CampaignID: c.ID, UserID: "u1", Quantity: 1})
		batch := []model.Deduction{
			{RequestID: ids.rid("marked"), UserID: "u1", Quantity: 1, OrderID: "o1"},
			{RequestID: ids.rid("bare"), UserID: "u2", Quantity: 1, OrderID: "o2"},
			{RequestID: ids.rid("bare"), UserID: "u2", Quantity: 1, OrderID: "o3"},
		}
		mustDeduct(t, s, c.ID, batch)
		mustDeduct(t, s, c.ID, batch) // a redelivery counts nothing again
		r, err := s.Reject(t.Context(), model.Deduction{RequestID: ids.rid("poison"), UserID: "u3", Quantity: 1}, c.ID, model.ReasonPoison)
		if err != nil || r.Status != model.StatusRejected {
			t.Fatalf("Reject: got %+v, %v", r, err)
		}
		st := mustStats(t, s, c.ID)
		if st.Admitted != 3 || st.Queued() != 0 {
			t.Fatalf("got admitted %d, queued %d; want 3, 0", st.Admitted, st.Queued())
		}
		checkFinished(t, st, map[model.Status]int64{model.StatusSuccess: 2, model.StatusRejected: 1})
	})
}
