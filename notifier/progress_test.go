package notifier

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// progressLog collects what one WebSocket receives, by request id.
type progressLog struct {
	mu sync.Mutex
	// aheads are the progress frames' counts, in arrival order; result is
	// set by the result frame, and late counts progress frames after it.
	aheads map[string][]int64
	etas   map[string][]int64
	result map[string]bool
	late   map[string]int
	err    error
}

func (l *progressLog) last(id string) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.aheads[id]
	if len(a) == 0 {
		return 0, false
	}
	return a[len(a)-1], true
}

// TestQueuePosition: requests wait with no worker; as a worker decides them
// one by one, each waiting request's ahead counts down to 0, by poll and by
// progress frames, never below 0 and never up, and no progress frame
// follows a result frame.
func TestQueuePosition(t *testing.T) {
	t.Parallel()
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			e := impl.make(t)
			h := newHarness(t, e.src, Options{ProgressInterval: 20 * time.Millisecond, PollRate: 1000, PollBurst: 1000})
			const n = 5
			ids := make([]string, n)
			for i := range ids {
				ids[i] = e.newRequest(t, "alice")
			}
			ws := mustDial(t, h, "alice")
			if got, errs := mustSubscribe(t, ws, ids...); len(got) != n || len(errs) != 0 {
				t.Fatalf("subscribed %v, errors %v; want all %d", got, errs, n)
			}
			log := &progressLog{aheads: map[string][]int64{}, etas: map[string][]int64{}, result: map[string]bool{}, late: map[string]int{}}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					_, data, err := ws.ReadMessage()
					var f struct {
						Type      string          `json:"type"`
						RequestID string          `json:"request_id"`
						Ahead     *int64          `json:"ahead"`
						ETAMs     *int64          `json:"eta_ms"`
						Result    json.RawMessage `json:"result"`
					}
					if err == nil {
						err = json.Unmarshal(data, &f)
					}
					log.mu.Lock()
					switch {
					case err != nil:
						log.err = err
					case f.Type == "progress" && (f.Ahead == nil || f.ETAMs == nil):
						log.err = fmt.Errorf("progress frame without ahead or eta_ms: %s", data)
					case f.Type == "progress" && log.result[f.RequestID]:
						log.late[f.RequestID]++
					case f.Type == "progress":
						log.aheads[f.RequestID] = append(log.aheads[f.RequestID], *f.Ahead)
						log.etas[f.RequestID] = append(log.etas[f.RequestID], *f.ETAMs)
					case f.Type == "result":
						var r wsResult
						_ = json.Unmarshal(f.Result, &r)
						log.result[r.RequestID] = true
					}
					log.mu.Unlock()
					if err != nil {
						return
					}
				}
			}()

			polled := make([]int64, n)
			for i := range polled {
				polled[i] = int64(n)
			}
			for k := 0; k <= n; k++ {
				// k requests decided: request j (j >= k) has j-k before it.
				for j := k; j < n; j++ {
					want := int64(j - k)
					testenv.Eventually(t, 5*time.Second, fmt.Sprintf("request %d: ahead %d by poll and frame", j, want), func() (bool, string) {
						status, body := mustGet(t, h, "alice", "/api/v1/purchases/"+ids[j])
						ahead, ok1 := body["ahead"].(float64)
						eta, ok2 := body["eta_ms"].(float64)
						if status != 200 || body["status"] != "queued" || !ok1 || !ok2 {
							t.Fatalf("request %d: got %d %v, want queued with ahead and eta_ms", j, status, body)
						}
						if ahead < 0 || int64(ahead) > polled[j] || eta < 0 {
							t.Fatalf("request %d: polled ahead %v (eta %v) after %d, want 0..%d", j, ahead, eta, polled[j], polled[j])
						}
						// A fresh read (a cached one may predate the decisions).
						if k > 0 && want > 0 && int64(ahead) == want && eta == 0 {
							t.Errorf("request %d: polled eta_ms 0 with %v ahead after %d decisions, want > 0", j, ahead, k)
						}
						polled[j] = int64(ahead)
						framed, ok := log.last(ids[j])
						return int64(ahead) == want && ok && framed == want,
							fmt.Sprintf("polled %v, last frame %d (%v)", ahead, framed, ok)
					})
				}
				if k == n {
					break
				}
				r := e.decide(t, ids[k], "alice")
				e.publish(t, r)
				status, body := mustGet(t, h, "alice", "/api/v1/purchases/"+ids[k])
				if _, ok := body["ahead"]; status != 200 || ok || body["eta_ms"] != nil {
					t.Errorf("request %d decided: got %d %v, want no ahead or eta_ms", k, status, body)
				}
			}
			testenv.Eventually(t, 5*time.Second, "every result frame", func() (bool, string) {
				log.mu.Lock()
				defer log.mu.Unlock()
				return len(log.result) == n, fmt.Sprintf("%d results", len(log.result))
			})
			// A few more ticks, in which nothing may come.
			time.Sleep(5 * h.n.opts.ProgressInterval)
			_ = ws.Close()
			<-done
			log.mu.Lock()
			defer log.mu.Unlock()
			for j, id := range ids {
				if log.late[id] > 0 {
					t.Errorf("request %d: %d progress frames after its result", j, log.late[id])
				}
				a := log.aheads[id]
				for i := 1; i < len(a); i++ {
					if a[i] > a[i-1] || a[i] < 0 {
						t.Errorf("request %d: ahead went %v, want never up, never below 0", j, a)
						break
					}
				}
				if len(a) == 0 || a[len(a)-1] != 0 {
					t.Errorf("request %d: ahead went %v, want down to 0", j, a)
				}
			}
		})
	}
}

