package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// liveRedis is a Redis the results feeds must work on: one server, where
// sharded pub/sub is one more channel namespace, and a cluster, where it
// routes by slot.
var liveRedis = []struct {
	name   string
	client func(t *testing.T) redis.UniversalClient
}{
	{"redis", func(t *testing.T) redis.UniversalClient { return testenv.Redis(t) }},
	{"cluster", func(t *testing.T) redis.UniversalClient { return testenv.RedisCluster(t) }},
}

// sale is campaigns loaded on a real Redis, with the worker's operations.
type sale struct {
	rdb redis.UniversalClient
	st  *store.Store
}

// load creates a running campaign of the test's own and returns its id.
func (s sale) load(t *testing.T) string {
	t.Helper()
	id := testenv.Name(t, "nf_")
	now := time.Now()
	c := model.Campaign{ID: id, Name: "feeds test", Stock: 1000, PerUserLimit: 1000,
		StartAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}
	if _, err := s.st.Rebuild(mustContext(t), c, nil, nil); err != nil {
		t.Fatalf("load: %v", err)
	}
	return id
}

// queue admits a request of user on campaign and returns its id.
func (s sale) queue(t *testing.T, campaign, user string) string {
	t.Helper()
	id := newRequestID(t, campaign)
	got, err := s.st.Admit(mustContext(t), campaign, []model.AdmitRequest{{RequestID: id, CampaignID: campaign, UserID: user, Quantity: 1}}, model.RateLimits{})
	if err != nil || got[0].Code != model.Admitted {
		t.Fatalf("admit %s: got %+v, %v; want admitted", id, got, err)
	}
	return id
}

// decide stores the final result of a queued request without publishing it.
func (s sale) decide(ctx context.Context, requestID, user string) (model.Result, error) {
	campaign, _ := model.CampaignOfRequest(requestID)
	reply, err := s.st.Deduct(ctx, campaign, []model.Deduction{{RequestID: requestID, UserID: user, Quantity: 1, OrderID: "o-" + requestID[len(requestID)-8:]}})
	if err == nil && reply.Made > 0 {
		// As the worker does once the order is stored.
		err = s.st.MarkDurable(ctx, campaign, reply.Made, reply.Epoch)
	}
	if err != nil {
		return model.Result{}, err
	}
	return reply.Results[0], nil
}

// shardChannels returns the sharded channels of campaign that have a
// subscriber, asked of the server that holds the campaign's slot.
func shardChannels(t *testing.T, rdb redis.UniversalClient, campaign string) []string {
	t.Helper()
	var node redis.UniversalClient = rdb
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(mustContext(t), "{"+campaign+"}")
		if err != nil {
			t.Fatalf("master of %s: %v", campaign, err)
		}
		node = m
	}
	chans, err := node.PubSubShardChannels(mustContext(t), "*{"+campaign+"}*").Result()
	if err != nil {
		t.Fatalf("PUBSUB SHARDCHANNELS: %v", err)
	}
	return chans
}

// campaignsOnEveryMaster loads campaigns until one sits on each master of
// a cluster (three on a single server) and returns them.
func (s sale) campaignsOnEveryMaster(t *testing.T) []string {
	t.Helper()
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return []string{s.load(t), s.load(t), s.load(t)}
	}
	var masters atomic.Int64
	if err := cc.ForEachMaster(mustContext(t), func(context.Context, *redis.Client) error { masters.Add(1); return nil }); err != nil {
		t.Fatalf("masters: %v", err)
	}
	byMaster := map[string]string{}
	for i := 0; len(byMaster) < int(masters.Load()); i++ {
		if i == 100 {
			t.Fatalf("100 campaigns on %d masters, want %d", len(byMaster), masters.Load())
		}
		id := testenv.Name(t, "nf_")
		m, err := cc.MasterForKey(mustContext(t), "{"+id+"}")
		if err != nil {
			t.Fatalf("master of %s: %v", id, err)
		}
		if _, ok := byMaster[m.Options().Addr]; !ok {
			byMaster[m.Options().Addr] = id
		}
	}
	var ids []string
	now := time.Now()
	for _, id := range byMaster {
		c := model.Campaign{ID: id, Name: "feeds test", Stock: 1000, PerUserLimit: 1000,
			StartAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}
		if _, err := s.st.Rebuild(mustContext(t), c, nil, nil); err != nil {
			t.Fatalf("load: %v", err)
		}
		ids = append(ids, id)
	}
	return ids
}

// readResult reads frames until a result frame, failing after d.
func readResult(t *testing.T, ws *websocket.Conn, d time.Duration) wsResult {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(d))
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("no result frame within %v: %v", d, err)
		}
		var f wsFrame
		if err := json.Unmarshal(data, &f); err != nil {
			t.Fatalf("frame %q is not JSON: %v", data, err)
		}
		if f.Type != "result" {
			continue
		}
		var r wsResult
		if err := json.Unmarshal(f.Result, &r); err != nil {
			t.Fatalf("result %s: %v", f.Result, err)
		}
		return r
	}
}

