package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

const (
	testJWTSecret     = "test-jwt-secret-0123456789abcdef0123456789"
	testAdminToken    = "test-admin-token"
	testWebhookSecret = "test-webhook-secret-0123456789abcdef01234"
)

// realConfig returns a config on the test Redis and a fresh MySQL database,
// with a unique queue topic and a random port.
func realConfig(t *testing.T, queueDriver string) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.Auth = config.Auth{JWTSecret: testJWTSecret, JWTLeeway: 5 * time.Second, AdminToken: testAdminToken,
		AdminFailuresPerMinute: cfg.Auth.AdminFailuresPerMinute, MaxTokenLifetime: cfg.Auth.MaxTokenLifetime}
	cfg.Payment.WebhookSecret = testWebhookSecret
	cfg.Redis.Mode, cfg.Redis.Addr = "server", testenv.RedisAddr(t)
	cfg.Database.Driver, cfg.Database.DSN = "mysql", testenv.MySQLDSN(t)
	cfg.Queue.Driver, cfg.Queue.Topic = queueDriver, testenv.Topic(t)
	cfg.Queue.ExpiryTopic = cfg.Queue.Topic + "-expiry"
	cfg.Notifier.AllowedOrigins = []string{"*"}
	// Every simulated shopper is 127.0.0.1: the per-address budgets
	// (sockets, connections, polls, subscribes) are raised, as
	// docs/OPERATIONS.md tells an operator load-testing from one host.
	// TestConnectionFloodKeepsServiceUp and the notifier's and httpapi's
	// own tests hold the defaults to their bounds.
	cfg.Notifier.MaxConnsPerIP = 1 << 20
	cfg.Log.Level = "warn"
	// A fault test whose publish had an unknown outcome and stored nothing
	// still settles within a minute (the not-enqueued sweep rejects the
	// request), and
	// the delay still covers a RocketMQ broker restart's rebalance (20 s).
	cfg.Worker.MaxQueueDelay = 30 * time.Second
	// The fault tests hold the refuse mode to its guarantees (503 while
	// Redis is out); degraded_test.go sets the default, mysql, and holds
	// the degraded mode to the same.
	cfg.Degrade = config.DegradeRefuse
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	return cfg
}

// client talks to a running system over real HTTP.
type client struct {
	t     testing.TB
	db    config.Database
	admin string
	base  string
	http  *http.Client
	jwt   *auth.JWT
}

func startSystem(t *testing.T, cfg config.Config) *client {
	t.Helper()
	return startSystemWith(t, cfg, nil)
}

