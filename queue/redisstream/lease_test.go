package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
)

// TestLeaseScripts has one case per reply of each lease script.
func TestLeaseScripts(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			rdb := srv.dial(t)(t)
			s := newLeaseScripts()
			ctx := context.Background()
			const ttl = 5 * time.Second

			t.Run("acquire", func(t *testing.T) {
				topic := testenv.Name(t, "lease_")
				key := leaseKey(topic, 0)
				t.Cleanup(func() { rdb.Del(context.Background(), key, fenceKey(topic, 0)) })
				var values []string
				for range 2 {
					l, err := acquireLease(ctx, rdb, s, topic, 0, "me", ttl)
					if err != nil || l == nil {
						t.Fatalf("acquire a free lease: got %v, %v, want a lease", l, err)
					}
					if got := rdb.Get(ctx, key).Val(); got != l.value {
						t.Errorf("key after acquiring: got %q, want the lease's value %q", got, l.value)
					}
					if pttl := rdb.PTTL(ctx, key).Val(); pttl < ttl-time.Second || pttl > ttl {
						t.Errorf("TTL after acquiring: got %v, want about %v", pttl, ttl)
					}
					other, err := acquireLease(ctx, rdb, s, topic, 0, "other", ttl)
					if err != nil || other != nil {
						t.Errorf("acquire a held lease: got %v, %v, want nil, nil", other, err)
					}
					values = append(values, l.value)
					if held, err := releaseLease(ctx, rdb, s, l); err != nil || !held {
						t.Fatalf("release: got %v, %v, want true, nil", held, err)
					}
				}
				// The same owner's next tenure gets a new token: a batch of
				// its old tenure cannot pass the fence of the new one.
				if values[0] != "me#1" || values[1] != "me#2" {
					t.Errorf("lease values of two tenures: got %q, want \"me#1\" then \"me#2\"", values)
				}
			})

			tests := []struct {
				name   string
				holder string // value of the key; "" for no key
				run    func(l *lease) (bool, error)
				want   bool
				// wantValue is the key's value afterwards; "" for no key.
				wantValue string
			}{
				{"renew own lease", "me#1", func(l *lease) (bool, error) { return renewLease(ctx, rdb, s, l) }, true, "me#1"},
				{"renew taken lease", "other#2", func(l *lease) (bool, error) { return renewLease(ctx, rdb, s, l) }, false, "other#2"},
				{"renew own lease of a past tenure", "me#2", func(l *lease) (bool, error) { return renewLease(ctx, rdb, s, l) }, false, "me#2"},
				{"renew expired lease", "", func(l *lease) (bool, error) { return renewLease(ctx, rdb, s, l) }, false, ""},
				{"release own lease", "me#1", func(l *lease) (bool, error) { return releaseLease(ctx, rdb, s, l) }, true, ""},
				{"release taken lease", "other#2", func(l *lease) (bool, error) { return releaseLease(ctx, rdb, s, l) }, false, "other#2"},
				{"release expired lease", "", func(l *lease) (bool, error) { return releaseLease(ctx, rdb, s, l) }, false, ""},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					key := leaseKey(testenv.Name(t, "lease_"), 0)
					t.Cleanup(func() { rdb.Del(context.Background(), key) })
					if tc.holder != "" {
						if err := rdb.Set(ctx, key, tc.holder, ttl).Err(); err != nil {
							t.Fatalf("SET %s: %v", key, err)
						}
					}
					l := &lease{key: key, value: "me#1", ttl: ttl, deadline: time.Now().Add(time.Second)}
					got, err := tc.run(l)
					if err != nil {
						t.Fatalf("got error %v, want nil", err)
					}
					if got != tc.want {
						t.Errorf("got %v, want %v", got, tc.want)
					}
					value, _ := rdb.Get(ctx, key).Result()
					if value != tc.wantValue {
						t.Errorf("key afterwards: got %q, want %q", value, tc.wantValue)
					}
					if tc.name == "renew own lease" {
						if pttl := rdb.PTTL(ctx, key).Val(); pttl < ttl-time.Second {
							t.Errorf("TTL after renewal: got %v, want about %v", pttl, ttl)
						}
						if !l.valid() || time.Until(l.deadline) < ttl-time.Second {
							t.Errorf("local deadline after renewal: got %v from now, want about %v", time.Until(l.deadline), ttl)
						}
					}
				})
			}
		})
	}
}

