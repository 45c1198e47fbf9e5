package store

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

// lostGrace is the grace of the lost tests: short, so a request made a
// few seconds back is passed once a later one is decided.
const lostGrace = 100 * time.Millisecond

// requestIDAt is a request id of tag whose UUIDv7 says at, as the gateway
// makes it.
func requestIDAt(tag string, at time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(b[:6], ms[2:])
	b[6] = 0x70 | b[6]&0x0f
	b[8] = 0x80 | b[8]&0x3f
	return model.FormatRequestID(tag, hex.EncodeToString(b[:]))
}

// newOpenCampaign is newCampaign on sale now: the lost rule refuses ids
// from before the start.
func newOpenCampaign(t *testing.T, stock, limit int64) model.Campaign {
	c := newCampaign(t, stock, limit)
	c.StartAt = time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	c.EndAt = c.StartAt.Add(2 * time.Hour)
	return c
}

func mustLost(t *testing.T, s *Store, rid, user string, maxDelay time.Duration) model.Result {
	t.Helper()
	r, err := s.Lost(t.Context(), rid, user, lostGrace, maxDelay)
	if err != nil {
		t.Fatalf("Lost(%s): %v", rid, err)
	}
	return r
}

func lostCount(t *testing.T, s *Store, tag string) int64 {
	t.Helper()
	n, err := s.rdb.HGet(t.Context(), campaignKeys(tag).counters, "lost").Int64()
	if err != nil && err.Error() != "redis: nil" {
		t.Fatal(err)
	}
	return n
}

