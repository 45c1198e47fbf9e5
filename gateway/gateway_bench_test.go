package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/challenge"
	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue/redisstream"
)

// The benchmarks here run the purchase endpoint over real loopback HTTP, in
// process, on the test Redis, with the Redis-Streams publisher. The HTTP
// client shares the process and its two cores with the server, so compare
// them with BenchmarkHelloCeiling run the same way, not with other machines.

const benchSecret = "bench-jwt-secret-0123456789abcdef0123456789"

// memCampaigns is an in-memory Campaigns holding one campaign and no
// orders.
type memCampaigns struct {
	mu    sync.Mutex
	c     model.Campaign
	reads atomic.Int64 // Campaign and CampaignIDs calls: MySQL's reads
}

var _ Campaigns = (*memCampaigns)(nil)

func (m *memCampaigns) CreateCampaign(context.Context, model.Campaign) (model.Campaign, error) {
	return model.Campaign{}, model.ErrConflict
}

func (m *memCampaigns) Campaign(_ context.Context, id string) (model.Campaign, error) {
	m.reads.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if id != m.c.ID {
		return model.Campaign{}, model.ErrNotFound
	}
	return m.c, nil
}

func (m *memCampaigns) CampaignIDs(context.Context, int) ([]string, error) {
	m.reads.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	return []string{m.c.ID}, nil
}

func (m *memCampaigns) CampaignOrderStats(context.Context, string) (model.OrderStats, error) {
	return model.OrderStats{}, nil
}

func (m *memCampaigns) BumpEpoch(ctx context.Context, id string) (model.Campaign, []model.Order, error) {
	m.mu.Lock()
	m.c.Epoch++
	m.mu.Unlock()
	c, err := m.Campaign(ctx, id)
	return c, nil, err
}

func (m *memCampaigns) CampaignOrders(context.Context, string) ([]model.Order, error) {
	return nil, nil
}

func (m *memCampaigns) Refusals(context.Context, string) ([]model.Result, error) {
	return nil, nil
}

func (m *memCampaigns) SetPaused(ctx context.Context, id string, paused bool) (model.Campaign, error) {
	m.mu.Lock()
	m.c.Paused = paused
	m.mu.Unlock()
	return m.Campaign(ctx, id)
}

// The campaign management a benchmark never calls.
func (m *memCampaigns) CampaignPage(context.Context, model.CampaignState, time.Time, string, int) ([]model.Campaign, string, error) {
	return nil, "", nil
}

func (m *memCampaigns) OpenCampaigns(context.Context, time.Time, int) ([]model.Campaign, error) {
	return nil, nil
}

func (m *memCampaigns) ChangeCampaign(context.Context, string, func(model.Campaign) (model.Campaign, error)) (model.Campaign, error) {
	return model.Campaign{}, model.ErrConflict
}

func (m *memCampaigns) DeleteCampaign(context.Context, string, func(model.Campaign, int64) error) error {
	return model.ErrConflict
}

// mustLoad loads the campaign of m into st, as a first preload does.
func mustLoad(tb testing.TB, m *memCampaigns, st *store.Store) model.Campaign {
	tb.Helper()
	c, err := reconcile.Load(tb.Context(), m, st, m.c.ID)
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	return c
}

// benchGateway serves the shopper API of a Service on a preloaded campaign
// with stock units and returns its base URL and the campaign.
func benchGateway(b *testing.B, stock int64) (*Service, string, model.Campaign) {
	b.Helper()
	svc, e, c := benchEngine(b, stock)
	srv := httptest.NewServer(e)
	b.Cleanup(srv.Close)
	return svc, srv.URL, c
}

// benchEngine is benchGateway's Service and gin engine, not served.
func benchEngine(b *testing.B, stock int64) (*Service, *gin.Engine, model.Campaign) {
	b.Helper()
	return benchGatedEngine(b, stock, 0)
}

