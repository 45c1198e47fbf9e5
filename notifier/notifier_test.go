package notifier

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// TestMain also fails the package if its tests leave Redis keys behind.
func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	testenv.Main(m)
}

var _ ResultSource = (*store.Store)(nil)
var _ ResultSource = (*fakeSource)(nil)

// fakeSource is an in-memory ResultSource; it passes the same contract test
// as *store.Store.
type fakeSource struct {
	mu      sync.Mutex
	results map[string]model.Result
	// seq and decided are each campaign's last admission sequence number
	// and highest decided one.
	seq, decided map[string]int64
	fail         error
	// afterRead runs inside Result after the answer is taken, so the stored
	// state can change "right after the read".
	afterRead func(requestID string)
	// subscribeErrs are returned by the next SubscribeResults calls.
	subscribeErrs []error
	// beforeSubscribe, when set, runs at the start of a SubscribeResults
	// call that does not fail: a test holds the subscription back there.
	beforeSubscribe func(campaignID string)

	pubMu sync.Mutex // serializes each campaign's fn like the store's subscription goroutine
	fns   map[string]func(model.Result)

	reads atomic.Int64 // request ids read, by Result or Results
	trips atomic.Int64 // Result and Results calls
}

func newFakeSource() *fakeSource {
	return &fakeSource{results: map[string]model.Result{}, seq: map[string]int64{}, decided: map[string]int64{},
		fns: map[string]func(model.Result){}}
}

// fakeRate is the decision rate the fake reports once anything was decided.
const fakeRate = 10

func (f *fakeSource) Progress(_ context.Context, campaignIDs []string) ([]model.QueueProgress, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, fmt.Errorf("progress: %w", f.fail)
	}
	out := make([]model.QueueProgress, len(campaignIDs))
	for i, c := range campaignIDs {
		if d := f.decided[c]; d > 0 {
			out[i] = model.QueueProgress{Decided: d, Rate: fakeRate}
		}
	}
	return out, nil
}

// admit stores r as queued with the next sequence number of its campaign.
func (f *fakeSource) admit(r model.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq[r.CampaignID]++
	r.Status, r.Seq = model.StatusQueued, f.seq[r.CampaignID]
	f.results[r.RequestID] = r
}

func (f *fakeSource) Result(_ context.Context, requestID string) (model.Result, error) {
	f.reads.Add(1)
	f.trips.Add(1)
	f.mu.Lock()
	r, ok := f.results[requestID]
	fail, hook := f.fail, f.afterRead
	f.mu.Unlock()
	if hook != nil {
		hook(requestID)
	}
	switch {
	case fail != nil:
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, fail)
	case !ok:
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	return r, nil
}

func (f *fakeSource) Results(_ context.Context, requestIDs []string) ([]model.Result, error) {
	f.reads.Add(int64(len(requestIDs)))
	f.trips.Add(1)
	f.mu.Lock()
	out := make([]model.Result, len(requestIDs))
	for i, id := range requestIDs {
		out[i] = f.results[id]
	}
	fail, hook := f.fail, f.afterRead
	f.mu.Unlock()
	if hook != nil {
		for _, id := range requestIDs {
			hook(id)
		}
	}
	if fail != nil {
		return nil, fmt.Errorf("results of %d requests: %w", len(requestIDs), fail)
	}
	return out, nil
}

func (f *fakeSource) SubscribeResults(ctx context.Context, campaignID string, ready func(), fn func(model.Result)) error {
	f.mu.Lock()
	if len(f.subscribeErrs) > 0 {
		err := f.subscribeErrs[0]
		f.subscribeErrs = f.subscribeErrs[1:]
		f.mu.Unlock()
		return err
	}
	hook := f.beforeSubscribe
	f.mu.Unlock()
	if hook != nil {
		hook(campaignID)
	}
	f.pubMu.Lock()
	f.fns[campaignID] = fn
	f.pubMu.Unlock()
	ready()
	<-ctx.Done()
	f.pubMu.Lock()
	delete(f.fns, campaignID)
	f.pubMu.Unlock()
	return nil
}

// store saves r without publishing it; a final r moves its campaign's
// decided watermark as deduct.lua does.
func (f *fakeSource) store(r model.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if was := f.results[r.RequestID]; r.Status.Final() && was.Status == model.StatusQueued {
		f.decided[r.CampaignID] = max(f.decided[r.CampaignID], was.Seq)
	}
	f.results[r.RequestID] = r
}

