package store

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// acks records what ReplicaAck.Observe is told.
type acks struct {
	mu    sync.Mutex
	acked []int
}

func (a *acks) observe(_ time.Duration, acked, _ int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.acked = append(a.acked, acked)
}

func (a *acks) last() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.acked...)
}

// TestDeductWaitsForReplica: with min_replicas_ack 1 a deduction counts
// only once the replica of its master holds it: with the replica stopped
// (SIGSTOP) the deduction is model.ErrUnavailable. Decided again once the
// replica is back, the same request gets the same result and takes no
// second unit. A script the master lost (SCRIPT FLUSH) is sent again.
func TestDeductWaitsForReplica(t *testing.T) {
	c := testenv.PrivateCluster(t, 3, 1)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	seen := &acks{}
	// A wait that may take long on a busy machine for the deductions that
	// must succeed; a short one where the replica is stopped.
	s := New(rdb, WithReplicaAck(ReplicaAck{Replicas: 1, Timeout: 10 * time.Second, Observe: seen.observe}))
	short := New(rdb, WithReplicaAck(ReplicaAck{Replicas: 1, Timeout: 300 * time.Millisecond, Observe: seen.observe}))
	camp := newCampaign(t, 10, 10)
	mustLoad(t, s, camp)
	deduction := func() model.Deduction {
		id := newRequestID(camp.ID)
		return model.Deduction{RequestID: id, UserID: "u1", Quantity: 1, OrderID: model.OrderIDOf(id)}
	}

	master, err := rdb.MasterForKey(t.Context(), campaignKeys(camp.ID).stock)
	if err != nil {
		t.Fatal(err)
	}
	// A new cluster's replica is linked before its first sync is done.
	testenv.Eventually(t, 10*time.Second, "the replica in sync", func() (bool, string) {
		n, err := master.Wait(t.Context(), 1, 100*time.Millisecond).Result()
		return err == nil && n == 1, strconv.FormatInt(n, 10) + " replicas " + errString(err)
	})

	if r := mustDeduct(t, s, camp.ID, []model.Deduction{deduction()}); r.Results[0].Status != model.StatusSuccess {
		t.Fatalf("got %+v, want success", r.Results[0])
	}
	if got := seen.last(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("observed acks %v, want [1]", got)
	}

	if err := master.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if r := mustDeduct(t, s, camp.ID, []model.Deduction{deduction()}); r.Results[0].Status != model.StatusSuccess {
		t.Fatalf("after SCRIPT FLUSH: got %+v, want success", r.Results[0])
	}

	resume := c.StopReplicaOf(t, master)
	d := deduction()
	if _, err := short.Deduct(t.Context(), camp.ID, []model.Deduction{d}); !errors.Is(err, model.ErrUnavailable) {
		t.Fatalf("replica stopped: got %v, want model.ErrUnavailable", err)
	}
	if got := seen.last(); got[len(got)-1] != 0 {
		t.Errorf("observed acks %v, want the last 0", got)
	}
	resume()
	testenv.Eventually(t, 10*time.Second, "the deduction to be acknowledged again", func() (bool, string) {
		r, err := s.Deduct(t.Context(), camp.ID, []model.Deduction{d})
		if err != nil {
			return false, err.Error()
		}
		if r.Results[0].Status != model.StatusSuccess || r.Results[0].OrderID != d.OrderID {
			t.Fatalf("decided again: got %+v, want its success", r.Results[0])
		}
		return true, ""
	})
	if st := mustStats(t, s, camp.ID); st.Remaining != 7 || st.Sold != 3 {
		t.Errorf("got remaining %d, sold %d; want 7 and 3 (one unit per request)", st.Remaining, st.Sold)
	}
}

// TestDeductReplicaShortfall: a server without replicas never acknowledges
// min_replicas_ack 1: the deduction is model.ErrUnavailable after the
// timeout, and with 0 it does not wait.
func TestDeductReplicaShortfall(t *testing.T) {
	rdb := testenv.Redis(t)
	camp := newCampaign(t, 10, 10)
	mustLoad(t, New(rdb), camp)
	id := newRequestID(camp.ID)
	d := []model.Deduction{{RequestID: id, UserID: "u1", Quantity: 1, OrderID: model.OrderIDOf(id)}}
	s := New(rdb, WithReplicaAck(ReplicaAck{Replicas: 1, Timeout: 20 * time.Millisecond}))
	if _, err := s.Deduct(t.Context(), camp.ID, d); !errors.Is(err, model.ErrUnavailable) {
		t.Fatalf("no replica: got %v, want model.ErrUnavailable", err)
	}
	if r := mustDeduct(t, New(rdb), camp.ID, d); r.Results[0].Status != model.StatusSuccess {
		t.Errorf("without the wait: got %+v, want the success decided before", r.Results[0])
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestBucketScriptsWaitForReplicas: with min_replicas_ack 1 a transfer's
// steps, a release and its returns count wait for replicas too: on a
// server without replicas each is model.ErrUnavailable, having done its
// work on the master, and repeating it (here without the wait) finishes it
// exactly once: the transfer's units arrive once, the release's unit comes
// back once, and the sold-out flag comes down.
func TestBucketScriptsWaitForReplicas(t *testing.T) {
	rdb := testenv.Redis(t)
	plain := New(rdb)
	waiting := New(rdb, WithReplicaAck(ReplicaAck{Replicas: 1, Timeout: 20 * time.Millisecond}))
	const n = 2
	c := bucketed(t, plain, 2, n)
	tags := []string{model.BucketTag(c.ID, 0, n), model.BucketTag(c.ID, 1, n)}
	buyer := usersOf(0, n, 1, "a")[0]
	sell(t, plain, tags[0], buyer, 1)
	wantUnits(t, plain, c, []int64{0, 1}, 0)

	snap, err := plain.readBuckets(t.Context(), c.ID, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := waiting.transfer(t.Context(), c.ID, n, 1, 0, snap[0].epoch, 1); !errors.Is(err, model.ErrUnavailable) {
		t.Fatalf("transfer without a replica: got %v, want model.ErrUnavailable", err)
	}
	wantUnits(t, plain, c, []int64{0, 0}, 1) // taken, pending: not given yet
	if err := plain.RecoverTransfers(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantUnits(t, plain, c, []int64{1, 0}, 0)

	order := sell(t, plain, tags[0], buyer, 1)
	if !mustSoldOut(t, plain, c.ID) {
		t.Fatal("sold-out flag down with every unit sold")
	}
	if _, err := waiting.Release(t.Context(), c.ID, order, buyer, 1); !errors.Is(err, model.ErrUnavailable) {
		t.Fatalf("release without a replica: got %v, want model.ErrUnavailable", err)
	}
	if mustRelease(t, plain, c.ID, order, buyer, 1) {
		t.Fatal("release repeated: released again, want released before")
	}
	wantUnits(t, plain, c, []int64{1, 0}, 0)
	if mustSoldOut(t, plain, c.ID) {
		t.Fatal("sold-out flag up after the release was repeated")
	}
}