// TestFeedsFollowWaiters: results of campaigns on every master reach the
// notifier's waiters; the notifier subscribes to the channels of the
// campaigns its shoppers wait on and to no other, and lets each go once its
// last waiter has left. The periodic re-check is off: only publications
// deliver.
func TestFeedsFollowWaiters(t *testing.T) {
	for _, r := range liveRedis {
		t.Run(r.name, func(t *testing.T) {
			s := sale{rdb: r.client(t)}
			s.st = store.New(s.rdb)
			campaigns := s.campaignsOnEveryMaster(t)
			other := s.load(t) // decided here, waited on nowhere
			h := newHarness(t, s.st, Options{RecheckInterval: time.Hour, feedLinger: 300 * time.Millisecond})
			ws := mustDial(t, h, "alice")
			var ids []string
			for _, c := range campaigns {
				ids = append(ids, s.queue(t, c, "alice"))
			}
			if got, _ := mustSubscribe(t, ws, ids...); len(got) != len(ids) {
				t.Fatalf("subscribed %v, want %v", got, ids)
			}
			for _, c := range campaigns {
				if got := shardChannels(t, s.rdb, c); len(got) != 1 {
					t.Errorf("campaign %s has subscribed channels %v, want one", c, got)
				}
			}
			if got := gaugeValue(h.m.ResultsChannels); got != float64(len(campaigns)) {
				t.Errorf("flashsale_results_channels: got %v, want %d", got, len(campaigns))
			}

			var batch []model.Result
			for _, id := range append(ids, s.queue(t, other, "bob")) {
				campaign, _ := model.CampaignOfRequest(id)
				user := "alice"
				if campaign == other {
					user = "bob"
				}
				r, err := s.decide(mustContext(t), id, user)
				if err != nil {
					t.Fatalf("decide: %v", err)
				}
				batch = append(batch, r)
			}
			if got := shardChannels(t, s.rdb, other); len(got) != 0 {
				t.Errorf("a campaign nobody waits on has subscribed channels %v, want none", got)
			}
			if err := s.st.PublishResults(mustContext(t), batch); err != nil {
				t.Fatalf("publish: %v", err)
			}
			got := map[string]wsResult{}
			for range ids {
				r := readResult(t, ws, 5*time.Second)
				got[r.RequestID] = r
			}
			for _, want := range batch[:len(ids)] {
				checkResult(t, got[want.RequestID], want)
			}

			testenv.Eventually(t, 10*time.Second, "the feeds to end after their last waiter", func() (bool, string) {
				n := h.n.feeds.count()
				return n == 0, strconv.Itoa(n) + " feeds"
			})
			if got := gaugeValue(h.m.ResultsChannels); got != 0 {
				t.Errorf("flashsale_results_channels after the waiters left: got %v, want 0", got)
			}
			// A feed ends first in the notifier, then its subscription's
			// connection goes: Redis learns of it a moment later.
			for _, c := range campaigns {
				testenv.Eventually(t, 10*time.Second, "campaign "+c+"'s channels gone after its waiters left", func() (bool, string) {
					got := shardChannels(t, s.rdb, c)
					return len(got) == 0, fmt.Sprint(got)
				})
			}
		})
	}
}

