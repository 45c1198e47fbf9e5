package redisstream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
)

// delayTopic returns a topic of the test's own on a Queue with testOptions,
// whose keys are deleted at cleanup.
func delayTopic(t *testing.T, rdb redis.UniversalClient) (*Queue, string) {
	t.Helper()
	q := New(rdb, testOptions(t))
	topic := testenv.Topic(t)
	t.Cleanup(func() {
		_ = q.Close()
		(&topicLog{topics: map[string]bool{topic: true}}).deleteKeys(t, rdb, q.opts.Partitions)
	})
	return q, topic
}

// mustPublishDelayed publishes msgs with delay or fails the test.
func mustPublishDelayed(t *testing.T, q *Queue, topic string, delay time.Duration, msgs ...queue.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := q.PublishDelayed(ctx, topic, delay, msgs...); err != nil {
		t.Fatalf("PublishDelayed %v: got %v, want nil", delay, err)
	}
}

// streamMessages returns partition p's stream entries as messages, in order.
func streamMessages(t *testing.T, rdb redis.UniversalClient, topic string, p int) []queue.Message {
	t.Helper()
	xs, err := rdb.XRange(context.Background(), streamKey(topic, p), "-", "+").Result()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", streamKey(topic, p), err)
	}
	return toBatch(xs, nil, 1).msgs
}

// TestMoveScript has one case per reply of delay_move.lua, and checks what
// delay_add.lua stores: due messages land in their key's stream as Publish
// writes them, in due order (publish order within one due time, identical
// messages included), and what is not due stays.
func TestMoveScript(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			rdb := srv.dial(t)(t)
			ctx := context.Background()

			t.Run("nothing due", func(t *testing.T) {
				q, topic := delayTopic(t, rdb)
				m := queue.Message{ID: "m", Key: "k", Body: []byte("b")}
				mustPublishDelayed(t, q, topic, time.Hour, m)
				p := queue.PartitionOf(m.Key, q.opts.Partitions)
				if n, err := moveDue(ctx, rdb, q.delays, topic, p, moveLimit); err != nil || n != 0 {
					t.Errorf("move: got %d, %v, want 0, nil", n, err)
				}
				if n := rdb.ZCard(ctx, delayedKey(topic, p)).Val(); n != 1 {
					t.Errorf("delayed set: got %d members, want 1", n)
				}
				if n := rdb.XLen(ctx, streamKey(topic, p)).Val(); n != 0 {
					t.Errorf("stream: got %d entries, want 0", n)
				}
			})

			t.Run("due", func(t *testing.T) {
				q, topic := delayTopic(t, rdb)
				a, b := "campaign-a", "campaign-c"
				pa, pb := queue.PartitionOf(a, q.opts.Partitions), queue.PartitionOf(b, q.opts.Partitions)
				if pa == pb {
					t.Fatalf("keys %s and %s share partition %d; pick keys of different partitions", a, b, pa)
				}
				msg := func(id, key string, body []byte) queue.Message { return queue.Message{ID: id, Key: key, Body: body} }
				a1, a2 := msg("a1", a, []byte{0, ':', 255, '1'}), msg("a2", a, []byte("a2"))
				a3, b1 := msg("a3:x", a, nil), msg("b1", b, []byte("b1"))
				mustPublishDelayed(t, q, topic, 30*time.Millisecond, a3)
				mustPublishDelayed(t, q, topic, 10*time.Millisecond, a1, b1, a2, a2) // a2 twice: both kept
				mustPublishDelayed(t, q, topic, time.Hour, msg("later", a, nil))
				time.Sleep(50 * time.Millisecond) // all but "later" fall due

				for _, tc := range []struct {
					p    int
					want []queue.Message
				}{{pa, []queue.Message{a1, a2, a2, a3}}, {pb, []queue.Message{b1}}} {
					n, err := moveDue(ctx, rdb, q.delays, topic, tc.p, moveLimit)
					if err != nil || n != len(tc.want) {
						t.Errorf("move partition %d: got %d, %v, want %d, nil", tc.p, n, err, len(tc.want))
					}
					got := streamMessages(t, rdb, topic, tc.p)
					if len(got) != len(tc.want) {
						t.Fatalf("stream of partition %d: got %d entries, want %d", tc.p, len(got), len(tc.want))
					}
					for i, w := range tc.want {
						g := got[i]
						if g.ID != w.ID || g.Key != w.Key || string(g.Body) != string(w.Body) {
							t.Errorf("partition %d entry %d: got %q key %q body %q, want %q key %q body %q", tc.p, i, g.ID, g.Key, g.Body, w.ID, w.Key, w.Body)
						}
					}
				}
				if n := rdb.ZCard(ctx, delayedKey(topic, pa)).Val(); n != 1 {
					t.Errorf("delayed set of partition %d: got %d members, want 1 (not due)", pa, n)
				}
				if n := rdb.Exists(ctx, delayedKey(topic, pb)).Val(); n != 0 {
					t.Errorf("delayed set of partition %d after moving all: got %d keys, want 0", pb, n)
				}
			})

			t.Run("limit", func(t *testing.T) {
				q, topic := delayTopic(t, rdb)
				var msgs []queue.Message
				for i := range 5 {
					msgs = append(msgs, queue.Message{ID: fmt.Sprintf("m%d", i), Key: "k"})
				}
				mustPublishDelayed(t, q, topic, time.Millisecond, msgs...)
				time.Sleep(10 * time.Millisecond)
				p := queue.PartitionOf("k", q.opts.Partitions)
				var got []int
				for range 4 {
					n, err := moveDue(ctx, rdb, q.delays, topic, p, 2)
					if err != nil {
						t.Fatalf("move: got %v, want nil", err)
					}
					got = append(got, n)
				}
				if fmt.Sprint(got) != "[2 2 1 0]" {
					t.Errorf("moves of at most 2 out of 5: got %v, want [2 2 1 0]", got)
				}
				for i, m := range streamMessages(t, rdb, topic, p) {
					if m.ID != msgs[i].ID {
						t.Errorf("entry %d: got %s, want %s", i, m.ID, msgs[i].ID)
					}
				}
			})
		})
	}
}

