package redisstream

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

			tests := []struct {
				name   string
				holder string // current owner of the key; "" for no key
				run    func(l *lease) (bool, error)
				want   bool
				// wantOwner is the key's value afterwards; "" for no key.
				wantOwner string
			}{
				{"renew own lease", "me", func(l *lease) (bool, error) { return renewLease(ctx, rdb, s, l) }, true, "me"},
				{"renew taken lease", "other", func(l *lease) (bool, error) { return renewLease(ctx, rdb, s, l) }, false, "other"},
				{"renew expired lease", "", func(l *lease) (bool, error) { return renewLease(ctx, rdb, s, l) }, false, ""},
				{"release own lease", "me", func(l *lease) (bool, error) { return releaseLease(ctx, rdb, s, l) }, true, ""},
				{"release taken lease", "other", func(l *lease) (bool, error) { return releaseLease(ctx, rdb, s, l) }, false, "other"},
				{"release expired lease", "", func(l *lease) (bool, error) { return releaseLease(ctx, rdb, s, l) }, false, ""},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					key := leaseKey(testenv.UniqueName("lease_"), 0)
					t.Cleanup(func() { rdb.Del(context.Background(), key) })
					if tc.holder != "" {
						if err := rdb.Set(ctx, key, tc.holder, ttl).Err(); err != nil {
							t.Fatalf("SET %s: %v", key, err)
						}
					}
					l := &lease{key: key, owner: "me", ttl: ttl, deadline: time.Now().Add(time.Second)}
					got, err := tc.run(l)
					if err != nil {
						t.Fatalf("got error %v, want nil", err)
					}
					if got != tc.want {
						t.Errorf("got %v, want %v", got, tc.want)
					}
					owner, _ := rdb.Get(ctx, key).Result()
					if owner != tc.wantOwner {
						t.Errorf("key afterwards: got %q, want %q", owner, tc.wantOwner)
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
// only the winner can renew and release it.
func TestLeaseRace(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			rdb := srv.dial(t)(t)
			s := newLeaseScripts()
			ctx := context.Background()
			key := leaseKey(testenv.UniqueName("race_"), 0)
			t.Cleanup(func() { rdb.Del(context.Background(), key) })

			const racers = 50
			var wins atomic.Int32
			leases := make([]*lease, racers)
			var wg sync.WaitGroup
			for i := range racers {
				wg.Go(func() {
					l, err := acquireLease(ctx, rdb, key, fmt.Sprintf("racer-%d", i), 5*time.Second)
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

			var renewed, released atomic.Int32
			for i := range racers {
				l := leases[i]
				if l == nil {
					l = &lease{key: key, owner: fmt.Sprintf("racer-%d", i), ttl: 5 * time.Second}
				}
				wg.Go(func() {
					if ok, err := renewLease(ctx, rdb, s, l); err != nil || ok {
						if err != nil {
							t.Errorf("renew: got error %v, want nil", err)
						}
						renewed.Add(1)
					}
				})
			}
			wg.Wait()
			for i := range racers {
				l := leases[i]
				if l == nil {
					l = &lease{key: key, owner: fmt.Sprintf("racer-%d", i), ttl: 5 * time.Second}
				}
				wg.Go(func() {
					if ok, err := releaseLease(ctx, rdb, s, l); err != nil || ok {
						if err != nil {
							t.Errorf("release: got error %v, want nil", err)
						}
						released.Add(1)
					}
				})
			}
			wg.Wait()
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
				deadline := time.Now().Add(10 * time.Second)
				for {
					h := holders()
					if cond(h) {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("timed out waiting for %s: got holders %v", what, h)
					}
					time.Sleep(20 * time.Millisecond)
				}
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
