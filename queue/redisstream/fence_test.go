package redisstream

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
)

// partition is one stream with its group and lease key on a test server,
// with entries, for the fence's tests.
type partition struct {
	rdb    redis.UniversalClient
	stream string
	ids    []string // the entries, in order
	l      *lease   // the lease "me" believes it holds
}

const (
	myValue    = "me#1"    // the lease value of the consumer under test
	takenValue = "other#2" // the value after another consumer took over
)

// newPartition makes a stream with n entries and the group, and sets the
// lease key to holder ("" for none).
func newPartition(t *testing.T, rdb redis.UniversalClient, n int, holder string) *partition {
	t.Helper()
	ctx := context.Background()
	topic := testenv.Name(t, "fence_")
	p := &partition{rdb: rdb, stream: streamKey(topic, 0)}
	lk := leaseKey(topic, 0)
	t.Cleanup(func() { rdb.Del(context.Background(), p.stream, lk) })
	if err := rdb.XGroupCreateMkStream(ctx, p.stream, DefaultGroup, "0").Err(); err != nil {
		t.Fatalf("create group: %v", err)
	}
	for i := range n {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: p.stream, Values: []any{fieldID, "m" + strconv.Itoa(i), fieldKey, "k", fieldBody, "b"}}).Result()
		if err != nil {
			t.Fatalf("XADD: %v", err)
		}
		p.ids = append(p.ids, id)
	}
	if holder != "" {
		if err := rdb.Set(ctx, lk, holder, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", lk, err)
		}
	}
	// Locally the lease is valid for a long while: the stalled consumer
	// that does not know yet.
	p.l = &lease{key: lk, value: myValue, ttl: time.Minute, deadline: time.Now().Add(time.Minute)}
	return p
}

// deliver reads every entry for consumer, as a plain XREADGROUP would have
// before the lease changed hands.
func (p *partition) deliver(t *testing.T, consumer string) {
	t.Helper()
	err := p.rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{
		Group: DefaultGroup, Consumer: consumer, Streams: []string{p.stream, ">"}, Count: int64(len(p.ids)),
	}).Err()
	if err != nil {
		t.Fatalf("XREADGROUP: %v", err)
	}
}

// pending returns the group's pending entries: owner and delivery count by ID.
func (p *partition) pending(t *testing.T) map[string]redis.XPendingExt {
	t.Helper()
	ps, err := p.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: p.stream, Group: DefaultGroup, Start: "-", End: "+", Count: 100,
	}).Result()
	if err != nil {
		t.Fatalf("XPENDING: %v", err)
	}
	out := make(map[string]redis.XPendingExt, len(ps))
	for _, x := range ps {
		out[x.ID] = x
	}
	return out
}

// checkPending fails unless every entry is pending to owner with count
// deliveries (owner "" for none pending).
func (p *partition) checkPending(t *testing.T, owner string, count int64) {
	t.Helper()
	got := p.pending(t)
	if owner == "" {
		if len(got) != 0 {
			t.Errorf("pending entries: got %d, want none", len(got))
		}
		return
	}
	for _, id := range p.ids {
		x, ok := got[id]
		if !ok || x.Consumer != owner || x.RetryCount != count {
			t.Errorf("entry %s: got pending %v (%+v), want pending to %s with %d deliveries", id, ok, x, owner, count)
		}
	}
}