// announce publishes r to the subscriber of its campaign, if any.
func (f *fakeSource) announce(r model.Result) {
	f.pubMu.Lock()
	defer f.pubMu.Unlock()
	if fn := f.fns[r.CampaignID]; fn != nil {
		fn(r)
	}
}

// forget deletes the stored result of requestID, as a campaign reload does.
func (f *fakeSource) forget(requestID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.results, requestID)
}

func (f *fakeSource) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *fakeSource) setAfterRead(hook func(string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.afterRead = hook
}

// env is a ResultSource with the operations the worker would perform on it.
type env struct {
	src      ResultSource
	campaign string
	// queue stores requestID as queued for userID.
	queue func(t *testing.T, requestID, userID string)
	// decide stores a final (success) result without publishing it.
	decide func(t *testing.T, requestID, userID string) model.Result
	// publish publishes r on the results channel.
	publish func(t *testing.T, r model.Result)
	// reads counts the request ids whose stored result was read so far.
	reads func() int64
	// trips counts the round trips that read stored results so far.
	trips func() int64
}

func (e env) newRequest(t *testing.T, userID string) string {
	t.Helper()
	id := newRequestID(t, e.campaign)
	e.queue(t, id, userID)
	return id
}

func newRequestID(t testing.TB, campaign string) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random: %v", err)
	}
	return model.FormatRequestID(campaign, hex.EncodeToString(b))
}

func fakeEnv(t *testing.T) (env, *fakeSource) {
	t.Helper()
	f := newFakeSource()
	campaign := testenv.Name(t, "nt_")
	return env{
		src: f, campaign: campaign,
		queue: func(t *testing.T, id, user string) {
			f.admit(model.Result{RequestID: id, CampaignID: campaign, UserID: user, Quantity: 1})
		},
		decide: func(t *testing.T, id, user string) model.Result {
			r := successResult(id, user)
			f.store(r)
			return r
		},
		publish: func(t *testing.T, r model.Result) { f.announce(r) },
		reads:   f.reads.Load,
		trips:   f.trips.Load,
	}, f
}

// successResult is the final result the fake worker decides.
func successResult(requestID, userID string) model.Result {
	campaign, _ := model.CampaignOfRequest(requestID)
	return model.Result{RequestID: requestID, CampaignID: campaign, UserID: userID, Status: model.StatusSuccess,
		Quantity: 1, OrderID: "o-" + requestID[len(requestID)-8:]}
}

func redisEnv(t *testing.T) env {
	t.Helper()
	return redisEnvOn(t, testenv.Redis(t))
}

// redisEnvOn is redisEnv on the client rdb of the test Redis.
func redisEnvOn(t *testing.T, rdb *redis.Client) env {
	t.Helper()
	st := store.New(rdb)
	campaign := testenv.Name(t, "nt_")
	ctx := mustContext(t)
	now := time.Now()
	c := model.Campaign{ID: campaign, Name: "notifier test", Stock: 1000, PerUserLimit: 1000,
		StartAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}
	if _, err := st.Rebuild(ctx, c, nil, nil); err != nil {
		t.Fatalf("load: %v", err)
	}
	// Counted from here: the client is this test's own.
	reads := &resultReads{}
	rdb.AddHook(reads)
	return env{
		src: st, campaign: campaign,
		queue: func(t *testing.T, id, user string) {
			t.Helper()
			got, err := st.Admit(mustContext(t), campaign, []model.AdmitRequest{{RequestID: id, CampaignID: campaign, UserID: user, Quantity: 1}}, model.RateLimits{})
			if err != nil || got[0].Code != model.Admitted {
				t.Fatalf("admit %s: got %+v, %v; want admitted", id, got, err)
			}
		},
		decide: func(t *testing.T, id, user string) model.Result {
			t.Helper()
			reply, err := st.Deduct(mustContext(t), campaign, []model.Deduction{{RequestID: id, UserID: user, Quantity: 1, OrderID: "o-" + id[len(id)-8:]}})
			if err == nil && reply.Made > 0 {
				// As the worker does once the order is stored.
				err = st.MarkDurable(mustContext(t), campaign, reply.Made, reply.Epoch)
			}
			if err != nil {
				t.Fatalf("deduct %s: %v", id, err)
			}
			return reply.Results[0]
		},
		publish: func(t *testing.T, r model.Result) {
			t.Helper()
			if err := st.PublishResults(mustContext(t), []model.Result{r}); err != nil {
				t.Fatalf("publish %s: %v", r.RequestID, err)
			}
		},
		reads: reads.ids.Load,
		trips: reads.trips.Load,
	}
}

