package redisstream

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
)

// events records the lease events a Queue reports, by event.
type events struct {
	mu     sync.Mutex
	counts map[string]int
	log    []string // "<event> <partition>", in order
}

func (e *events) PartitionEvent(_ string, p int, event string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counts == nil {
		e.counts = map[string]int{}
	}
	e.counts[event]++
	e.log = append(e.log, event+" "+string(rune('0'+p)))
}

func (e *events) count(event string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.counts[event]
}

// owners counts the held leases of topic by consumer name (the owner's
// prefix before the per-call UUID).
func owners(t *testing.T, rdb redis.UniversalClient, topic string, partitions int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for p := range partitions {
		owner, err := rdb.Get(context.Background(), leaseKey(topic, p)).Result()
		if err == nil {
			out[owner[:strings.IndexByte(owner, '-')]]++
		}
	}
	return out
}

// TestHandoverOnStop: with a lease TTL of five minutes, a consumer that
// joins gets its share and a consumer that stops hands its partitions to
// the other at once, long before any TTL-bound step (a lease expiring,
// the next heartbeat at TTL/3, the next lease attempt at TTL/4) could; and
// every lease taken, given up for balance and released at the stop is
// reported, none lost.
func TestHandoverOnStop(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			dial := srv.dial(t)
			rdb := dial(t)
			topic := testenv.Topic(t)
			opts := testOptions(t)
			opts.LeaseTTL = 5 * time.Minute
			t.Cleanup(func() {
				(&topicLog{topics: map[string]bool{topic: true}}).deleteKeys(t, rdb, opts.Partitions)
			})
			idle := func(context.Context, []queue.Message) error { return nil }
			// Each consumer has a Queue of its own, as a process would.
			start := func(name string, obs *events) (stop func()) {
				o := opts
				o.Observer = obs
				q := New(dial(t), o)
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- q.Consumer(name).Consume(ctx, topic, idle) }()
				stop = sync.OnceFunc(func() {
					cancel()
					if err := <-done; err != nil {
						t.Errorf("Consume %s after cancel: got %v, want nil", name, err)
					}
				})
				t.Cleanup(stop)
				return stop
			}
			waitFor := func(what string, cond func(map[string]int) bool) {
				t.Helper()
				// Generous for a loaded machine, and still far below the
				// TTL-bound steps (75 s, 100 s, 5 min).
				testenv.Eventually(t, 30*time.Second, what, func() (bool, string) {
					h := owners(t, rdb, topic, opts.Partitions)
					return cond(h), fmt.Sprintf("holders %v", h)
				})
			}

			all, half := opts.Partitions, opts.Partitions/2
			var first, second events
			stopFirst := start("first", &first)
			waitFor("first to hold every partition", func(h map[string]int) bool { return h["first"] == all })
			start("second", &second)
			waitFor("an even split once second joined", func(h map[string]int) bool { return h["first"] == half && h["second"] == half })
			stopFirst()
			waitFor("second to take every partition from the stopped first", func(h map[string]int) bool { return h["second"] == all })
			// A lease is in Redis a moment before its event is observed.
			testenv.Eventually(t, 5*time.Second, "second's acquisitions observed", func() (bool, string) {
				return second.count(queue.PartitionAcquired) == all, fmt.Sprint(second.count(queue.PartitionAcquired))
			})

			tests := []struct {
				name string
				got  int
				want int
			}{
				{"first acquired", first.count(queue.PartitionAcquired), all},
				{"first released (shed, then stopped)", first.count(queue.PartitionReleased), all},
				{"first lost", first.count(queue.PartitionLost), 0},
				{"second acquired", second.count(queue.PartitionAcquired), all},
				{"second lost", second.count(queue.PartitionLost), 0},
			}
			for _, tc := range tests {
				if tc.got != tc.want {
					t.Errorf("%s: got %d events, want %d (first %v, second %v)", tc.name, tc.got, tc.want, first.log, second.log)
				}
			}
		})
	}
}

// TestBacklog reads a partition's lag, pending entries and the age of its
// oldest entry, on a partition never consumed (no group yet) and on one
// with entries handed out and not acknowledged.
func TestBacklog(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			rdb := srv.dial(t)(t)
			opts := testOptions(t)
			opts.Partitions = 2
			q := New(rdb, opts)
			topic := testenv.Topic(t)
			t.Cleanup(func() {
				(&topicLog{topics: map[string]bool{topic: true}}).deleteKeys(t, rdb, opts.Partitions)
			})
			ctx := context.Background()
			// Partition 0: an entry added at Unix time 1 s, then four more.
			// No consumer group exists yet.
			s0, s1 := streamKey(topic, 0), streamKey(topic, 1)
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s0, ID: "1000-0", Values: []any{fieldID, "old"}}).Err(); err != nil {
				t.Fatalf("XADD %s: %v", s0, err)
			}
			for range 4 {
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s0, Values: []any{fieldID, "m"}}).Err(); err != nil {
					t.Fatalf("XADD %s: %v", s0, err)
				}
			}
			// Partition 1: three entries, two of them handed to a consumer.
			for range 3 {
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s1, Values: []any{fieldID, "m"}}).Err(); err != nil {
					t.Fatalf("XADD %s: %v", s1, err)
				}
			}
			if err := rdb.XGroupCreate(ctx, s1, q.opts.Group, "0").Err(); err != nil {
				t.Fatalf("create group: %v", err)
			}
			if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.opts.Group, Consumer: "c", Streams: []string{s1, ">"}, Count: 2}).Err(); err != nil {
				t.Fatalf("XREADGROUP: %v", err)
			}

			got, err := q.Backlog(ctx, topic)
			if err != nil {
				t.Fatalf("Backlog: %v", err)
			}
			if len(got) != 2 {
				t.Fatalf("got %d partitions, want 2", len(got))
			}
			if b := got[0]; b.Partition != 0 || b.Lag != 5 || b.Pending != 0 || b.OldestAge < 50*365*24*time.Hour {
				t.Errorf("partition 0: got %+v, want lag 5, pending 0, oldest over 50 years old (added at Unix 1 s)", b)
			}
			if b := got[1]; b.Partition != 1 || b.Lag != 1 || b.Pending != 2 || b.OldestAge < 0 || b.OldestAge > time.Hour {
				t.Errorf("partition 1: got %+v, want lag 1, pending 2, oldest just added", b)
			}
		})
	}
}
