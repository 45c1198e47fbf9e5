// Command wsidle measures what idle subscribed WebSockets cost a notifier:
// it queues one purchase request per shopper in Redis (as the gateway would;
// no worker decides them, so the subscriptions stay), opens one WebSocket per
// shopper from this process, subscribes each to its request, and prints the
// notifier's RSS (from /proc) at each step and after the clients leave.
//
//	go build -o /tmp/flashsale ./cmd/flashsale
//	FLASHSALE_AUTH_JWT_SECRET=… FLASHSALE_HTTP_ADDR=127.0.0.1:18181 \
//	  FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP=20000 FLASHSALE_NOTIFIER_MAX_CONNS=19000 \
//	  /tmp/flashsale notifier --config configs/local.yaml &
//	go run ./.ci/wsidle --pid $! --url ws://127.0.0.1:18181 --secret … --counts 5000,10000,15000
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/model"
)

func main() {
	var o options
	flag.IntVar(&o.pid, "pid", 0, "the notifier's process id (RSS from /proc)")
	flag.StringVar(&o.url, "url", "ws://127.0.0.1:18181", "the notifier's base URL")
	flag.StringVar(&o.redis, "redis", "127.0.0.1:6379", "the notifier's Redis")
	flag.StringVar(&o.secret, "secret", os.Getenv("FLASHSALE_AUTH_JWT_SECRET"), "the shopper-token secret")
	counts := flag.String("counts", "5000,10000,15000", "connection counts to measure at")
	flag.DurationVar(&o.settle, "settle", 5*time.Second, "wait after each step before measuring")
	flag.DurationVar(&o.hold, "hold", 30*time.Second, "keep the connections this long after the last step")
	flag.DurationVar(&o.after, "after", 30*time.Second, "measure this long after the clients leave")
	flag.Parse()
	for _, s := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			log.Fatalf("counts: %v", err)
		}
		o.steps = append(o.steps, n)
	}
	if err := run(context.Background(), o); err != nil {
		log.Fatal(err)
	}
}

type options struct {
	pid                 int
	url, redis, secret  string
	steps               []int
	settle, hold, after time.Duration
}

func run(ctx context.Context, o options) error {
	total := o.steps[len(o.steps)-1]
	rdb := redis.NewClient(&redis.Options{Addr: o.redis})
	defer rdb.Close()
	st := store.New(rdb)
	campaign := "wsidle" + rand.Text()[:8]
	defer func() {
		if keys, _ := rdb.Keys(ctx, "*{"+campaign+"}*").Result(); len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	}()
	ids, err := queue(ctx, st, campaign, total)
	if err != nil {
		return err
	}
	jwt := auth.NewJWT([]byte(o.secret), 0)

	fmt.Printf("%-22s %10s %10s %12s %10s\n", "step", "conns", "RSS MB", "bytes/conn", "goroutines")
	base, err := rss(o.pid)
	if err != nil {
		return err
	}
	report := func(step string, n int) {
		r, _ := rss(o.pid)
		per := "-"
		if n > 0 {
			per = strconv.Itoa(int((r - base) / int64(n)))
		}
		fmt.Printf("%-22s %10d %10.1f %12s %10s\n", step, n, float64(r)/(1<<20), per, goroutines(o.url))
	}
	report("before", 0)
	conns := make([]*websocket.Conn, total)
	defer func() {
		for _, ws := range conns {
			if ws != nil {
				_ = ws.Close()
			}
		}
	}()
	open := 0
	for _, n := range o.steps {
		var next atomic.Int64
		next.Store(int64(open))
		var g errgroup.Group
		for range 64 {
			g.Go(func() error {
				for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
					ws, err := dial(o.url, jwt, i, ids[i])
					if err != nil {
						return err
					}
					conns[i] = ws
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		open = n
		time.Sleep(o.settle)
		pong(conns[:open])
		report(fmt.Sprintf("%d open", n), n)
	}
	for end := time.Now().Add(o.hold); time.Now().Before(end); time.Sleep(10 * time.Second) {
		pong(conns[:open])
	}
	report(fmt.Sprintf("after %v", o.hold), open)
	for i, ws := range conns {
		if ws != nil {
			_ = ws.Close()
			conns[i] = nil
		}
	}
	time.Sleep(o.settle)
	report("closed", 0)
	time.Sleep(o.after)
	report(fmt.Sprintf("closed +%v", o.after), 0)
	return nil
}

// queue admits one request per shopper in a new campaign, as the gateway
// would, and returns their ids.
func queue(ctx context.Context, st *store.Store, campaign string, n int) ([]string, error) {
	now := time.Now()
	c := model.Campaign{ID: campaign, Name: "wsidle", Stock: int64(n) * 2, PerUserLimit: 10,
		StartAt: now.Add(-time.Minute), EndAt: now.Add(time.Hour)}
	if _, err := st.Rebuild(ctx, c, nil); err != nil {
		return nil, fmt.Errorf("load campaign: %w", err)
	}
	ids := make([]string, n)
	for lo := 0; lo < n; lo += 1000 {
		var batch []model.AdmitRequest
		for i := lo; i < min(lo+1000, n); i++ {
			r := make([]byte, 16)
			_, _ = rand.Read(r)
			ids[i] = model.FormatRequestID(campaign, hex.EncodeToString(r))
			batch = append(batch, model.AdmitRequest{RequestID: ids[i], CampaignID: campaign, UserID: user(i), Quantity: 1})
		}
		replies, err := st.Admit(ctx, campaign, batch, model.RateLimits{})
		if err != nil {
			return nil, fmt.Errorf("admit: %w", err)
		}
		for _, r := range replies {
			if r.Code != model.Admitted {
				return nil, fmt.Errorf("admit: got %+v", r)
			}
		}
	}
	return ids, nil
}

func user(i int) string { return fmt.Sprintf("wsidle-%d", i) }

func dial(base string, jwt *auth.JWT, i int, id string) (*websocket.Conn, error) {
	tok, err := jwt.Mint(user(i), time.Hour)
	if err != nil {
		return nil, err
	}
	ws, resp, err := websocket.DefaultDialer.Dial(base+"/api/v1/ws?access_token="+tok, nil)
	if err != nil {
		if resp != nil {
			body, _ := io.ReadAll(resp.Body)
			return nil, fmt.Errorf("dial %d: %w: %s %s", i, err, resp.Status, body)
		}
		return nil, fmt.Errorf("dial %d: %w", i, err)
	}
	if err := ws.WriteJSON(map[string]any{"type": "subscribe", "request_ids": []string{id}}); err != nil {
		ws.Close()
		return nil, fmt.Errorf("subscribe %d: %w", i, err)
	}
	var f struct {
		Type string   `json:"type"`
		IDs  []string `json:"request_ids"`
	}
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := ws.ReadJSON(&f); err != nil || f.Type != "subscribed" || len(f.IDs) != 1 {
		ws.Close()
		return nil, fmt.Errorf("subscribe %d: got %+v (%v)", i, f, err)
	}
	return ws, nil
}

// pong keeps the clients alive as a browser would, without a goroutine per
// connection here: an unsolicited pong is a heartbeat.
func pong(conns []*websocket.Conn) {
	for _, ws := range conns {
		_ = ws.WriteControl(websocket.PongMessage, nil, time.Now().Add(time.Second))
	}
}

func rss(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for process %d", pid)
}

// goroutines reads go_goroutines from the notifier's /metrics.
func goroutines(base string) string {
	resp, err := http.Get("http" + strings.TrimPrefix(base, "ws") + "/metrics")
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "go_goroutines "); ok {
			return v
		}
	}
	return "?"
}