// resultReads counts the stored-result reads a go-redis client sends: the
// request ids read (an HGET reads one, an HMGET one per field) and the round
// trips that carry them, alone or in a pipeline. A new connection's own
// handshake commands are not counted.
type resultReads struct{ ids, trips atomic.Int64 }

// count adds the request ids cmd reads and reports whether it reads any.
func (h *resultReads) count(cmd redis.Cmder) bool {
	if args := cmd.Args(); len(args) < 2 || !strings.HasSuffix(fmt.Sprint(args[1]), ":results") {
		return false // TIME and the counters of the queue progress
	}
	switch cmd.Name() {
	case "hget":
		h.ids.Add(1)
	case "hmget":
		h.ids.Add(int64(len(cmd.Args()) - 2))
	default:
		return false
	}
	return true
}

func (h *resultReads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *resultReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.count(cmd) {
			h.trips.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *resultReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		reads := false
		for _, cmd := range cmds {
			reads = h.count(cmd) || reads
		}
		if reads {
			h.trips.Add(1)
		}
		return next(ctx, cmds)
	}
}

// envs lists every ResultSource implementation the notifier must work on.
var envs = []struct {
	name string
	make func(t *testing.T) env
}{
	{"fake", func(t *testing.T) env { e, _ := fakeEnv(t); return e }},
	{"redis", redisEnv},
}

func mustContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// harness serves a Notifier over HTTP and runs it.
type harness struct {
	n    *Notifier
	m    *metrics.Metrics
	srv  *httptest.Server
	jwt  *auth.JWT
	logs *warnings
}

// warnings is a slog.Handler that keeps the records at WARN and above.
type warnings struct {
	mu      sync.Mutex
	records []slog.Record
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.records = append(w.records, r.Clone())
	return nil
}

// with returns the records whose message is msg, each as its attributes.
func (w *warnings) with(msg string) []map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []map[string]any
	for _, r := range w.records {
		if r.Message != msg {
			continue
		}
		attrs := map[string]any{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.Any(); return true })
		out = append(out, attrs)
	}
	return out
}

func newHarness(t testing.TB, src ResultSource, opts Options) *harness {
	t.Helper()
	return startHarness(t, src, opts, httptest.NewUnstartedServer(nil))
}

func startHarness(t testing.TB, src ResultSource, opts Options, srv *httptest.Server) *harness {
	t.Helper()
	h := &harness{m: metrics.New(), jwt: auth.NewJWT([]byte("notifier-test-secret-0123456789abcdef"), 0), logs: &warnings{}}
	log := slog.New(h.logs)
	if opts.ProgressInterval == 0 {
		// Progress frames have their own tests (progress_test.go); elsewhere
		// they would come between the frames a test expects.
		opts.ProgressInterval = time.Hour
	}
	h.n = New(log, src, h.m, opts)
	e := gin.New()
	h.n.Register(e, httpapi.Shopper(log, h.jwt, false), httpapi.Shopper(log, h.jwt, true))
	srv.Config.Handler = e
	if srv.TLS != nil {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	h.srv = srv

	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- h.n.Run(ctx) }()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer scancel()
		h.n.Shutdown(sctx)
		srv.Close()
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	})
	testenv.Eventually(t, 5*time.Second, "notifier ready", func() (bool, string) { return h.n.Ready(), "not ready" })
	return h
}

func (h *harness) token(t testing.TB, user string) string {
	t.Helper()
	tok, err := h.jwt.Mint(user, time.Hour)
	if err != nil {
		t.Fatalf("mint token: %v", err)
	}
	return tok
}

func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	_ = g.Write(&m)
	return m.GetGauge().GetValue()
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

