package main

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

// Sales on the rocketmq driver across what a real broker does to its
// clients (queue/rocketmq/README.md, "The broker double"): a crash that takes
// committed offsets back, a restart that forgets locks and consumer groups
// while two workers run, a send-back it refuses.

// RocketMQ codes for the double's InjectFault and Requests (its remoting
// package is internal to queue/rocketmq).
const (
	codeConsumerSendMsgBack int16 = 36 // CONSUMER_SEND_MSG_BACK, a request
	codeSystemError         int16 = 1  // SYSTEM_ERROR, a response
)

// saleRun is what shopAcross saw.
type saleRun struct {
	accepted map[string]string // request id -> user
	refused  int               // 503s, each retried
	soldOut  int               // refused as sold out at the gateway
	faultAt  time.Time
}

// shopAcross sells requests purchases from distinct users one at a time,
// so the campaign's queue holds them in the order they were accepted. Once
// a third were sent and the workers decided a sixth, it calls ready (if
// set; shopping waits for it), then runs fault in the background and goes
// on shopping. A purchase refused with 503 is retried with the same
// Idempotency-Key, as a shopper's client would. It returns once every
// purchase was answered and fault returned.
func shopAcross(t *testing.T, c *client, campaign string, requests int, ready func(), fault func() error) saleRun {
	t.Helper()
	run := saleRun{accepted: map[string]string{}}
	faulted := make(chan error, 1)
	for i := range requests {
		if i == requests/3 {
			testenv.Eventually(t, 20*time.Second, "the workers to decide the first requests", func() (bool, string) {
				n := finished(c.stats(campaign))
				return n >= int64(requests/6), fmt.Sprintf("%d decided", n)
			})
			if ready != nil {
				ready()
			}
			run.faultAt = time.Now()
			go func() { faulted <- fault() }()
		}
		user := fmt.Sprintf("r%04d", i)
		key := map[string]string{"Idempotency-Key": "buy-" + user}
		for attempt := 1; ; attempt++ {
			var p purchaseBody
			code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(user), `{"quantity":1}`, key, &p)
			if code == http.StatusAccepted || code == http.StatusOK {
				run.accepted[p.RequestID] = user
				break
			}
			if code == http.StatusGone && p.Code == "sold_out" {
				run.soldOut++
				break
			}
			if code != http.StatusServiceUnavailable {
				t.Fatalf("purchase of %s: got %d %q, want 202, 410 sold_out or 503", user, code, p.Code)
			}
			run.refused++
			if attempt == 200 {
				t.Fatalf("purchase of %s: still refused after %d attempts", user, attempt)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := <-faulted; err != nil {
		t.Fatalf("fault: %v", err)
	}
	return run
}

func finished(st statsBody) int64 {
	var n int64
	for _, k := range st.FinishedByStatus {
		n += k
	}
	return n
}

// verifyQueueOrder checks that the campaign's requests were decided in the
// order of its queue: every user is distinct and buys one unit, so walking
// the queue from its first message, the successes come first and no request
// succeeds after one was sold out. Two workers may consume one queue at
// once for a while (after a broker restart), and a replay goes over decided
// requests again; each worker decides in queue order from a committed
// offset, below which everything is decided, and deduct.lua decides a
// request once, so the first decision of each request still follows the
// queue.
func verifyQueueOrder(t *testing.T, srv *rmqtest.Server, topic string, c *client) {
	t.Helper()
	seen := map[string]bool{}
	firstSoldOut := ""
	checked := 0
	for _, m := range srv.AllMessages(topic) {
		req, err := model.DecodePurchaseRequest(m.Body)
		if err != nil {
			t.Errorf("message at queue %d offset %d: %v", m.QueueID, m.QueueOffset, err)
			continue
		}
		if seen[req.RequestID] {
			continue
		}
		seen[req.RequestID] = true
		_, r := c.pollDecided(req.UserID, req.RequestID)
		switch {
		case r.Status == "sold_out" && firstSoldOut == "":
			firstSoldOut = req.RequestID
		case r.Status == "success" && firstSoldOut != "":
			t.Errorf("request %s (queue %d offset %d) succeeded after %s, earlier in the queue, was sold out",
				req.RequestID, m.QueueID, m.QueueOffset, firstSoldOut)
		}
		checked++
	}
	if checked == 0 {
		t.Errorf("no message of the campaign on the broker")
	}
}

// deductions reads a process's count of results decided (each decision of
// a redelivered request counts again).
func deductions(t *testing.T, p *roleProcess) int64 {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", p.role, err)
	}
	defer resp.Body.Close()
	var n int64
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if line := lines.Text(); strings.HasPrefix(line, "flashsale_deductions_total{") {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metrics of %s: %q: %v", p.role, line, err)
			}
			n += int64(v)
		}
	}
	return n
}