// benchGatedEngine is benchEngine with the proof-of-work gate configured
// and the campaign asking for bits (0: not gated).
func benchGatedEngine(b *testing.B, stock int64, bits int) (*Service, *gin.Engine, model.Campaign) {
	b.Helper()
	rdb := testenv.Redis(b)
	st := store.New(rdb)
	campaigns := &memCampaigns{c: model.Campaign{ID: testenv.Name(b, "bench"), Name: "bench", Stock: stock, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour), ChallengeBits: bits}}
	c := mustLoad(b, campaigns, st)
	topic := testenv.Topic(b)
	b.Cleanup(func() {
		ctx := context.Background()
		for _, pattern := range []string{"fs:{" + c.ID + "}*", "fsq:{" + topic + ":*"} {
			keys, _ := rdb.Keys(ctx, pattern).Result()
			for i := 0; i < len(keys); i += 1000 {
				_ = rdb.Del(ctx, keys[i:min(i+1000, len(keys))]...).Err()
			}
		}
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := metrics.New()
	// Limits on, but high: the limiter's work is part of the path measured.
	svc := New(log, st, campaigns, redisstream.New(rdb, redisstream.Options{}), m, Options{
		Topic: topic, RateLimits: model.RateLimits{UserRate: 1_000_000, UserBurst: 1_000_000, CampaignRate: 10_000_000, CampaignBurst: 10_000_000},
		Gate: challenge.NewPoW([]byte(benchSecret), time.Hour, nil),
	})
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.Use(m.GinMiddleware(), httpapi.CheckBody(log, 4096))
	NewHandlers(log, svc).RegisterShopper(e, httpapi.Shopper(log, auth.NewJWT([]byte(benchSecret), time.Second), false))
	return svc, e, c
}

// benchTokens mints tokens for n users.
func benchTokens(b *testing.B, n int) []string {
	b.Helper()
	j := auth.NewJWT([]byte(benchSecret), time.Second)
	out := make([]string, n)
	for i := range out {
		tok, err := j.Mint(fmt.Sprintf("shopper%d", i), time.Hour)
		if err != nil {
			b.Fatalf("mint: %v", err)
		}
		out[i] = tok
	}
	return out
}

func benchClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 512
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// runPurchases fires purchases from 64 goroutines per core and fails on
// any status but want.
func runPurchases(b *testing.B, url string, tokens []string, want int) {
	b.Helper()
	client := benchClient()
	var next atomic.Int64
	b.SetParallelism(64)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tok := tokens[int(next.Add(1))%len(tokens)]
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"quantity":1}`))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				b.Errorf("purchase: %v", err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != want {
				b.Errorf("purchase: got status %d, want %d", resp.StatusCode, want)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkAdmitPath: a purchase admitted through to a published message,
// every request answered 202: auth, validation, campaign cache, both rate limits,
// the queued marker and the publish, coalesced across concurrent requests.
func BenchmarkAdmitPath(b *testing.B) {
	_, url, c := benchGateway(b, model.MaxStock)
	runPurchases(b, url+"/api/v1/campaigns/"+c.ID+"/purchases", benchTokens(b, 1000), http.StatusAccepted)
}

// BenchmarkAdmitHandler is BenchmarkAdmitPath without the network: the gin
// engine called directly by 64 goroutines per core, so the handler's and
// the admit flush's own CPU and allocations show (the request and recorder
// httptest builds are counted too; compare trees, not absolute figures).
func BenchmarkAdmitHandler(b *testing.B) {
	_, e, c := benchEngine(b, model.MaxStock)
	path := "/api/v1/campaigns/" + c.ID + "/purchases"
	tokens := benchTokens(b, 256)
	var next atomic.Int64
	b.SetParallelism(64)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"quantity":1}`))
			req.Header.Set("Authorization", "Bearer "+tokens[int(next.Add(1))%len(tokens)])
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			e.ServeHTTP(w, req)
			if w.Code != http.StatusAccepted {
				b.Errorf("purchase: got status %d, want %d", w.Code, http.StatusAccepted)
				return
			}
		}
	})
}