func TestResultSourceContract(t *testing.T) {
	t.Parallel()
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			e := impl.make(t)
			t.Run("unknown id is not found", func(t *testing.T) {
				_, err := e.src.Result(mustContext(t), newRequestID(t, e.campaign))
				if !errors.Is(err, model.ErrNotFound) {
					t.Errorf("got err %v, want model.ErrNotFound", err)
				}
			})
			t.Run("malformed id is not found", func(t *testing.T) {
				_, err := e.src.Result(mustContext(t), "not-a-request-id")
				if !errors.Is(err, model.ErrNotFound) {
					t.Errorf("got err %v, want model.ErrNotFound", err)
				}
			})
			t.Run("queued request reads back", func(t *testing.T) {
				id := e.newRequest(t, "alice")
				r, err := e.src.Result(mustContext(t), id)
				if err != nil {
					t.Fatalf("result: %v", err)
				}
				if r.Seq < 1 {
					t.Errorf("got sequence number %d, want >= 1", r.Seq)
				}
				want := model.Result{RequestID: id, CampaignID: e.campaign, UserID: "alice", Status: model.StatusQueued, Quantity: 1, Seq: r.Seq}
				if r != want {
					t.Errorf("got %+v, want %+v", r, want)
				}
			})
			t.Run("batch read answers each id in order", func(t *testing.T) {
				queued := e.newRequest(t, "alice")
				final := e.newRequest(t, "bob")
				decided := e.decide(t, final, "bob")
				unknown := newRequestID(t, e.campaign)
				ids := []string{queued, unknown, "not-a-request-id", final, queued}
				got, err := e.src.Results(mustContext(t), ids)
				if err != nil {
					t.Fatalf("results: %v", err)
				}
				queuedResult := model.Result{RequestID: queued, CampaignID: e.campaign, UserID: "alice", Status: model.StatusQueued, Quantity: 1, Seq: got[0].Seq}
				if got[0].Seq < 1 {
					t.Errorf("got sequence number %d, want >= 1", got[0].Seq)
				}
				want := []model.Result{queuedResult, {}, {}, decided, queuedResult}
				if !slices.Equal(got, want) {
					t.Errorf("got %+v, want %+v", got, want)
				}
			})
			t.Run("published result reaches subscriber", func(t *testing.T) {
				ctx, cancel := context.WithCancel(mustContext(t))
				ready := make(chan struct{})
				got := make(chan model.Result, 16)
				done := make(chan error, 1)
				// Only this id's: a benchmark's sale on the same Redis
				// publishes thousands, which filled the channel.
				id := newRequestID(t, e.campaign)
				go func() {
					done <- e.src.SubscribeResults(ctx, e.campaign, sync.OnceFunc(func() { close(ready) }), func(r model.Result) {
						if r.RequestID != id {
							return
						}
						select {
						case got <- r:
						default:
						}
					})
				}()
				select {
				case <-ready:
				case <-time.After(5 * time.Second):
					t.Fatal("subscription not ready after 5s")
				}
				e.queue(t, id, "alice")
				want := e.decide(t, id, "alice")
				e.publish(t, want)
				timeout := time.After(5 * time.Second)
				for found := false; !found; {
					select {
					case r := <-got:
						found = r.RequestID == id
						if found && (r.Status != want.Status || r.UserID != "alice") {
							t.Errorf("got %+v, want %+v", r, want)
						}
					case <-timeout:
						t.Fatal("published result not received after 5s")
					}
				}
				cancel()
				if err := <-done; err != nil {
					t.Errorf("SubscribeResults returned %v, want nil", err)
				}
			})
		})
	}
}