// TestBrokerCrashMidSale: the host of the broker and the worker fails in
// the middle of a sale. The broker's process dies without its shutdown:
// messages survive (they are in the page cache), consumer offsets go back
// to their last flush — here none, the worst a broker flushing every 5 s
// can do. The worker died with it, so nothing puts the offsets back, and
// the next worker starts the campaign's queue from its first message: every
// batch acknowledged before the crash comes back. Each request must still
// end with exactly one final result, in queue order, with the stock sold
// exactly and MySQL holding exactly the successes.
func TestBrokerCrashMidSale(t *testing.T) {
	t.Parallel()
	const stock, requests = 120, 150
	cfg := realConfig(t, "rocketmq")
	srv := startBrokerDouble(t, rmqtest.Options{OffsetFlushInterval: time.Hour})
	srv.CreateTopic(cfg.Queue.Topic, rocketMQQueues)
	srv.CreateTopic(cfg.Queue.ExpiryTopic, rocketMQQueues)
	bin := buildBinary(t)
	env := append(rocketMQEnv(cfg, srv.Addr()), "FLASHSALE_GATEWAY_PUBLISH_TIMEOUT=300ms", "FLASHSALE_QUEUE_BATCH_SIZE=16")
	shop, results := startShopFront(t, bin, cfg, env)
	doomed := startRole(t, bin, "worker", env)
	campaign := testenv.Name(t, "rmqcrash-")
	shop.openCampaign(campaign, stock, 1)

	// The crash must take something back: wait for the worker's first
	// offset commit (the library persists 10 s after it starts, then every
	// 5 s).
	committed := func() int64 {
		var most int64
		for q := range rocketMQQueues {
			off, _ := srv.CommittedOffset(cfg.Queue.Group, cfg.Queue.Topic, q)
			most = max(most, off)
		}
		return most
	}
	ready := func() {
		testenv.Eventually(t, 30*time.Second, "the worker to commit an offset", func() (bool, string) {
			return committed() > 0, "none yet"
		})
	}
	var decidedBefore, committedBefore int64
	run := shopAcross(t, shop, campaign, requests, ready, func() error {
		doomed.kill()
		committedBefore, decidedBefore = committed(), finished(shop.stats(campaign))
		return srv.Crash(500 * time.Millisecond)
	})
	if run.refused == 0 {
		t.Errorf("got no refused purchase, want the crash to have hit the sale")
	}
	successor := startRole(t, bin, "worker", env)
	st := shop.settle(campaign, 90*time.Second)
	verifySettled(t, results, campaign, stock, 1, run.accepted, st)
	if st.Sold != stock {
		t.Errorf("sold %d, want %d: demand exceeded stock, so nothing may be undersold", st.Sold, stock)
	}
	verifyQueueOrder(t, srv, cfg.Queue.Topic, results)
	// The successor went over the whole queue again: the requests decided
	// before the crash once more, and everything after. A purchase whose
	// send the crash cut off may be accepted without being stored (its
	// outcome was unknown; the not-enqueued sweep rejects it), so count
	// what the broker holds.
	inQueue := map[string]bool{}
	for _, m := range srv.AllMessages(cfg.Queue.Topic) {
		inQueue[m.Keys()] = true
	}
	var stored int64
	for rid := range run.accepted {
		if inQueue[rid] {
			stored++
		}
	}
	if got := deductions(t, successor); got < stored {
		t.Errorf("the successor decided %d requests, want at least the %d accepted and stored: the crash should have sent back the %d committed before it",
			got, stored, committedBefore)
	}
	t.Logf("%d decided and %d committed before the crash; %d purchases refused and retried; the sale settled %v after the crash",
		decidedBefore, committedBefore, run.refused, time.Since(run.faultAt))
}

