package notifier

import (
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// redisProxy forwards TCP connections to a Redis until stop; then its port
// refuses connections and the open ones are closed, as when Redis dies.
type redisProxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	conns   []net.Conn
	stopped bool
}

func newRedisProxy(t *testing.T, backend string) *redisProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &redisProxy{ln: ln, backend: backend}
	t.Cleanup(p.stop)
	go p.serve()
	return p
}

func (p *redisProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.backend)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			_, _ = c.Close(), b.Close()
			return
		}
		p.conns = append(p.conns, c, b)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(b, c); _ = b.Close() }()
		go func() { _, _ = io.Copy(c, b); _ = c.Close() }()
	}
}

func (p *redisProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	_ = p.ln.Close()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// guardedRedisEnv is redisEnv on a client guarded as cmd/flashsale's is
// (store.Guard: a call without an answer is model.ErrUnavailable), through
// a proxy whose stop takes Redis away.
func guardedRedisEnv(t *testing.T) (env, *redisProxy) {
	t.Helper()
	p := newRedisProxy(t, testenv.RedisAddr(t))
	const timeout = 300 * time.Millisecond
	// One dial attempt: a refused call fails at once, not at the timeout,
	// which keeps the test short.
	rdb := redis.NewClient(&redis.Options{Addr: p.ln.Addr().String(), ContextTimeoutEnabled: true, DialerRetries: 1,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout})
	rdb.AddHook(&store.Guard{Timeout: timeout})
	t.Cleanup(func() { _ = rdb.Close() })
	return redisEnvOn(t, rdb), p
}

// TestRedisDownLedger: while Redis is unavailable, polls and WebSocket
// subscriptions are answered with what MySQL decided (issue 28). A
// success and a refusal reach their user; another user's id is not found;
// an id MySQL has not decided is unavailable to a poll and waits on a
// socket. A waiter subscribed before the outage gets its result through
// the re-check. MySQL is not read while Redis answers; with MySQL down too,
// nothing is answered.
func TestRedisDownLedger(t *testing.T) {
	t.Parallel()
	e, proxy := guardedRedisEnv(t)
	ledger := newFakeLedger()
	h := newHarness(t, e.src, Options{Ledger: ledger, RecheckInterval: 20 * time.Millisecond})
	success := func(id, user string, quantity int64) model.Result {
		return model.Result{RequestID: id, CampaignID: e.campaign, UserID: user, Status: model.StatusSuccess,
			Quantity: quantity, OrderID: model.OrderIDOf(id)}
	}
	order := func(r model.Result) {
		ledger.order(model.Order{ID: r.OrderID, RequestID: r.RequestID, CampaignID: r.CampaignID, UserID: r.UserID,
			Quantity: r.Quantity, Status: model.OrderPendingPayment})
	}

	waiting := e.newRequest(t, "alice")
	queued := e.newRequest(t, "alice")
	ws := mustDial(t, h, "alice")
	if got, errs := mustSubscribe(t, ws, waiting); len(got) != 1 || len(errs) != 0 {
		t.Fatalf("subscribe before the outage: got %v, errors %+v; want subscribed", got, errs)
	}
	t.Run("Redis up: no MySQL read", func(t *testing.T) {
		status, body := mustGet(t, h, "alice", "/api/v1/purchases/"+queued)
		if status != http.StatusOK || body["status"] != "queued" {
			t.Errorf("poll: got %d %v, want 200 queued", status, body)
		}
		trips := e.trips()
		testenv.Eventually(t, 5*time.Second, "re-checks from Redis", func() (bool, string) {
			return e.trips() >= trips+3, "no re-check yet"
		})
		if got := ledger.readCount(); got != 0 {
			t.Errorf("got %d ledger reads while Redis answers, want 0", got)
		}
	})

	proxy.stop()
	// MySQL decides meanwhile.
	sold, refused, bobsLater := success(newRequestID(t, e.campaign), "alice", 2), newRequestID(t, e.campaign), newRequestID(t, e.campaign)
	order(sold)
	ledger.refuse(model.Result{RequestID: refused, CampaignID: e.campaign, UserID: "alice", Status: model.StatusSoldOut, Quantity: 1})
	order(success(waiting, "alice", 1))

	t.Run("waiter from before the outage", func(t *testing.T) {
		checkResult(t, readResult(t, ws, 5*time.Second), success(waiting, "alice", 1))
	})

	t.Run("polls", func(t *testing.T) {
		tests := []struct {
			name       string
			user       string
			requestID  string
			wantStatus int
			wantBody   map[string]any
			wantCode   string
		}{
			{name: "success", user: "alice", requestID: sold.RequestID, wantStatus: http.StatusOK,
				wantBody: map[string]any{"request_id": sold.RequestID, "campaign_id": e.campaign, "status": "success", "quantity": 2.0, "order_id": sold.OrderID}},
			{name: "refusal", user: "alice", requestID: refused, wantStatus: http.StatusOK,
				wantBody: map[string]any{"request_id": refused, "campaign_id": e.campaign, "status": "sold_out", "quantity": 1.0}},
			{name: "another user's", user: "bob", requestID: sold.RequestID, wantStatus: http.StatusNotFound, wantCode: "not_found"},
			{name: "undecided in MySQL", user: "alice", requestID: newRequestID(t, e.campaign), wantStatus: http.StatusServiceUnavailable, wantCode: "unavailable"},
			{name: "queued in Redis", user: "alice", requestID: queued, wantStatus: http.StatusServiceUnavailable, wantCode: "unavailable"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				status, body := mustGet(t, h, tt.user, "/api/v1/purchases/"+tt.requestID)
				checkAnswer(t, status, body, tt.wantStatus, tt.wantBody, tt.wantCode)
			})
		}
	})

	t.Run("subscriptions", func(t *testing.T) {
		alice, bob := mustDial(t, h, "alice"), mustDial(t, h, "bob")
		undecided := newRequestID(t, e.campaign)
		if got, errs := mustSubscribe(t, alice, sold.RequestID, undecided); !slices.Equal(got, []string{sold.RequestID, undecided}) || len(errs) != 0 {
			t.Fatalf("alice: got %v, errors %+v; want both subscribed", got, errs)
		}
		checkResult(t, mustReadResult(t, alice), sold)
		got, errs := mustSubscribe(t, bob, sold.RequestID, bobsLater)
		if !slices.Equal(got, []string{bobsLater}) || len(errs) != 1 || frameSummary(t, errs[0]) != "error not_found "+sold.RequestID {
			t.Fatalf("bob: got %v, errors %+v; want not_found for alice's result, the undecided id subscribed", got, errs)
		}
		// MySQL decides bob's undecided id, as alice's: not his.
		order(success(bobsLater, "alice", 1))
		if got := frameSummary(t, mustRead(t, bob)); got != "error not_found "+bobsLater {
			t.Errorf("bob: got %q, want not_found for %s", got, bobsLater)
		}
		expectQuiet(t, alice, quiet) // undecided waits on
	})

	t.Run("MySQL down too", func(t *testing.T) {
		id := newRequestID(t, e.campaign)
		order(success(id, "alice", 1))
		ledger.setFail(errors.New("connection refused"))
		t.Cleanup(func() { ledger.setFail(nil) })
		status, body := mustGet(t, h, "alice", "/api/v1/purchases/"+id)
		checkAnswer(t, status, body, http.StatusServiceUnavailable, nil, "unavailable")
		got, errs := mustSubscribe(t, mustDial(t, h, "alice"), id)
		if len(got) != 0 || len(errs) != 1 || frameSummary(t, errs[0]) != "error unavailable "+id {
			t.Errorf("subscribe: got %v, errors %+v; want unavailable", got, errs)
		}
	})
}