func TestPoll(t *testing.T) {
	t.Parallel()
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			e := impl.make(t)
			h := newHarness(t, e.src, Options{})
			queued := e.newRequest(t, "alice")
			final := e.newRequest(t, "alice")
			decided := e.decide(t, final, "alice")
			bobs := e.newRequest(t, "bob")

			tests := []struct {
				name       string
				user       string // "" sends no token
				requestID  string
				wantStatus int
				wantBody   map[string]any
				wantCode   string
				wantPolls  float64 // ResultsDelivered{channel="poll"} increase
			}{
				{name: "owner, queued", user: "alice", requestID: queued, wantStatus: http.StatusOK,
					wantBody: map[string]any{"request_id": queued, "campaign_id": e.campaign, "status": "queued", "quantity": 1.0, "ahead": 0.0, "eta_ms": 0.0}},
				{name: "owner, final", user: "alice", requestID: final, wantStatus: http.StatusOK, wantPolls: 1,
					wantBody: map[string]any{"request_id": final, "campaign_id": e.campaign, "status": "success", "quantity": 1.0, "order_id": decided.OrderID}},
				{name: "other user's request", user: "alice", requestID: bobs, wantStatus: http.StatusNotFound, wantCode: "not_found"},
				{name: "unknown request", user: "alice", requestID: newRequestID(t, e.campaign), wantStatus: http.StatusNotFound, wantCode: "not_found"},
				{name: "malformed request id", user: "alice", requestID: "nope", wantStatus: http.StatusNotFound, wantCode: "not_found"},
				{name: "no token", requestID: queued, wantStatus: http.StatusUnauthorized, wantCode: "unauthorized"},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					before := counterValue(h.m.ResultsDelivered.WithLabelValues("poll"))
					status, body := mustGet(t, h, tt.user, "/api/v1/purchases/"+tt.requestID)
					checkAnswer(t, status, body, tt.wantStatus, tt.wantBody, tt.wantCode)
					if got := counterValue(h.m.ResultsDelivered.WithLabelValues("poll")) - before; got != tt.wantPolls {
						t.Errorf("got %v poll deliveries, want %v", got, tt.wantPolls)
					}
				})
			}
		})
	}
}

func TestPollStoreError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantCode   string
	}{
		{name: "unexpected error", err: errors.New("connection refused"), wantStatus: http.StatusInternalServerError, wantCode: "internal"},
		{name: "unavailable", err: model.ErrUnavailable, wantStatus: http.StatusServiceUnavailable, wantCode: "unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, f := fakeEnv(t)
			h := newHarness(t, f, Options{})
			id := e.newRequest(t, "alice")
			f.setFail(tt.err)
			status, body := mustGet(t, h, "alice", "/api/v1/purchases/"+id)
			if status != tt.wantStatus || body["code"] != tt.wantCode {
				t.Errorf("got %d %v, want %d %s", status, body["code"], tt.wantStatus, tt.wantCode)
			}
		})
	}
}

// mustGet sends an authenticated GET and decodes the JSON object answered.
func mustGet(t *testing.T, h *harness, user, path string) (int, map[string]any) {
	t.Helper()
	status, _, body := mustGetWithHeader(t, h, user, path)
	return status, body
}

// mustGetWithHeader is mustGet that also returns the response's header.
func mustGetWithHeader(t *testing.T, h *harness, user, path string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(mustContext(t), http.MethodGet, h.srv.URL+path, nil)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	if user != "" {
		req.Header.Set("Authorization", "Bearer "+h.token(t, user))
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", b, err)
	}
	return resp.StatusCode, resp.Header, body
}

// stoppedClock is a clock that moves only when told to.
type stoppedClock struct {
	mu sync.Mutex
	t  time.Time
}

func newStoppedClock() *stoppedClock { return &stoppedClock{t: time.Now()} }