// TestProgressQuietWhileNothingMoves: a waiting request gets a progress
// frame once subscribed and then only when its count moves, so an idle
// crowd is not woken every second.
func TestProgressQuietWhileNothingMoves(t *testing.T) {
	t.Parallel()
	e := envs[0].make(t)
	h := newHarness(t, e.src, Options{ProgressInterval: 10 * time.Millisecond})
	first, second := e.newRequest(t, "alice"), e.newRequest(t, "alice")
	ws := mustDial(t, h, "alice")
	if got, errs := mustSubscribe(t, ws, first, second); len(got) != 2 || len(errs) != 0 {
		t.Fatalf("subscribed %v, errors %v; want both", got, errs)
	}
	frames := make(chan wsFrame, 100)
	go func() {
		defer close(frames)
		for {
			var f wsFrame
			if err := ws.ReadJSON(&f); err != nil {
				return
			}
			frames <- f
		}
	}()
	next := func(what string) wsFrame {
		t.Helper()
		select {
		case f := <-frames:
			return f
		case <-time.After(10 * time.Second):
			t.Fatalf("no frame: want %s", what)
		}
		return wsFrame{}
	}
	got := map[string]bool{}
	for range 2 {
		f := next("a first progress frame per request")
		if f.Type != "progress" {
			t.Fatalf("got %+v, want a progress frame", f)
		}
		got[f.RequestID] = true
	}
	if !got[first] || !got[second] {
		t.Fatalf("first progress frames for %v, want both requests", got)
	}
	rounds := h.n.progressRounds.Load()
	testenv.Eventually(t, 10*time.Second, "ten more progress rounds", func() (bool, string) {
		return h.n.progressRounds.Load() >= rounds+10, fmt.Sprintf("%d rounds", h.n.progressRounds.Load()-rounds)
	})
	select {
	case f := <-frames:
		t.Fatalf("got %+v while nothing moved, want no frame", f)
	default:
	}
	e.decide(t, first, "alice") // decided, not published: only the count moves
	if f := next("the second request's count moving"); f.Type != "progress" || f.RequestID != second {
		t.Fatalf("got %+v, want a progress frame for %s", f, second)
	}
}

// TestProgressSourceContract: every ResultSource numbers its campaign's
// admitted requests and reports the highest decided one.
func TestProgressSourceContract(t *testing.T) {
	t.Parallel()
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			e := impl.make(t)
			a, b, c := e.newRequest(t, "alice"), e.newRequest(t, "bob"), e.newRequest(t, "carol")
			e.decide(t, b, "bob")
			got, err := e.src.Results(mustContext(t), []string{a, c})
			if err != nil {
				t.Fatal(err)
			}
			if got[0].Seq < 1 || got[1].Seq != got[0].Seq+2 {
				t.Fatalf("got sequence numbers %d and %d, want n and n+2", got[0].Seq, got[1].Seq)
			}
			ps, err := e.src.Progress(mustContext(t), []string{e.campaign, "other"})
			if err != nil {
				t.Fatal(err)
			}
			if want := got[0].Seq + 1; ps[0].Decided != want || ps[0].Rate <= 0 {
				t.Errorf("got %+v, want decided %d at a rate > 0", ps[0], want)
			}
			if ps[1] != (model.QueueProgress{}) {
				t.Errorf("campaign without decisions: got %+v, want zero", ps[1])
			}
			if ahead := ps[0].Ahead(got[1].Seq); ahead != 0 {
				t.Errorf("got ahead %d of the last request, want 0", ahead)
			}
		})
	}
}