// TestLeaseRace has many consumers race for one lease: exactly one wins, and
// only the winner can read the partition, renew the lease and release it.
func TestLeaseRace(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			rdb := srv.dial(t)(t)
			s := newLeaseScripts()
			ctx := context.Background()
			topic := testenv.Name(t, "race_")
			key, stream := leaseKey(topic, 0), streamKey(topic, 0)
			t.Cleanup(func() { rdb.Del(context.Background(), key, fenceKey(topic, 0), stream) })
			if err := rdb.XGroupCreateMkStream(ctx, stream, DefaultGroup, "0").Err(); err != nil {
				t.Fatalf("create group: %v", err)
			}
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{fieldID, "m1"}}).Err(); err != nil {
				t.Fatalf("XADD: %v", err)
			}

			const racers = 50
			var wins atomic.Int32
			leases := make([]*lease, racers)
			var wg sync.WaitGroup
			for i := range racers {
				wg.Go(func() {
					l, err := acquireLease(ctx, rdb, s, topic, 0, fmt.Sprintf("racer-%d", i), 5*time.Second)
					if err != nil {
						t.Errorf("racer %d: got error %v, want nil", i, err)
						return
					}
					if l != nil {
						wins.Add(1)
					}
					leases[i] = l
				})
			}
			wg.Wait()
			if n := wins.Load(); n != 1 {
				t.Fatalf("got %d winners, want 1", n)
			}
			// A loser believes it holds the lease under the token it would
			// have had: what a consumer looks like whose lease was taken.
			leaseOf := func(i int) *lease {
				if leases[i] != nil {
					return leases[i]
				}
				return &lease{key: key, value: fmt.Sprintf("racer-%d#%d", i, i+1), ttl: 5 * time.Second, deadline: time.Now().Add(time.Minute)}
			}

			var read, renewed, released atomic.Int32
			race := func(what string, counter *atomic.Int32, op func(l *lease) (bool, error)) {
				for i := range racers {
					l := leaseOf(i)
					wg.Go(func() {
						ok, err := op(l)
						if err != nil {
							t.Errorf("%s: got error %v, want nil", what, err)
						}
						if ok {
							counter.Add(1)
						}
					})
				}
				wg.Wait()
			}
			race("read", &read, func(l *lease) (bool, error) {
				xs, _, err := readEntries(ctx, rdb, l, stream, DefaultGroup, "c", 10)
				if errors.Is(err, errLeaseLost) {
					err = nil
				}
				return len(xs) > 0, err
			})
			race("renew", &renewed, func(l *lease) (bool, error) { return renewLease(ctx, rdb, s, l) })
			race("release", &released, func(l *lease) (bool, error) { return releaseLease(ctx, rdb, s, l) })
			if n := read.Load(); n != 1 {
				t.Errorf("got %d reads of the entry, want 1 (the winner's)", n)
			}
			if n := renewed.Load(); n != 1 {
				t.Errorf("got %d renewals, want 1 (the winner's)", n)
			}
			if n := released.Load(); n != 1 {
				t.Errorf("got %d releases, want 1 (the winner's)", n)
			}
			if n := rdb.Exists(ctx, key).Val(); n != 0 {
				t.Errorf("lease key after release: got %d keys, want 0", n)
			}
		})
	}
}

// TestBalance checks that partitions spread over consumers: a second
// consumer of a topic ends up with half of them, and the first takes all back
// when the second stops.
func TestBalance(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			dial := srv.dial(t)
			b := newBackend(t, dial)
			rdb := dial(t)
			topic := testenv.Topic(t)
			idle := func(context.Context, []queue.Message) error { return nil }

			// holders counts held leases by consumer name (the owner's
			// prefix before the per-call UUID).
			holders := func() map[string]int {
				out := make(map[string]int)
				for p := range b.opts.Partitions {
					owner, err := rdb.Get(context.Background(), leaseKey(topic, p)).Result()
					if err == nil {
						out[owner[:strings.IndexByte(owner, '-')]]++
					}
				}
				return out
			}
			waitFor := func(what string, cond func(map[string]int) bool) {
				t.Helper()
				testenv.Eventually(t, 10*time.Second, what, func() (bool, string) {
					h := holders()
					return cond(h), fmt.Sprintf("holders %v", h)
				})
			}
			start := func(name string) (stop func()) {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- b.NewConsumer(t, name).Consume(ctx, topic, idle) }()
				stop = sync.OnceFunc(func() {
					cancel()
					if err := <-done; err != nil {
						t.Errorf("Consume %s after cancel: got %v, want nil", name, err)
					}
				})
				t.Cleanup(stop)
				return stop
			}

			all := b.opts.Partitions
			half := all / 2
			start("first")
			waitFor("first to hold every partition", func(h map[string]int) bool { return h["first"] == all })
			stopSecond := start("second")
			waitFor("an even split", func(h map[string]int) bool { return h["first"] == half && h["second"] == half })
			stopSecond()
			waitFor("first to take every partition back", func(h map[string]int) bool { return h["first"] == all })
		})
	}
}