// TestFeedsPerBucket: a shopper waiting on a request of one bucket of a
// campaign of several makes the notifier subscribe to that bucket's
// channel, on the shard that decides the bucket, and to no other of the
// campaign's; the result is pushed from there.
func TestFeedsPerBucket(t *testing.T) {
	for _, r := range liveRedis {
		t.Run(r.name, func(t *testing.T) {
			s := sale{rdb: r.client(t)}
			s.st = store.New(s.rdb)
			const n = 4
			id := testenv.Name(t, "nf_")
			now := time.Now()
			c := model.Campaign{ID: id, Name: "feeds test", Stock: 1000, PerUserLimit: 1000, Buckets: n,
				StartAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}
			if _, err := s.st.Rebuild(mustContext(t), c, nil, nil); err != nil {
				t.Fatalf("load: %v", err)
			}
			h := newHarness(t, s.st, Options{RecheckInterval: time.Hour})
			// Two shoppers of different buckets.
			users := map[int]string{}
			for i := 0; len(users) < 2; i++ {
				u := fmt.Sprint("u", i)
				if b := model.BucketOf(u, n); users[b] == "" && (len(users) == 0 || b != 0) {
					users[b] = u
				}
			}
			type wait struct {
				tag, user, id string
				ws            *websocket.Conn
			}
			var waits []wait
			for b, u := range users {
				tag := model.BucketTag(id, b, n)
				w := wait{tag: tag, user: u, id: s.queue(t, tag, u), ws: mustDial(t, h, u)}
				if got, _ := mustSubscribe(t, w.ws, w.id); len(got) != 1 {
					t.Fatalf("subscribed %v, want %s", got, w.id)
				}
				waits = append(waits, w)
			}
			for b := range n {
				tag := model.BucketTag(id, b, n)
				want := 0
				if users[b] != "" {
					want = 1
				}
				if got := shardChannels(t, s.rdb, tag); len(got) != want {
					t.Errorf("bucket %d has subscribed channels %v, want %d", b, got, want)
				}
			}
			if got := shardChannels(t, s.rdb, id); len(got) != 0 {
				t.Errorf("the campaign's own channel is subscribed: %v", got)
			}
			if got := h.n.feeds.count(); got != 2 {
				t.Errorf("feeds: got %d, want one per bucket waited on (2)", got)
			}
			for _, w := range waits {
				reply, err := s.st.Deduct(mustContext(t), w.tag, []model.Deduction{{RequestID: w.id, UserID: w.user, Quantity: 1, OrderID: "o-" + w.user}})
				if err != nil {
					t.Fatalf("decide: %v", err)
				}
				if err := s.st.PublishResults(mustContext(t), reply.Results); err != nil {
					t.Fatalf("publish: %v", err)
				}
				checkResult(t, readResult(t, w.ws, 5*time.Second), reply.Results[0])
			}
		})
	}
}

// readHook is a store whose Results calls after once, right after its
// first read: the stored state changes just after the notifier read it.
type readHook struct {
	*store.Store
	once  sync.Once
	after func()
}

func (r *readHook) Results(ctx context.Context, ids []string) ([]model.Result, error) {
	out, err := r.Store.Results(ctx, ids)
	r.once.Do(r.after)
	return out, err
}

// TestFeedsSubscribeBeforeRead: a result decided and published right after
// a new waiter's stored read still reaches it, with the periodic re-check
// off: the campaign's channel was subscribed before the read.
func TestFeedsSubscribeBeforeRead(t *testing.T) {
	for _, r := range liveRedis {
		t.Run(r.name, func(t *testing.T) {
			s := sale{rdb: r.client(t)}
			s.st = store.New(s.rdb)
			campaign := s.load(t)
			id := s.queue(t, campaign, "alice")
			src := &readHook{Store: s.st}
			var want model.Result
			src.after = func() {
				r, err := s.decide(context.Background(), id, "alice")
				if err == nil {
					err = s.st.PublishResults(context.Background(), []model.Result{r})
				}
				if err != nil {
					t.Errorf("decide and publish: %v", err)
				}
				want = r
			}
			h := newHarness(t, src, Options{RecheckInterval: time.Hour})
			ws := mustDial(t, h, "alice")
			if got, _ := mustSubscribe(t, ws, id); len(got) != 1 {
				t.Fatalf("subscribed %v, want [%s]", got, id)
			}
			checkResult(t, readResult(t, ws, 5*time.Second), want)
		})
	}
}