// startSystemWith is startSystem with the queue publisher wrapped (faults).
func startSystemWith(t *testing.T, cfg config.Config, wrap func(queue.Publisher) queue.Publisher) *client {
	t.Helper()
	var opts []startOption
	if wrap != nil {
		opts = append(opts, func(o *startOptions) { o.wrapPublisher = wrap })
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	sys, err := start(ctx, cfg, log, roleSet{gateway: true, worker: true, notifier: true}, opts...)
	if err != nil {
		cancel()
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := sys.Wait(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	c := newClient(t, "http://"+sys.Addr(), cfg.Auth)
	c.db = cfg.Database
	return c
}

// campaignOrders reads the campaign's orders straight from the database.
func (c *client) campaignOrders(campaign string) []model.Order {
	c.t.Helper()
	db, err := sqlstore.Open(context.Background(), c.db.Driver, c.db.DSN)
	if err != nil {
		c.t.Fatalf("open db: %v", err)
	}
	defer db.Close()
	orders, err := db.CampaignOrders(context.Background(), campaign)
	if err != nil {
		c.t.Fatalf("orders: %v", err)
	}
	return orders
}

// ordersInDB reads the campaign's orders straight from the database:
// request id -> order id.
func (c *client) ordersInDB(campaign string) map[string]string {
	c.t.Helper()
	out := map[string]string{}
	for _, o := range c.campaignOrders(campaign) {
		if _, dup := out[o.RequestID]; dup {
			c.t.Errorf("request %s has two orders", o.RequestID)
		}
		out[o.RequestID] = o.ID
	}
	return out
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func newClient(t testing.TB, base string, a config.Auth) *client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	tr.MaxConnsPerHost = 256
	return &client{t: t, base: base, http: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		jwt: auth.NewJWT([]byte(a.JWTSecret), a.JWTLeeway), admin: a.AdminToken}
}

func (c *client) token(user string) string {
	c.t.Helper()
	tok, err := c.jwt.Mint(user, time.Hour)
	if err != nil {
		c.t.Fatalf("mint token: %v", err)
	}
	return tok
}

// do sends a request and decodes a JSON answer into out (if not nil).
func (c *client) do(method, path, bearer string, body any, header map[string]string, out any) int {
	c.t.Helper()
	code, _ := c.send(method, path, bearer, body, header, out)
	return code
}

// chunked is a request body sent without a length (Transfer-Encoding:
// chunked).
type chunked string

// send is do that returns the response's header too. The body is sent as
// application/json unless header says otherwise ("" removes a header).
func (c *client) send(method, path, bearer string, body any, header map[string]string, out any) (int, http.Header) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case chunked:
		rd = io.MultiReader(strings.NewReader(string(b))) // hides the length from net/http
	default:
		buf, _ := json.Marshal(b)
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatalf("new request: %v", err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Errorf("%s %s: %v", method, path, err)
		return 0, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			c.t.Errorf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode, resp.Header
}

type campaignBody struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	Stock         int64     `json:"stock"`
	PerUserLimit  int64     `json:"per_user_limit"`
	Price         int64     `json:"price,omitempty"`
	PaymentWindow string    `json:"payment_window,omitempty"`
	StartAt       time.Time `json:"start_at"`
	EndAt         time.Time `json:"end_at"`
	ChallengeBits int       `json:"challenge_bits,omitempty"`
	Buckets       int       `json:"buckets,omitempty"`
}

// openCampaign creates and preloads a campaign whose sale is open.
func (c *client) openCampaign(id string, stock, limit int64) {
	c.t.Helper()
	c.openCampaignOf(campaignBody{ID: id, Name: "Test " + id, Stock: stock, PerUserLimit: limit,
		StartAt: time.Now().Add(-time.Second), EndAt: time.Now().Add(time.Hour)})
}

// openCampaignOf creates and preloads the campaign body describes.
func (c *client) openCampaignOf(body campaignBody) {
	c.t.Helper()
	id := body.ID
	if code := c.do("POST", "/admin/v1/campaigns", c.admin, body, nil, nil); code != http.StatusCreated {
		c.t.Fatalf("create campaign: got %d, want 201", code)
	}
	if code := c.do("POST", "/admin/v1/campaigns/"+id+"/preload", c.admin, nil, nil, nil); code != http.StatusOK {
		c.t.Fatalf("preload: got %d, want 200", code)
	}
}

type statsBody struct {
	Stock            int64            `json:"stock"`
	Remaining        int64            `json:"remaining"`
	Sold             int64            `json:"sold"`
	SoldOut          bool             `json:"sold_out"`
	Preloaded        bool             `json:"preloaded"`
	Admitted         int64            `json:"admitted"`
	Queued           int64            `json:"queued"`
	FinishedByStatus map[string]int64 `json:"finished_by_status"`
	OrdersInDB       int64            `json:"orders_in_db"`
	UnitsInDB        int64            `json:"units_in_db"`
	DecidedIn        string           `json:"decided_in"`
}

func (c *client) stats(id string) statsBody {
	c.t.Helper()
	var st statsBody
	if code := c.do("GET", "/admin/v1/campaigns/"+id+"/stats", c.admin, nil, nil, &st); code != http.StatusOK {
		c.t.Fatalf("stats: got %d, want 200", code)
	}
	return st
}

// shopUntilSold has users shoppers (s0000, s0001, …) shop, 16 at a time,
// and returns once sold units of the campaign are sold: a sale in
// progress, for a fault to strike. Wait on the group for the shoppers.
func (c *client) shopUntilSold(campaign string, users int, sold int64, shop func(user string)) *sync.WaitGroup {
	c.t.Helper()
	var wg sync.WaitGroup
	next := make(chan string)
	for range 16 {
		wg.Go(func() {
			for user := range next {
				shop(user)
			}
		})
	}
	go func() {
		for i := range users {
			next <- fmt.Sprintf("s%04d", i)
		}
		close(next)
	}()
	testenv.Eventually(c.t, time.Minute, fmt.Sprintf("%d units sold", sold), func() (bool, string) {
		n := c.stats(campaign).Sold
		return n >= sold, fmt.Sprintf("%d sold", n)
	})
	return &wg
}

// settle waits until no admitted request of the campaign is still queued and
// MySQL holds every unit sold: a result is final (and visible to shoppers) as
// soon as the Lua call decides it, a moment before the worker's INSERT lands.
func (c *client) settle(id string, timeout time.Duration) statsBody {
	c.t.Helper()
	var st statsBody
	testenv.Eventually(c.t, timeout, id+" settled", func() (bool, string) {
		st = c.stats(id)
		return st.Queued == 0 && st.UnitsInDB == st.Sold, fmt.Sprintf("%+v", st)
	})
	return st
}

type purchaseBody struct {
	RequestID string `json:"request_id"`
	Status    string `json:"status"`
	OrderID   string `json:"order_id"`
	Reason    string `json:"reason"`
	PollURL   string `json:"poll_url"`
	WSURL     string `json:"ws_url"`
	Code      string `json:"code"`
}

type resultBody struct {
	RequestID  string `json:"request_id"`
	CampaignID string `json:"campaign_id"`
	UserID     string `json:"user_id"`
	Status     string `json:"status"`
	OrderID    string `json:"order_id"`
	Reason     string `json:"reason"`
	Quantity   int64  `json:"quantity"`
	Code       string `json:"code"`
}

func (c *client) poll(user, rid string) (int, resultBody) {
	// A 429 (the notifier's per-user poll limit: a test polls many
	// requests of one shopper in a row) is waited out as a browser does,
	// by its Retry-After.
	for tries := 1; ; tries++ {
		var r resultBody
		code, h := c.send("GET", "/api/v1/purchases/"+rid, c.token(user), nil, nil, &r)
		secs, err := strconv.Atoi(h.Get("Retry-After"))
		if code != http.StatusTooManyRequests || err != nil || tries == 5 {
			return code, r
		}
		time.Sleep(time.Duration(max(secs, 1)) * time.Second)
	}
}

// pollDecided polls rid until it reads other than queued, for at most 10
// s: a decided success reads queued until its order is in MySQL and the
// worker raised the durable mark after it, a moment after the stats (and
// MySQL) count it.
func (c *client) pollDecided(user, rid string) (int, resultBody) {
	for end := time.Now().Add(10 * time.Second); ; {
		code, r := c.poll(user, rid)
		if code != http.StatusOK || r.Status != "queued" || time.Now().After(end) {
			return code, r
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wsResult subscribes to rid over WebSocket and waits for its pushed result.
func (c *client) wsResult(user, rid string, timeout time.Duration) (resultBody, error) {
	u, _ := url.Parse(c.base)
	u.Scheme = "ws"
	u.Path = "/api/v1/ws"
	u.RawQuery = "access_token=" + url.QueryEscape(c.token(user))
	conn, _, err := websocket.DefaultDialer.Dial(u.String(), nil)
	if err != nil {
		return resultBody{}, fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	if err := conn.WriteJSON(map[string]any{"type": "subscribe", "request_ids": []string{rid}}); err != nil {
		return resultBody{}, fmt.Errorf("subscribe: %w", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(timeout))
	for {
		var msg struct {
			Type   string     `json:"type"`
			Code   string     `json:"code"`
			Result resultBody `json:"result"`
		}
		if err := conn.ReadJSON(&msg); err != nil {
			return resultBody{}, fmt.Errorf("read: %w", err)
		}
		switch msg.Type {
		case "result":
			return msg.Result, nil
		case "error":
			return resultBody{}, fmt.Errorf("ws error %s", msg.Code)
		}
	}
}