// TestFence has one case per outcome of each fenced command. The "taken" and
// "expired" cases are a stalled consumer's: its lease still looks valid to
// it, but Redis holds another tenure's value (or none). They fail without the
// fence: a plain XREADGROUP, XAUTOCLAIM, XCLAIM or XACK would act.
func TestFence(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			rdb := srv.dial(t)(t)
			ctx := context.Background()
			const n = 3
			lost := func(t *testing.T, p *partition, err error) {
				t.Helper()
				if !errors.Is(err, errLeaseLost) {
					t.Errorf("got error %v, want errLeaseLost", err)
				}
				if p.l.valid() {
					t.Errorf("lease after a fenced-out call: got valid, want marked lost")
				}
			}

			for _, holder := range []struct{ name, value string }{{"taken", takenValue}, {"expired", ""}} {
				t.Run("read/"+holder.name, func(t *testing.T) {
					p := newPartition(t, rdb, n, holder.value)
					xs, _, err := readEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", 10)
					lost(t, p, err)
					if len(xs) != 0 {
						t.Errorf("got %d entries, want none", len(xs))
					}
					p.checkPending(t, "", 0) // still new for the holder
				})
				t.Run("claim/"+holder.name, func(t *testing.T) {
					p := newPartition(t, rdb, n, holder.value)
					p.deliver(t, "prev")
					_, _, err := claimEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", "0-0", 10)
					lost(t, p, err)
					p.checkPending(t, "prev", 1)
				})
				t.Run("reclaim/"+holder.name, func(t *testing.T) {
					p := newPartition(t, rdb, n, holder.value)
					p.deliver(t, "me")
					_, err := reclaimEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", p.ids)
					lost(t, p, err)
					p.checkPending(t, "me", 1)
				})
				t.Run("unread/"+holder.name, func(t *testing.T) {
					p := newPartition(t, rdb, n, holder.value)
					p.deliver(t, "me")
					err := unreadEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", p.ids)
					lost(t, p, err)
					p.checkPending(t, "me", 1)
				})
				t.Run("ack/"+holder.name, func(t *testing.T) {
					p := newPartition(t, rdb, n, holder.value)
					p.deliver(t, "me")
					err := ackEntries(ctx, rdb, p.l, p.stream, DefaultGroup, p.ids)
					lost(t, p, err)
					p.checkPending(t, "me", 1)
					if got := rdb.XLen(ctx, p.stream).Val(); got != n {
						t.Errorf("XLEN: got %d, want %d (nothing deleted)", got, n)
					}
				})
			}

			// Between the check of the lease and the commands: the holder's
			// own renewal only makes it try again; a take-over stops it.
			for _, tc := range []struct {
				name      string
				meanwhile func(key string) error
				want      error
				tries     int
				pending   string
			}{
				{"renewed meanwhile", func(key string) error { return rdb.PExpire(ctx, key, time.Minute).Err() }, nil, 2, "me"},
				{"taken meanwhile", func(key string) error { return rdb.Set(ctx, key, takenValue, time.Minute).Err() }, errLeaseLost, 1, ""},
			} {
				t.Run("read/"+tc.name, func(t *testing.T) {
					p := newPartition(t, rdb, n, myValue)
					tries := 0
					err := fenced(ctx, rdb, p.l, func(pl redis.Pipeliner) {
						tries++
						if tries == 1 {
							if err := tc.meanwhile(p.l.key); err != nil {
								t.Errorf("change the lease: %v", err)
							}
						}
						pl.XReadGroup(ctx, &redis.XReadGroupArgs{Group: DefaultGroup, Consumer: "me", Streams: []string{p.stream, ">"}, Block: -1})
					})
					if !errors.Is(err, tc.want) || tries != tc.tries {
						t.Errorf("got %v after %d tries, want %v after %d", err, tries, tc.want, tc.tries)
					}
					p.checkPending(t, tc.pending, 1)
				})
			}

			t.Run("read/new entries", func(t *testing.T) {
				p := newPartition(t, rdb, n, myValue)
				xs, _, err := readEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", 10)
				if err != nil || len(xs) != n || xs[0].ID != p.ids[0] || xs[0].Values[fieldID] != "m0" {
					t.Fatalf("got %v, %v, want the %d entries in order", xs, err, n)
				}
				p.checkPending(t, "me", 1)
			})
			t.Run("read/nothing new", func(t *testing.T) {
				p := newPartition(t, rdb, n, myValue)
				p.deliver(t, "me")
				xs, after, err := readEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", 10)
				if err != nil || len(xs) != 0 || after != p.ids[n-1] {
					t.Errorf("got %d entries, after %q, %v, want none, after the last entry %q", len(xs), after, err, p.ids[n-1])
				}
			})
			t.Run("read/empty stream", func(t *testing.T) {
				p := newPartition(t, rdb, 0, myValue)
				xs, after, err := readEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", 10)
				if err != nil || len(xs) != 0 || after != "0-0" {
					t.Errorf("got %d entries, after %q, %v, want none, after \"0-0\"", len(xs), after, err)
				}
			})
			t.Run("read/no group", func(t *testing.T) {
				p := newPartition(t, rdb, 0, myValue)
				rdb.Del(ctx, p.stream)
				_, _, err := readEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", 10)
				if !isNoGroup(err) {
					t.Errorf("got error %v, want NOGROUP", err)
				}
			})
			t.Run("claim/pending", func(t *testing.T) {
				p := newPartition(t, rdb, n, myValue)
				p.deliver(t, "prev")
				xs, next, err := claimEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", "0-0", 10)
				if err != nil || len(xs) != n || next != "0-0" {
					t.Fatalf("got %d entries, next %q, %v, want %d, \"0-0\"", len(xs), next, err, n)
				}
				p.checkPending(t, "me", 2)
			})
			t.Run("claim/pending deleted", func(t *testing.T) {
				p := newPartition(t, rdb, n, myValue)
				p.deliver(t, "prev")
				rdb.XDel(ctx, p.stream, p.ids[0])
				xs, _, err := claimEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", "0-0", 10)
				if err != nil || len(xs) != n-1 || xs[0].ID != p.ids[1] {
					t.Fatalf("got %v, %v, want the %d entries still in the stream", xs, err, n-1)
				}
			})
			t.Run("reclaim/pending", func(t *testing.T) {
				p := newPartition(t, rdb, n, myValue)
				p.deliver(t, "me")
				xs, err := reclaimEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", p.ids)
				if err != nil || len(xs) != n {
					t.Fatalf("got %d entries, %v, want %d", len(xs), err, n)
				}
				p.checkPending(t, "me", 2)
			})
			t.Run("unread/pending", func(t *testing.T) {
				p := newPartition(t, rdb, n, myValue)
				p.deliver(t, "me")
				if err := unreadEntries(ctx, rdb, p.l, p.stream, DefaultGroup, "me", p.ids); err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				p.checkPending(t, "me", 0)
			})
			t.Run("ack/pending", func(t *testing.T) {
				p := newPartition(t, rdb, n, myValue)
				p.deliver(t, "me")
				if err := ackEntries(ctx, rdb, p.l, p.stream, DefaultGroup, p.ids); err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				p.checkPending(t, "", 0)
				if got := rdb.XLen(ctx, p.stream).Val(); got != 0 {
					t.Errorf("XLEN: got %d, want 0 (acknowledged entries deleted)", got)
				}
			})
		})
	}
}
