package redisstream

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestPartitionsSpreadOverMasters: with the default topics and partition
// count, every master of the test cluster (3 masters, slots split evenly as
// redis-cli --cluster create does) holds some partitions of each topic, so
// every shard carries queue traffic and adding shards adds throughput. A
// partition's keys share its tag, so its scripts stay on one master.
func TestPartitionsSpreadOverMasters(t *testing.T) {
	rdb := testenv.RedisCluster(t)
	ctx := t.Context()
	var masters atomic.Int64
	if err := rdb.ForEachMaster(ctx, func(context.Context, *redis.Client) error { masters.Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	q := config.Default().Queue
	for _, topic := range []string{q.Topic, q.ExpiryTopic} {
		on := map[string]int{}
		for p := range q.Partitions {
			m, err := rdb.MasterForKey(ctx, streamKey(topic, p))
			if err != nil {
				t.Fatal(err)
			}
			addr := m.Options().Addr
			on[addr]++
			for _, k := range []string{leaseKey(topic, p), fenceKey(topic, p), delayedKey(topic, p), delaySeqKey(topic, p)} {
				if km, err := rdb.MasterForKey(ctx, k); err != nil || km.Options().Addr != addr {
					t.Errorf("%s is not on its stream's master %s", k, addr)
				}
			}
		}
		t.Logf("%s: %d partitions per master %v", topic, q.Partitions, on)
		if int64(len(on)) != masters.Load() {
			t.Errorf("%s: %d partitions on %d of %d masters: %v", topic, q.Partitions, len(on), masters.Load(), on)
		}
	}
}