// BenchmarkAdmitHandlerGate is BenchmarkAdmitHandler on a campaign without
// the gate (off) and with it (bits=N), so the pair shows what the gate adds
// to an admitted purchase: reading the header, Verify (one HMAC, one
// SHA-256) and spending the challenge (a key read and written in the
// batch's admit.lua call). The challenges are issued and solved before the
// clock starts, one per purchase, as a shopper's page would have done. Run
// the two interleaved (docs/BENCHMARKS.md, issue 17).
func BenchmarkAdmitHandlerGate(b *testing.B) {
	for _, bits := range []int{0, 4} {
		name := "off"
		if bits > 0 {
			name = fmt.Sprintf("bits=%d", bits)
		}
		b.Run(name, func(b *testing.B) {
			_, e, c := benchGatedEngine(b, model.MaxStock, bits)
			path := "/api/v1/campaigns/" + c.ID + "/purchases"
			users := 256
			tokens := benchTokens(b, users)
			var solutions []string
			if bits > 0 {
				solutions = benchSolutions(b, c, users, b.N)
			}
			var next atomic.Int64
			b.SetParallelism(64)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := int(next.Add(1)) - 1
					req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"quantity":1}`))
					req.Header.Set("Authorization", "Bearer "+tokens[i%users])
					req.Header.Set("Content-Type", "application/json")
					if solutions != nil {
						req.Header.Set(challengeHeader, solutions[i])
					}
					w := httptest.NewRecorder()
					e.ServeHTTP(w, req)
					if w.Code != http.StatusAccepted {
						b.Errorf("purchase: got status %d %s, want %d", w.Code, w.Body, http.StatusAccepted)
						return
					}
				}
			})
		})
	}
}

// benchSolutions issues and solves n challenges of c, the i-th for the
// user of benchTokens(b, users)[i%users], with the gate benchGatedEngine
// configures.
func benchSolutions(b *testing.B, c model.Campaign, users, n int) []string {
	b.Helper()
	gate := challenge.NewPoW([]byte(benchSecret), time.Hour, nil)
	out := make([]string, n)
	for i := range out {
		ch, err := gate.Challenge(fmt.Sprintf("shopper%d", i%users), c)
		if err != nil {
			b.Fatalf("challenge: %v", err)
		}
		if out[i], err = challenge.Solve(b.Context(), ch.Token, ch.Bits); err != nil {
			b.Fatalf("solve: %v", err)
		}
	}
	return out
}

// BenchmarkChallengeHandler is the GET a gated purchase needs first: auth,
// the campaign from the cache, a salt from crypto/rand, one HMAC and the
// JSON answer, by the gin engine called directly as in
// BenchmarkAdmitHandler.
func BenchmarkChallengeHandler(b *testing.B) {
	_, e, c := benchGatedEngine(b, model.MaxStock, 4)
	path := "/api/v1/campaigns/" + c.ID + "/challenge"
	tokens := benchTokens(b, 256)
	var next atomic.Int64
	b.SetParallelism(64)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.Header.Set("Authorization", "Bearer "+tokens[int(next.Add(1))%len(tokens)])
			w := httptest.NewRecorder()
			e.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				b.Errorf("challenge: got status %d, want %d", w.Code, http.StatusOK)
				return
			}
		}
	})
}

// BenchmarkSoldOutPath: a sold-out campaign is refused (410) from the
// in-memory flag, without Redis or the queue.
func BenchmarkSoldOutPath(b *testing.B) {
	svc, url, c := benchGateway(b, 1)
	sellOut(b, svc, c)
	runPurchases(b, url+"/api/v1/campaigns/"+c.ID+"/purchases", benchTokens(b, 1000), http.StatusGone)
}

// BenchmarkSoldOutHandler is BenchmarkSoldOutPath's refusal without the
// network: the gin engine called directly, one request after the other, so
// the handler's own cost and allocations show without the loopback's noise.
func BenchmarkSoldOutHandler(b *testing.B) {
	svc, e, c := benchEngine(b, 1)
	sellOut(b, svc, c)
	path, auth := "/api/v1/campaigns/"+c.ID+"/purchases", "Bearer "+benchTokens(b, 1)[0]
	body := strings.NewReader("")
	for b.Loop() {
		body.Reset(`{"quantity":1}`)
		req := httptest.NewRequest(http.MethodPost, path, body)
		req.Header.Set("Authorization", auth)
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		if w.Code != http.StatusGone {
			b.Fatalf("purchase: got status %d, want %d", w.Code, http.StatusGone)
		}
	}
}

// sellOut sells c's only unit, so purchases see it sold out.
func sellOut(b *testing.B, svc *Service, c model.Campaign) {
	b.Helper()
	if _, err := svc.stock.(*store.Store).Deduct(b.Context(), c.ID, []model.Deduction{{
		RequestID: model.FormatRequestID(c.ID, strings.Repeat("0", 32)), UserID: "first", Quantity: 1, OrderID: "o1",
	}}); err != nil {
		b.Fatalf("sell the only unit: %v", err)
	}
}

// BenchmarkHelloCeiling is a bare gin handler served and called the same
// way: the ceiling the two benchmarks above are measured against.
func BenchmarkHelloCeiling(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.POST("/hello", func(c *gin.Context) { c.String(http.StatusOK, "hello") })
	srv := httptest.NewServer(e)
	b.Cleanup(srv.Close)
	runPurchases(b, srv.URL+"/hello", []string{"unused"}, http.StatusOK)
}
