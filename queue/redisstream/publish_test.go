package redisstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
)

// TestPublishWaitsForReplica: with ReplicaAck 1 a publish returns nil only
// once a replica of each partition's master holds its entries; with the
// replica of one master stopped (SIGSTOP), a publish to that master's
// partitions is queue.ErrUnknown (the master stored it, a failover may lose
// it), while one to the other masters succeeds.
func TestPublishWaitsForReplica(t *testing.T) {
	c := testenv.PrivateCluster(t, 3, 1)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	var mu sync.Mutex
	var acked []int
	// A wait that may take long on a busy machine for the publishes that
	// must succeed; a short one where the replica is stopped.
	observe := func(_ time.Duration, n, _ int) { mu.Lock(); acked = append(acked, n); mu.Unlock() }
	opts := Options{Partitions: 8, ReplicaAck: ReplicaAck{Replicas: 1, Timeout: 10 * time.Second, Observe: observe}}
	q := New(rdb, opts)
	short := opts
	short.ReplicaAck.Timeout = 300 * time.Millisecond
	qStopped := New(rdb, short)
	topic := testenv.Topic(t)
	ctx := t.Context()
	// A new cluster's replicas are linked before their first sync is done.
	testenv.Eventually(t, 10*time.Second, "every replica in sync", func() (bool, string) {
		var synced atomic.Int32 // ForEachMaster runs the masters at once
		err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			if n, err := m.Wait(ctx, 1, 100*time.Millisecond).Result(); err == nil && n == 1 {
				synced.Add(1)
			}
			return nil
		})
		return err == nil && synced.Load() == 3, strconv.Itoa(int(synced.Load())) + " of 3 masters synced"
	})

	msgs := make([]queue.Message, 32)
	for i := range msgs {
		msgs[i] = queue.Message{ID: fmt.Sprint("m", i), Key: fmt.Sprint("k", i), Body: []byte("x")}
	}
	if err := q.Publish(ctx, topic, msgs...); err != nil {
		t.Fatalf("publish with every replica up: %v", err)
	}
	for p := range opts.Partitions {
		want := 0
		for _, m := range msgs {
			if queue.PartitionOf(m.Key, opts.Partitions) == p {
				want++
			}
		}
		if got := onReplica(t, rdb, streamKey(topic, p)); got != int64(want) {
			t.Errorf("partition %d: %d entries on the replica when Publish returned, want %d", p, got, want)
		}
	}

	// A delayed publish (an order's expiry) waits too.
	if err := q.PublishDelayed(ctx, topic, time.Hour, msgs...); err != nil {
		t.Fatalf("delayed publish with every replica up: %v", err)
	}
	for p := range opts.Partitions {
		key := delayedKey(topic, p)
		want, err := rdb.ZCard(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := countOnReplica(t, rdb, key, func(ctx context.Context, c *redis.Conn) *redis.IntCmd { return c.ZCard(ctx, key) }); got != want {
			t.Errorf("partition %d: %d delayed messages on the replica when PublishDelayed returned, want %d", p, got, want)
		}
	}

	// Stop the replica of the master of partition 0.
	master, err := rdb.MasterForKey(ctx, streamKey(topic, 0))
	if err != nil {
		t.Fatal(err)
	}
	resume := c.StopReplicaOf(t, master)
	var stopped, other queue.Message
	for i := 0; stopped.ID == "" || other.ID == ""; i++ {
		m := queue.Message{ID: fmt.Sprint("s", i), Key: fmt.Sprint("s", i), Body: []byte("y")}
		node, err := rdb.MasterForKey(ctx, streamKey(topic, queue.PartitionOf(m.Key, opts.Partitions)))
		if err != nil {
			t.Fatal(err)
		}
		if node.Options().Addr == master.Options().Addr {
			stopped = m
		} else {
			other = m
		}
	}
	if err := q.Publish(ctx, topic, other); err != nil {
		t.Errorf("publish to a master whose replica runs: %v", err)
	}
	if err := qStopped.PublishDelayed(ctx, topic, time.Hour, stopped); !errors.Is(err, queue.ErrUnknown) {
		t.Errorf("delayed publish to a master whose replica is stopped: got %v, want queue.ErrUnknown", err)
	}
	err = qStopped.Publish(ctx, topic, stopped, other)
	if !errors.Is(err, queue.ErrUnknown) {
		t.Fatalf("publish to a master whose replica is stopped: got %v, want queue.ErrUnknown", err)
	}
	stream := streamKey(topic, queue.PartitionOf(stopped.Key, opts.Partitions))
	entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if last := entries[len(entries)-1]; last.Values[fieldID] != stopped.ID {
		t.Errorf("the master's last entry is %v, want the message it was not acknowledged for (%s)", last.Values, stopped.ID)
	}
	resume()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(acked, 0) || !slices.Contains(acked, 1) {
		t.Errorf("observed acks %v, want both 1 and a shortfall (0)", acked)
	}
}

// TestPublishReplicaShortfall: a server without replicas never acknowledges
// ReplicaAck 1: the publish is queue.ErrUnknown, and its message is stored.
func TestPublishReplicaShortfall(t *testing.T) {
	rdb := testenv.Redis(t)
	q := New(rdb, Options{Partitions: 2, ReplicaAck: ReplicaAck{Replicas: 1, Timeout: 20 * time.Millisecond}})
	topic := testenv.Topic(t)
	m := queue.Message{ID: "m", Key: "k", Body: []byte("x")}
	if err := q.Publish(t.Context(), topic, m); !errors.Is(err, queue.ErrUnknown) {
		t.Fatalf("no replica: got %v, want queue.ErrUnknown", err)
	}
	if n, err := rdb.XLen(t.Context(), streamKey(topic, queue.PartitionOf(m.Key, 2))).Result(); err != nil || n != 1 {
		t.Fatalf("stream length: got %d, %v; want the message stored", n, err)
	}
	if err := q.PublishDelayed(t.Context(), topic, time.Hour, m); !errors.Is(err, queue.ErrUnknown) {
		t.Fatalf("delayed, no replica: got %v, want queue.ErrUnknown", err)
	}
	if n, err := rdb.ZCard(t.Context(), delayedKey(topic, queue.PartitionOf(m.Key, 2))).Result(); err != nil || n != 1 {
		t.Fatalf("delayed set: got %d, %v; want the message stored", n, err)
	}
}

// onReplica counts the entries of stream on the replica of its master.
func onReplica(t *testing.T, rdb *redis.ClusterClient, stream string) int64 {
	return countOnReplica(t, rdb, stream, func(ctx context.Context, c *redis.Conn) *redis.IntCmd { return c.XLen(ctx, stream) })
}

// countOnReplica runs count on the replica of key's master.
func countOnReplica(t *testing.T, rdb *redis.ClusterClient, key string, count func(context.Context, *redis.Conn) *redis.IntCmd) int64 {
	t.Helper()
	ctx := t.Context()
	master, err := rdb.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: testenv.ReplicaAddr(t, master)})
	defer c.Close()
	conn := c.Conn()
	defer conn.Close()
	if err := conn.ReadOnly(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := count(ctx, conn).Result()
	if err != nil {
		t.Fatal(err)
	}
	return got
}
