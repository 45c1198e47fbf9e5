package testenv

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestNameDeletesClusterKeys: a Name's keys on the shared cluster, in
// slots of every master, are gone when its test ends.
func TestNameDeletesClusterKeys(t *testing.T) {
	rdb := RedisCluster(t)
	var keys []string
	t.Run("writer", func(t *testing.T) {
		name := Name(t, "tc-")
		for i := range 30 {
			k := "fs:{" + name + "-" + strconv.Itoa(i) + "}:stock"
			if err := rdb.Set(t.Context(), k, "1", 0).Err(); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		}
	})
	masters := map[string]bool{}
	for _, k := range keys {
		c, err := rdb.MasterForKey(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		masters[c.Options().Addr] = true
		if n := rdb.Exists(t.Context(), k).Val(); n != 0 {
			t.Errorf("%s is still there", k)
		}
	}
	if len(masters) < 2 {
		t.Errorf("30 keys landed on %d masters: the check proves little", len(masters))
	}
}

// TestPrivateClusterFailover: a master killed with SIGKILL is replaced by
// its replica and the cluster serves every slot again, which the fault
// tests rely on.
func TestPrivateClusterFailover(t *testing.T) {
	c := PrivateCluster(t, 3, 1)
	// go-redis re-reads the slot map on MOVED but not when a master stops
	// answering: only its periodic reload (60 s by default) finds the
	// promoted replica.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClusterStateReloadInterval: time.Second})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// WAIT on the master's own connection: the value reached the replica
	// before the master dies, so the failover cannot lose it.
	master, err := rdb.MasterForKey(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := master.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d, %v", n, err)
	}
	port, _ := strconv.Atoi(master.Options().Addr[len("127.0.0.1:"):])
	if err := c.Kill(port); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 50*time.Second, "the replica to take over", func() (bool, string) {
		v, err := rdb.Get(ctx, "k").Result()
		return err == nil && v == "v", "GET k: " + v + " " + errString(err)
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