// TestTwoWorkersBrokerRestart: two worker processes share the topic, as
// compose runs them, and the broker restarts mid-sale. It forgets every
// queue lock and the consumer group; the first worker to register again
// takes every queue while the other may still hand out the batches it had
// pulled, until its next lock renewal fails; then they share the queues
// again. Results must hold: exactly one final result per request, decided
// in queue order, the stock sold exactly, MySQL holding exactly the
// successes.
func TestTwoWorkersBrokerRestart(t *testing.T) {
	t.Parallel()
	const stock, requests = 120, 150
	cfg := realConfig(t, "rocketmq")
	srv := startBrokerDouble(t, rmqtest.Options{})
	srv.CreateTopic(cfg.Queue.Topic, rocketMQQueues)
	srv.CreateTopic(cfg.Queue.ExpiryTopic, rocketMQQueues)
	bin := buildBinary(t)
	env := append(rocketMQEnv(cfg, srv.Addr()), "FLASHSALE_GATEWAY_PUBLISH_TIMEOUT=300ms", "FLASHSALE_QUEUE_BATCH_SIZE=16")
	shop, results := startShopFront(t, bin, cfg, env)
	workers := []*roleProcess{startRole(t, bin, "worker", env), startRole(t, bin, "worker", env)}
	owners := func() map[string]int {
		out := map[string]int{}
		for q := range rocketMQQueues {
			if o := srv.LockOwner(cfg.Queue.Group, cfg.Queue.Topic, q); o != "" {
				out[o]++
			}
		}
		return out
	}
	testenv.Eventually(t, 60*time.Second, "the two workers to share the queues", func() (bool, string) {
		o := owners()
		return len(o) == 2, fmt.Sprintf("queue locks by owner: %v", o)
	})
	campaign := testenv.Name(t, "rmq2w-")
	shop.openCampaign(campaign, stock, 1)

	run := shopAcross(t, shop, campaign, requests, nil, func() error { return srv.Restart(true, 500*time.Millisecond) })
	if run.refused == 0 {
		t.Errorf("got no refused purchase, want the restart to have hit the sale")
	}
	st := shop.settle(campaign, 90*time.Second)
	verifySettled(t, results, campaign, stock, 1, run.accepted, st)
	if st.Sold != stock {
		t.Errorf("sold %d, want %d: demand exceeded stock, so nothing may be undersold", st.Sold, stock)
	}
	verifyQueueOrder(t, srv, cfg.Queue.Topic, results)
	t.Logf("%d purchases refused and retried; settled %v after the restart; decisions by worker: %d and %d (replays count again); queue locks now %v",
		run.refused, time.Since(run.faultAt), deductions(t, workers[0]), deductions(t, workers[1]), owners())
}

// TestPoisonRejectedWhileSendBackRefused: a request that fails every time
// its worker decides it, on a broker that refuses every send-back. The
// worker gives up on it after worker.max_attempts and records its final
// rejected result; max_reconsume_times is at least that, so the driver
// never reaches the dead-letter step (whose refusal would keep the message
// in its queue, never commit past it). The requests around it are decided
// normally.
func TestPoisonRejectedWhileSendBackRefused(t *testing.T) {
	t.Parallel()
	const stock, requests, poisonAt = 10, 6, 2
	cfg := realConfig(t, "rocketmq")
	srv := startBrokerDouble(t, rmqtest.Options{})
	srv.CreateTopic(cfg.Queue.Topic, rocketMQQueues)
	srv.CreateTopic(cfg.Queue.ExpiryTopic, rocketMQQueues)
	srv.InjectFault(codeConsumerSendMsgBack, rmqtest.Fault{Code: codeSystemError, Remark: "refused"})
	env := append(rocketMQEnv(cfg, srv.Addr()), "FLASHSALE_WORKER_MAX_ATTEMPTS=3",
		"FLASHSALE_QUEUE_ROCKETMQ_MAX_RECONSUME_TIMES=3", "FLASHSALE_QUEUE_ROCKETMQ_SUSPEND_TIME=100ms")
	c := startRole(t, buildBinary(t), "serve", env).client(t, cfg)
	campaign := testenv.Name(t, "rmqpoison-")
	c.openCampaign(campaign, stock, 1)

	// The poison: the user's bought units in Redis are not a number, so
	// deduct.lua fails on every batch holding the user's request.
	users := make([]string, requests)
	for i := range users {
		users[i] = fmt.Sprintf("p%02d", i)
	}
	rdb := testenv.Redis(t)
	if err := rdb.HSet(t.Context(), "fs:{"+campaign+"}:users", users[poisonAt], "garbage").Err(); err != nil {
		t.Fatalf("corrupt the poisoned user's units: %v", err)
	}
	rids := make([]string, requests)
	for i, user := range users {
		var p purchaseBody
		if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token(user), `{"quantity":1}`, nil, &p); code != http.StatusAccepted {
			t.Fatalf("purchase of %s: got %d %q, want 202", user, code, p.Code)
		}
		rids[i] = p.RequestID
	}
	testenv.Eventually(t, 60*time.Second, "a final result for every request", func() (bool, string) {
		st := c.stats(campaign)
		return st.Queued == 0 && finished(st) == requests, fmt.Sprintf("%+v", st)
	})
	for i, rid := range rids {
		_, r := c.pollDecided(users[i], rid)
		want := "success"
		if i == poisonAt {
			want = "rejected"
		}
		if r.Status != want {
			t.Errorf("request %d (%s): got %s (%s), want %s", i, rid, r.Status, r.Reason, want)
		}
	}
	if st := c.settle(campaign, 30*time.Second); st.Sold != requests-1 || st.OrdersInDB != requests-1 {
		t.Errorf("got %d sold, %d orders in MySQL; want %d of each", st.Sold, st.OrdersInDB, requests-1)
	}
	if n, dlq := srv.Requests(codeConsumerSendMsgBack), len(srv.DLQ(cfg.Queue.Group)); n != 0 || dlq != 0 {
		t.Errorf("got %d send-backs and %d dead-lettered, want none: the worker gives up first", n, dlq)
	}
}