// TestLost: each reply of lost.lua. A request with a result gets it back
// and nothing changes; one the queue has not passed reads queued and
// nothing is written; one it passed (a request admitted after it decided,
// or the sale ended the delay ago) gets rejected (lost), owned by the
// caller and counted, and a late message of it takes nothing; an id the
// campaign cannot have issued is not found.
func TestLost(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newOpenCampaign(t, 5, 2)
		mustLoad(t, s, c)
		old := time.Now().Add(-time.Minute)

		// A result stands: decided, and queued.
		decided := model.Deduction{RequestID: requestIDAt(c.ID, old), UserID: "alice", Quantity: 1, OrderID: "o-alice"}
		mustDeduct(t, s, c.ID, []model.Deduction{decided})
		queued := queuedRequest(t, s, c, "bob")

		// Before the queue passed anything: queued, nothing written.
		early := requestIDAt(c.ID, old)
		if r := mustLost(t, s, early, "dave", 0); r.Status != model.StatusQueued || r.UserID != "dave" {
			t.Fatalf("not passed: got %+v, want queued of dave", r)
		}
		mustNoResult(t, s, early)

		passQueue(t, s, c, "carol")
		if r := mustLost(t, s, decided.RequestID, "mallory", 0); r.Status != model.StatusSuccess || r.UserID != "alice" {
			t.Fatalf("decided: got %+v, want alice's success", r)
		}
		if r := mustLost(t, s, queued.RequestID, "bob", 0); r.Status != model.StatusQueued || r.Seq == 0 {
			t.Fatalf("queued marker: got %+v, want it as stored", r)
		}
		// Admitted now: within the grace and skew of the line, not passed.
		recent := requestIDAt(c.ID, time.Now())
		if r := mustLost(t, s, recent, "erin", 0); r.Status != model.StatusQueued {
			t.Fatalf("admitted after the line: got %+v, want queued", r)
		}
		mustNoResult(t, s, recent)
		if n := lostCount(t, s, c.ID); n != 0 {
			t.Fatalf("lost counter: got %d, want 0", n)
		}

		// Passed: lost, once, the first caller's.
		before := mustStats(t, s, c.ID)
		r := mustLost(t, s, early, "dave", 0)
		want := model.Result{RequestID: early, CampaignID: c.ID, UserID: "dave", Status: model.StatusRejected, Reason: model.ReasonLost}
		if r != want {
			t.Fatalf("passed: got %+v, want %+v", r, want)
		}
		if got := mustResult(t, s, early); got != want {
			t.Fatalf("stored: got %+v, want %+v", got, want)
		}
		if r := mustLost(t, s, early, "mallory", 0); r != want {
			t.Fatalf("again, by another user: got %+v, want %+v", r, want)
		}
		if n := lostCount(t, s, c.ID); n != 1 {
			t.Fatalf("lost counter: got %d, want 1", n)
		}
		// reconcile lists it from the snapshot.
		if snap, err := s.Snapshot(t.Context(), c.ID); err != nil || !slices.Equal(snap.Lost, []string{early}) {
			t.Fatalf("snapshot's lost: got %v (%v), want [%s]", snap.Lost, err, early)
		}
		// Its message after all: the lost result, no unit taken.
		late := model.Deduction{RequestID: early, UserID: "dave", Quantity: 1, OrderID: "o-dave"}
		if got := mustDeduct(t, s, c.ID, []model.Deduction{late}).Results[0]; got.Status != model.StatusRejected || got.Reason != model.ReasonLost {
			t.Fatalf("late Deduct: got %+v, want rejected (lost)", got)
		}
		after := mustStats(t, s, c.ID)
		if after.Lost != before.Lost+1 {
			t.Fatalf("stats' lost: got %d, want %d", after.Lost, before.Lost+1)
		}
		if after.Remaining != before.Remaining || after.Admitted != before.Admitted || mustUserUnits(t, s, c.ID, "dave") != 0 {
			t.Fatalf("after lost and the late message: remaining %d, admitted %d, dave %d; want %d, %d, 0",
				after.Remaining, after.Admitted, mustUserUnits(t, s, c.ID, "dave"), before.Remaining, before.Admitted)
		}
		checkFinished(t, after, before.FinishedByStatus)

		// Sold out: a lost request could only be refused, so it ends at
		// once, with nothing passing it and the delay rules off.
		so := newOpenCampaign(t, 1, 1)
		mustLoad(t, s, so)
		mustDeduct(t, s, so.ID, []model.Deduction{{RequestID: requestIDAt(so.ID, old), UserID: "alice", Quantity: 1, OrderID: "o-so"}})
		if r := mustLost(t, s, requestIDAt(so.ID, old), "gina", 0); r.Status != model.StatusRejected || r.Reason != model.ReasonLost {
			t.Fatalf("sold out: got %+v, want rejected (lost)", r)
		}
		// Of several buckets, an empty one may be refilled by another
		// until the campaign's sold-out flag says every one is empty.
		bc := newOpenCampaign(t, 2, 100)
		bc.Buckets = 2
		mustLoad(t, s, bc)
		tag := model.BucketTag(bc.ID, 0, 2)
		buyers := usersOf(0, 2, 2, "lost-b")
		mustDeduct(t, s, tag, []model.Deduction{{RequestID: requestIDAt(tag, old), UserID: buyers[0], Quantity: 1, OrderID: "o-b0"}})
		wantUnits(t, s, bc, []int64{0, 1}, 0)
		unsold := requestIDAt(tag, old)
		if r := mustLost(t, s, unsold, "gina", 0); r.Status != model.StatusQueued {
			t.Fatalf("an empty bucket of two, the other holding a unit: got %+v, want queued", r)
		}
		if r := mustDeduct(t, s, tag, []model.Deduction{{RequestID: requestIDAt(tag, old), UserID: buyers[1], Quantity: 1, OrderID: "o-b1"}}); !r.SoldOutNow {
			t.Fatalf("the last unit, from the other bucket: got %+v, want sold out now", r)
		}
		if r := mustLost(t, s, unsold, "gina", 0); r.Status != model.StatusRejected || r.Reason != model.ReasonLost {
			t.Fatalf("every bucket empty, the flag up: got %+v, want rejected (lost)", r)
		}

		// The sale ended the delay ago: everything is passed, nothing after
		// the end is a request.
		e := newOpenCampaign(t, 1, 1)
		mustLoad(t, s, e)
		if err := s.rdb.HSet(t.Context(), campaignKeys(e.ID).meta, "end_ms", time.Now().Add(-10*time.Minute).UnixMilli()).Err(); err != nil {
			t.Fatal(err)
		}
		inSale := requestIDAt(e.ID, time.Now().Add(-20*time.Minute))
		if r := mustLost(t, s, inSale, "frank", 0); r.Status != model.StatusQueued {
			t.Fatalf("ended rule off: got %+v, want queued", r)
		}
		if r := mustLost(t, s, inSale, "frank", time.Hour); r.Status != model.StatusQueued {
			t.Fatalf("ended less than the delay ago: got %+v, want queued", r)
		}
		if r := mustLost(t, s, inSale, "frank", time.Minute); r.Status != model.StatusRejected || r.Reason != model.ReasonLost {
			t.Fatalf("ended the delay ago: got %+v, want rejected (lost)", r)
		}
		if r, err := s.Lost(t.Context(), requestIDAt(e.ID, time.Now()), "frank", lostGrace, time.Minute); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("id after the end: got %+v, %v; want %v", r, err, model.ErrNotFound)
		}

		// A campaign Redis does not hold: the caller decides whether it
		// should (a restore) or the id is unknown.
		other := newOpenCampaign(t, 1, 1) // not loaded
		if r, err := s.Lost(t.Context(), requestIDAt(other.ID, old), "gina", lostGrace, 0); !errors.Is(err, model.ErrNotLoaded) {
			t.Errorf("not loaded: got %+v, %v; want %v", r, err, model.ErrNotLoaded)
		}

		// Ids no request of the campaign has.
		for name, rid := range map[string]string{
			"malformed":    c.ID + ".xyz",
			"before start": requestIDAt(c.ID, time.Now().Add(-4*time.Hour)),
			"future":       requestIDAt(c.ID, time.Now().Add(time.Hour)),
		} {
			if r, err := s.Lost(t.Context(), rid, "gina", lostGrace, 0); !errors.Is(err, model.ErrNotFound) {
				t.Errorf("%s: got %+v, %v; want %v", name, r, err, model.ErrNotFound)
			}
		}
	})
}

