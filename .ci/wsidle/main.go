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
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/model"
)

func main() {
	var (
		pid      = flag.Int("pid", 0, "the notifier's process id (RSS from /proc)")
		url      = flag.String("url", "ws://127.0.0.1:18181", "the notifier's base URL")
		redisURL = flag.String("redis", "127.0.0.1:6379", "the notifier's Redis")
		secret   = flag.String("secret", os.Getenv("FLASHSALE_AUTH_JWT_SECRET"), "the shopper-token secret")
		counts   = flag.String("counts", "5000,10000,15000", "connection counts to measure at")
		settle   = flag.Duration("settle", 5*time.Second, "wait after each step before measuring")
		hold     = flag.Duration("hold", 30*time.Second, "keep the connections this long after the last step")
		after    = flag.Duration("after", 30*time.Second, "measure this long after the clients leave")
	)
	flag.Parse()
	var steps []int
	for _, s := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			log.Fatalf("counts: %v", err)
		}
		steps = append(steps, n)
	}
	total := steps[len(steps)-1]
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *redisURL})
	st := store.New(rdb)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	campaign := "wsidle" + hex.EncodeToString(b)
	defer func() {
		keys, _ := rdb.Keys(ctx, "*{"+campaign+"}*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	}()
	now := time.Now()
	c := model.Campaign{ID: campaign, Name: "wsidle", Stock: int64(total) * 2, PerUserLimit: 10,
		StartAt: now.Add(-time.Minute), EndAt: now.Add(time.Hour)}
	if _, err := st.Rebuild(ctx, c, nil); err != nil {
		log.Fatalf("load campaign: %v", err)
	}
	ids := make([]string, total)
	for lo := 0; lo < total; lo += 1000 {
		var batch []model.AdmitRequest
		for i := lo; i < min(lo+1000, total); i++ {
			_, _ = rand.Read(b)
			r := make([]byte, 16)
			_, _ = rand.Read(r)
			ids[i] = model.FormatRequestID(campaign, hex.EncodeToString(r))
			batch = append(batch, model.AdmitRequest{RequestID: ids[i], CampaignID: campaign, UserID: user(i), Quantity: 1})
		}
		replies, err := st.Admit(ctx, campaign, batch, model.RateLimits{})
		if err != nil {
			log.Fatalf("admit: %v", err)
		}
		for _, r := range replies {
			if r.Code != model.Admitted {
				log.Fatalf("admit: got %+v", r)
			}
		}
	}
	jwt := auth.NewJWT([]byte(*secret), 0)

	fmt.Printf("%-22s %10s %10s %12s %10s\n", "step", "conns", "RSS MB", "bytes/conn", "goroutines")
	base := rss(*pid)
	report := func(step string, n int) {
		r := rss(*pid)
		per := "-"
		if n > 0 {
			per = strconv.Itoa(int((r - base) / int64(n)))
		}
		fmt.Printf("%-22s %10d %10.1f %12s %10s\n", step, n, float64(r)/(1<<20), per, goroutines(*url))
	}
	report("before", 0)
	conns := make([]*websocket.Conn, 0, total)
	var mu sync.Mutex
	for _, n := range steps {
		var next atomic.Int64
		next.Store(int64(len(conns)))
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= n {
						return
					}
					ws := dial(*url, jwt, i, ids[i])
					mu.Lock()
					conns = append(conns, ws)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		time.Sleep(*settle)
		pong(conns)
		report(fmt.Sprintf("%d open", n), n)
	}
	for end := time.Now().Add(*hold); time.Now().Before(end); time.Sleep(10 * time.Second) {
		pong(conns)
	}
	report(fmt.Sprintf("after %v", *hold), len(conns))
	for _, ws := range conns {
		_ = ws.Close()
	}
	time.Sleep(*settle)
	report("closed", 0)
	time.Sleep(*after)
	report(fmt.Sprintf("closed +%v", *after), 0)
}

func user(i int) string { return fmt.Sprintf("wsidle-%d", i) }

func dial(base string, jwt *auth.JWT, i int, id string) *websocket.Conn {
	tok, err := jwt.Mint(user(i), time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	ws, resp, err := websocket.DefaultDialer.Dial(base+"/api/v1/ws?access_token="+tok, nil)
	if err != nil {
		if resp != nil {
			body, _ := io.ReadAll(resp.Body)
			log.Fatalf("dial %d: %v: %s %s", i, err, resp.Status, body)
		}
		log.Fatalf("dial %d: %v", i, err)
	}
	if err := ws.WriteJSON(map[string]any{"type": "subscribe", "request_ids": []string{id}}); err != nil {
		log.Fatalf("subscribe %d: %v", i, err)
	}
	var f struct {
		Type string   `json:"type"`
		IDs  []string `json:"request_ids"`
	}
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := ws.ReadJSON(&f); err != nil || f.Type != "subscribed" || len(f.IDs) != 1 {
		log.Fatalf("subscribe %d: got %+v (%v)", i, f, err)
	}
	return ws
}

// pong keeps the clients alive as a browser would, without a goroutine per
// connection here: an unsolicited pong is a heartbeat.
func pong(conns []*websocket.Conn) {
	for _, ws := range conns {
		_ = ws.WriteControl(websocket.PongMessage, nil, time.Now().Add(time.Second))
	}
}

func rss(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
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