// TestRecheckLedger: while Redis is unavailable, a re-check reads its due
// ids from the ledger in one call, hands the final results to their
// waiters and keeps the others waiting; a ledger that cannot answer costs
// one WARN line a tick, with the count. The loop's own ticks are an hour
// apart: the test calls recheck itself.
func TestRecheckLedger(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	ledger := newFakeLedger()
	h := newHarness(t, f, Options{Ledger: ledger, RecheckInterval: time.Hour})
	ids := []string{e.newRequest(t, "alice"), e.newRequest(t, "alice"), e.newRequest(t, "alice")}
	ws := mustDial(t, h, "alice")
	if got, _ := mustSubscribe(t, ws, ids...); !slices.Equal(got, ids) {
		t.Fatalf("got subscribed %v, want %v", got, ids)
	}
	f.setFail(model.ErrUnavailable)
	const failed = "re-check results in the ledger while Redis is unavailable"

	ledger.setFail(errors.New("connection refused"))
	h.n.recheck(mustContext(t), time.Now())
	if got := h.logs.with(failed); len(got) != 1 || got[0]["due"] != int64(len(ids)) {
		t.Errorf("got warnings %v, want one with due=%d", got, len(ids))
	}
	if got := ledger.readCount(); got != 1 {
		t.Errorf("got %d ledger reads, want 1", got)
	}

	ledger.setFail(nil)
	won := successResult(ids[0], "alice")
	won.OrderID = model.OrderIDOf(won.RequestID)
	ledger.order(model.Order{ID: won.OrderID, RequestID: won.RequestID, CampaignID: won.CampaignID, UserID: "alice", Quantity: 1})
	limited := model.Result{RequestID: ids[1], CampaignID: e.campaign, UserID: "alice", Status: model.StatusLimitExceeded, Quantity: 1}
	ledger.refuse(limited)
	h.n.recheck(mustContext(t), time.Now())
	if got := ledger.readCount(); got != 2 {
		t.Errorf("got %d ledger reads, want 2", got)
	}
	want := map[string]model.Result{won.RequestID: won, limited.RequestID: limited}
	for range want {
		r := mustReadResult(t, ws)
		checkResult(t, r, want[r.RequestID])
		delete(want, r.RequestID)
	}
	if got := h.n.hub.due(time.Now(), len(ids)); !slices.Equal(got, ids[2:]) {
		t.Errorf("got due %v, want the undecided %v", got, ids[2:])
	}
	if got := h.logs.with(failed); len(got) != 1 {
		t.Errorf("got %d warnings, want the first tick's only", len(got))
	}
}