func (c *stoppedClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *stoppedClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestPollLimits: a user flooding the poll endpoint costs a bounded number
// of stored-result reads, gets 429 rate_limited with Retry-After beyond its
// budget, and changes nothing; its final results are answered from memory;
// other users keep their own budget. The limits' clock is stopped, so the
// counts are exact.
func TestPollLimits(t *testing.T) {
	t.Parallel()
	const burst, flood = 5, 100
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			t.Parallel()
			e := impl.make(t)
			clock := newStoppedClock()
			h := newHarness(t, e.src, Options{PollRate: 1, PollBurst: burst, now: clock.now})
			queued := e.newRequest(t, "alice")
			final := e.newRequest(t, "alice")
			decided := e.decide(t, final, "alice")
			bobs := e.newRequest(t, "bob")

			// poll sends n polls as user and returns how many were answered
			// (200) and how many refused (429 rate_limited, Retry-After 1).
			poll := func(t *testing.T, user, id string, n int) (answered, refused int) {
				t.Helper()
				for i := range n {
					status, header, body := mustGetWithHeader(t, h, user, "/api/v1/purchases/"+id)
					switch {
					case status == http.StatusOK && body["request_id"] == id:
						answered++
					case status == http.StatusTooManyRequests && body["code"] == "rate_limited":
						refused++
						if got := header.Get("Retry-After"); got != "1" {
							t.Fatalf("poll %d: got Retry-After %q, want 1", i, got)
						}
					default:
						t.Fatalf("poll %d: got %d %v, want 200 or 429 rate_limited", i, status, body)
					}
				}
				return answered, refused
			}

			steps := []struct {
				name         string
				advance      time.Duration // the clock moves first
				user         string
				requestID    string
				polls        int
				wantAnswered int
				wantReads    int64
			}{
				{name: "final result flood: one read, then memory", user: "alice", requestID: final, polls: flood, wantAnswered: flood, wantReads: 1},
				{name: "the cached result expires: one more read", advance: resultCacheTTL, user: "alice", requestID: final, polls: flood, wantAnswered: flood, wantReads: 1},
				// The two reads of the final result took two tokens; the
				// second of clock time gave one back.
				{name: "queued result flood: the rest of the burst", user: "alice", requestID: queued, polls: flood, wantAnswered: burst - 1, wantReads: burst - 1},
				{name: "a second refills one poll", advance: time.Second, user: "alice", requestID: queued, polls: flood, wantAnswered: 1, wantReads: 1},
				{name: "other users keep their budget", user: "bob", requestID: bobs, polls: burst, wantAnswered: burst, wantReads: burst},
			}
			for _, st := range steps {
				t.Run(st.name, func(t *testing.T) {
					clock.advance(st.advance)
					before := e.reads()
					answered, refused := poll(t, st.user, st.requestID, st.polls)
					if answered != st.wantAnswered || refused != st.polls-st.wantAnswered {
						t.Errorf("got %d answered and %d refused, want %d and %d", answered, refused, st.wantAnswered, st.polls-st.wantAnswered)
					}
					if got := e.reads() - before; got != st.wantReads {
						t.Errorf("got %d stored-result reads, want %d", got, st.wantReads)
					}
				})
			}

			t.Run("refusals", func(t *testing.T) {
				tests := []struct {
					name       string
					user       string
					requestID  string
					wantStatus int
					wantCode   string
				}{
					{name: "over the budget", user: "alice", requestID: queued, wantStatus: http.StatusTooManyRequests, wantCode: "rate_limited"},
					{name: "over the budget, unknown id", user: "alice", requestID: newRequestID(t, e.campaign), wantStatus: http.StatusTooManyRequests, wantCode: "rate_limited"},
					// Only alice is answered from the cache: anyone else
					// takes the path of an unknown id.
					{name: "someone else's cached result", user: "mallory", requestID: final, wantStatus: http.StatusNotFound, wantCode: "not_found"},
				}
				for _, tt := range tests {
					t.Run(tt.name, func(t *testing.T) {
						status, body := mustGet(t, h, tt.user, "/api/v1/purchases/"+tt.requestID)
						if status != tt.wantStatus || body["code"] != tt.wantCode {
							t.Errorf("got %d %v, want %d %s", status, body["code"], tt.wantStatus, tt.wantCode)
						}
					})
				}
			})

			t.Run("nothing changed", func(t *testing.T) {
				for id, want := range map[string]model.Result{queued: {Status: model.StatusQueued}, final: decided} {
					r, err := e.src.Result(mustContext(t), id)
					if err != nil || r.Status != want.Status || r.OrderID != want.OrderID || r.UserID != "alice" {
						t.Errorf("stored %s: got %+v, %v; want alice's %s %s", id, r, err, want.Status, want.OrderID)
					}
				}
			})
		})
	}
}

// checkAnswer checks an HTTP answer's status, and its body or error code
// when the case names them.
func checkAnswer(t *testing.T, status int, body map[string]any, wantStatus int, wantBody map[string]any, wantCode string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("got status %d, want %d (body %v)", status, wantStatus, body)
	}
	if wantBody != nil && fmt.Sprint(body) != fmt.Sprint(wantBody) {
		t.Errorf("got body %v, want %v", body, wantBody)
	}
	if wantCode != "" && body["code"] != wantCode {
		t.Errorf("got code %v, want %s", body["code"], wantCode)
	}
}