// TestMoveRace runs many movers on every partition while publishers add
// delayed messages: each message lands exactly once, in its key's stream,
// and nothing is left behind.
func TestMoveRace(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			rdb := srv.dial(t)(t)
			q, topic := delayTopic(t, rdb)
			ctx := context.Background()
			const publishers, perPublisher, movers = 4, 100, 8

			published := make(chan struct{})
			var pub errgroup.Group
			for i := range publishers {
				pub.Go(func() error {
					for j := 0; j < perPublisher; {
						n := min(perPublisher-j, 1+rand.N(3))
						var msgs []queue.Message
						for k := range n {
							msgs = append(msgs, queue.Message{ID: fmt.Sprintf("p%d-%03d", i, j+k), Key: fmt.Sprintf("k%d", rand.N(10))})
						}
						delay := time.Duration(1+rand.N(50)) * time.Millisecond
						if err := q.PublishDelayed(ctx, topic, delay, msgs...); err != nil {
							return err
						}
						j += n
					}
					return nil
				})
			}
			go func() {
				if err := pub.Wait(); err != nil {
					t.Errorf("PublishDelayed: got %v, want nil", err)
				}
				close(published)
			}()

			var mu sync.Mutex
			moved := 0
			var mov errgroup.Group
			for range movers {
				mov.Go(func() error {
					for {
						// Read before counting what is left: once publishing
						// is over, nothing is added behind the count.
						var over bool
						select {
						case <-published:
							over = true
						default:
						}
						left := int64(0)
						for p := range q.opts.Partitions {
							n, err := moveDue(ctx, rdb, q.delays, topic, p, 8)
							if err != nil {
								return err
							}
							mu.Lock()
							moved += n
							mu.Unlock()
							left += rdb.ZCard(ctx, delayedKey(topic, p)).Val()
						}
						if over && left == 0 {
							return nil
						}
					}
				})
			}
			if err := mov.Wait(); err != nil {
				t.Fatalf("move: got %v, want nil", err)
			}
			<-published

			if moved != publishers*perPublisher {
				t.Errorf("moves: got %d messages, want %d", moved, publishers*perPublisher)
			}
			seen := make(map[string]int)
			for p := range q.opts.Partitions {
				for _, m := range streamMessages(t, rdb, topic, p) {
					seen[m.ID]++
					if want := queue.PartitionOf(m.Key, q.opts.Partitions); p != want {
						t.Errorf("message %s of key %s: got it in partition %d, want %d", m.ID, m.Key, p, want)
					}
				}
			}
			for i := range publishers {
				for j := range perPublisher {
					if id := fmt.Sprintf("p%d-%03d", i, j); seen[id] != 1 {
						t.Errorf("message %s: got %d stream entries, want 1", id, seen[id])
					}
				}
			}
		})
	}
}

// TestDelaySurvivesRestart publishes delayed messages from a Queue whose
// client is closed before they are due: a consumer on a new client, started
// after they fell due, gets them as first attempts. Nothing of them is kept
// in a process.
func TestDelaySurvivesRestart(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			dial := srv.dial(t)
			const delay = 300 * time.Millisecond
			old := dial(t)
			q, topic := delayTopic(t, dial(t))
			gone := New(old, testOptions(t))
			msgs := []queue.Message{{ID: "m1", Key: "a", Body: []byte("1")}, {ID: "m2", Key: "b", Body: []byte("2")}}
			sent := time.Now()
			mustPublishDelayed(t, gone, topic, delay, msgs...)
			_ = gone.Close()
			_ = old.Close()
			time.Sleep(time.Until(sent.Add(delay)))

			got := consumeUntil(t, q.Consumer("new"), topic, len(msgs))
			if len(got) != len(msgs) {
				t.Errorf("got %d deliveries, want %d", len(got), len(msgs))
			}
			seen := make(map[string]bool)
			for _, m := range got {
				seen[m.ID] = true
				if m.Attempt != 1 {
					t.Errorf("message %s: got attempt %d, want 1", m.ID, m.Attempt)
				}
			}
			for _, m := range msgs {
				if !seen[m.ID] {
					t.Errorf("message %s: got no delivery, want one", m.ID)
				}
			}
		})
	}
}