// TestLostRace: lost.lua and deduct.lua race on the same requests, the
// queue having passed them (their state died: no marker). Each request
// ends with exactly one final result, the one both calls report; a lost
// one takes no unit; sold units are the successes'; the lost counter
// counts the lost ones.
func TestLostRace(t *testing.T) { forEachServer(t, testLostRace) }

func testLostRace(t *testing.T, s *Store) {
	const (
		stock    = 30
		requests = 60
	)
	c := newOpenCampaign(t, stock, 1)
	mustLoad(t, s, c)
	queuedRequest(t, s, c, "line") // a sweep marks only after an admission
	passQueue(t, s, c, "passer")
	old := time.Now().Add(-time.Minute)
	ds := make([]model.Deduction, requests)
	for i := range ds {
		ds[i] = model.Deduction{RequestID: requestIDAt(c.ID, old), UserID: fmt.Sprintf("u%d", i), Quantity: 1, OrderID: fmt.Sprintf("o%d", i)}
	}
	byDeduct := make([]model.Result, requests)
	byLost := make([]model.Result, requests)
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Go(func() {
			r, err := s.Deduct(t.Context(), c.ID, []model.Deduction{d})
			if err != nil {
				t.Errorf("Deduct(%s): %v", d.RequestID, err)
				return
			}
			byDeduct[i] = r.Results[0]
		})
		wg.Go(func() {
			r, err := s.Lost(t.Context(), d.RequestID, d.UserID, lostGrace, 0)
			if err != nil {
				t.Errorf("Lost(%s): %v", d.RequestID, err)
				return
			}
			byLost[i] = r
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var lost, sold int64
	for i, d := range ds {
		stored, err := s.rdb.HGet(t.Context(), campaignKeys(c.ID).results, d.RequestID).Result()
		if err != nil {
			t.Fatalf("stored result of %s: %v", d.RequestID, err)
		}
		v, err := parseStored(stored)
		if err != nil {
			t.Fatal(err)
		}
		// Lost shows a success above the durable mark as queued, as every
		// reader does.
		shown := v.shown(0)
		if v.Status != byDeduct[i].Status || v.Reason != byDeduct[i].Reason || byLost[i].Status != shown.Status || byLost[i].Reason != shown.Reason {
			t.Errorf("request %d: stored %q, Deduct said %s (%s), Lost said %s (%s); want all the same",
				i, stored, byDeduct[i].Status, byDeduct[i].Reason, byLost[i].Status, byLost[i].Reason)
		}
		switch {
		case v.Status == model.StatusRejected && v.Reason == model.ReasonLost:
			lost++
			if n := mustUserUnits(t, s, c.ID, d.UserID); n != 0 {
				t.Errorf("request %d lost: user has %d units, want 0", i, n)
			}
		case v.Status == model.StatusSuccess:
			sold++
		case v.Status != model.StatusSoldOut:
			t.Errorf("request %d: stored %q, want success, sold_out or rejected (lost)", i, stored)
		}
	}
	st := mustStats(t, s, c.ID)
	if sold > stock || st.Remaining != stock-1-sold || st.Remaining < 0 {
		t.Errorf("sold %d of %d, remaining %d; want remaining %d >= 0", sold, stock, st.Remaining, stock-1-sold)
	}
	if n := lostCount(t, s, c.ID); n != lost {
		t.Errorf("lost counter: got %d, want %d", n, lost)
	}
	t.Logf("%d lost, %d sold of %d requests", lost, sold, requests)
}