// TestFeedsFailover: after the master of a campaign's slot is killed and
// its replica took over, waiters still get their results: the one who
// waited through the failover and one who arrives after it. The periodic
// re-check is off.
func TestFeedsFailover(t *testing.T) {
	c := testenv.PrivateCluster(t, 3, 1)
	// go-redis finds a promoted replica only on its periodic slot map
	// reload (internal/testenv/cluster_test.go).
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClusterStateReloadInterval: 500 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	s := sale{rdb: rdb, st: store.New(rdb)}
	campaign := s.load(t)
	h := newHarness(t, s.st, Options{RecheckInterval: time.Hour})
	before := s.queue(t, campaign, "alice")
	ws := mustDial(t, h, "alice")
	if got, _ := mustSubscribe(t, ws, before); len(got) != 1 {
		t.Fatalf("subscribed %v, want [%s]", got, before)
	}

	master, err := rdb.MasterForKey(mustContext(t), "{"+campaign+"}")
	if err != nil {
		t.Fatal(err)
	}
	// The admission must survive the failover for the decision to find it.
	if n, err := master.Wait(mustContext(t), 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d, %v", n, err)
	}
	port, _ := strconv.Atoi(master.Options().Addr[len("127.0.0.1:"):])
	if err := c.Kill(port); err != nil {
		t.Fatal(err)
	}
	var want model.Result
	testenv.Eventually(t, 60*time.Second, "the replica to take over and decide", func() (bool, string) {
		want, err = s.decide(mustContext(t), before, "alice")
		return err == nil, errString(err)
	})
	testenv.Eventually(t, 30*time.Second, "the result published", func() (bool, string) {
		err := s.st.PublishResults(mustContext(t), []model.Result{want})
		return err == nil, errString(err)
	})
	checkResult(t, readResult(t, ws, 30*time.Second), want)

	after := s.queue(t, campaign, "bob")
	ws2 := mustDial(t, h, "bob")
	if got, _ := mustSubscribe(t, ws2, after); len(got) != 1 {
		t.Fatalf("subscribed %v, want [%s]", got, after)
	}
	want, err = s.decide(mustContext(t), after, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.st.PublishResults(mustContext(t), []model.Result{want}); err != nil {
		t.Fatal(err)
	}
	checkResult(t, readResult(t, ws2, 30*time.Second), want)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestFeedsReadAgainAfterResubscribing: a campaign's subscription that
// could not be made at first does not hold its waiter back (the stored read
// answers), and once it is made the waiters' stored results are read again:
// a result published while it was down still arrives, with the periodic
// re-check off.
func TestFeedsReadAgainAfterResubscribing(t *testing.T) {
	e, f := fakeEnv(t)
	f.subscribeErrs = []error{errors.New("redis down")}
	release := make(chan struct{})
	f.beforeSubscribe = func(string) { <-release }
	h := newHarness(t, f, Options{RecheckInterval: time.Hour})
	id := e.newRequest(t, "alice")
	ws := mustDial(t, h, "alice")
	if got, _ := mustSubscribe(t, ws, id); len(got) != 1 {
		t.Fatalf("subscribed %v, want [%s]", got, id)
	}
	want := e.decide(t, id, "alice")
	e.publish(t, want) // nobody subscribed: lost
	close(release)
	checkResult(t, readResult(t, ws, 5*time.Second), want)
}

// TestFeedsSlotMoved: when the slot of a campaign moves to another master
// (resharding), Redis ends the subscriptions of its sharded channels; the
// notifier subscribes again on the slot's new master, and its waiter gets
// the result published after the move. The periodic re-check is off.
func TestFeedsSlotMoved(t *testing.T) {
	c := testenv.PrivateCluster(t, 3, 0)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClusterStateReloadInterval: 500 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	s := sale{rdb: rdb, st: store.New(rdb)}
	campaign := s.load(t)
	h := newHarness(t, s.st, Options{RecheckInterval: time.Hour})
	id := s.queue(t, campaign, "alice")
	ws := mustDial(t, h, "alice")
	if got, _ := mustSubscribe(t, ws, id); len(got) != 1 {
		t.Fatalf("subscribed %v, want [%s]", got, id)
	}
	if got := shardChannels(t, rdb, campaign); len(got) != 1 {
		t.Fatalf("channels before the move: %v, want one", got)
	}
	from, to := moveSlot(t, rdb, c, "{"+campaign+"}")
	testenv.Eventually(t, 30*time.Second, "the channel subscribed on the new master", func() (bool, string) {
		m, err := rdb.MasterForKey(mustContext(t), "{"+campaign+"}")
		if err != nil || m.Options().Addr != to {
			return false, fmt.Sprintf("master %v, %v", m, err)
		}
		got := shardChannels(t, rdb, campaign)
		return len(got) == 1, fmt.Sprint(got)
	})
	want, err := s.decide(mustContext(t), id, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.st.PublishResults(mustContext(t), []model.Result{want}); err != nil {
		t.Fatal(err)
	}
	checkResult(t, readResult(t, ws, 10*time.Second), want)
	t.Logf("slot moved from %s to %s", from, to)
}

// moveSlot migrates the slot of key, with its keys, from its master to
// another master of c, as redis-cli --cluster reshard does, and returns
// both masters' addresses.
func moveSlot(t *testing.T, rdb *redis.ClusterClient, c *testenv.Cluster, key string) (from, to string) {
	t.Helper()
	ctx := mustContext(t)
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	src, err := rdb.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	from = src.Options().Addr
	var dst *redis.Client
	for _, a := range c.Addrs() {
		if a != from {
			dst = redis.NewClient(&redis.Options{Addr: a})
			to = a
			break
		}
	}
	t.Cleanup(func() { _ = dst.Close() })
	srcID, err := src.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	dstID, err := dst.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(to, ":")
	steps := []struct {
		on   *redis.Client
		args []any
	}{
		{dst, []any{"cluster", "setslot", slot, "importing", srcID}},
		{src, []any{"cluster", "setslot", slot, "migrating", dstID}},
	}
	for _, st := range steps {
		if err := st.on.Do(ctx, st.args...).Err(); err != nil {
			t.Fatalf("%v: %v", st.args, err)
		}
	}
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("MIGRATE: %v", err)
		}
	}
	for _, a := range c.Addrs() {
		n := redis.NewClient(&redis.Options{Addr: a})
		err := n.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err()
		_ = n.Close()
		if err != nil {
			t.Fatalf("SETSLOT NODE on %s: %v", a, err)
		}
	}
	return from, to
}
