package notifier

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// BenchmarkRecheckIdle measures a re-check tick while subscriptions wait and
// none is due, what an idle notifier pays every RecheckInterval: it should
// not grow with the number waiting.
func BenchmarkRecheckIdle(b *testing.B) {
	for _, waiting := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) {
			n := New(slog.New(slog.DiscardHandler), newFakeSource(), metrics.New(), Options{})
			ids := make([]string, waiting)
			for i := range ids {
				ids[i] = fmt.Sprintf("r%d", i)
			}
			added, _, _ := n.hub.add(newConn(nil, "alice", 1), ids, waiting)
			now := time.Now()
			for _, s := range added {
				n.hub.activate(s, model.Result{Status: model.StatusQueued}, now)
			}
			cutoff := now.Add(-n.opts.RecheckInterval)
			for b.Loop() {
				n.recheck(b.Context(), cutoff)
			}
		})
	}
}

// BenchmarkSubscribeFrame measures one subscribe frame of N request ids over
// a WebSocket, on Redis. Every id is final and the caller's, so the frame is
// answered with the acknowledgement and N results, and its subscriptions end
// (the next frame makes them again). round-trips/op counts the stored-result
// reads sent to Redis.
func BenchmarkSubscribeFrame(b *testing.B) {
	for _, size := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("ids=%d", size), func(b *testing.B) {
			rdb := testenv.Redis(b)
			st := store.New(rdb)
			campaign := testenv.Name(b, "nb_")
			now := time.Now()
			c := model.Campaign{ID: campaign, Name: "notifier bench", Stock: int64(size), PerUserLimit: int64(size),
				StartAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}
			if _, err := st.Rebuild(b.Context(), c, nil, nil); err != nil {
				b.Fatalf("load: %v", err)
			}
			ids := make([]string, size)
			admits := make([]model.AdmitRequest, size)
			deductions := make([]model.Deduction, size)
			for i := range ids {
				ids[i] = newRequestID(b, campaign)
				admits[i] = model.AdmitRequest{RequestID: ids[i], CampaignID: campaign, UserID: "alice", Quantity: 1}
				deductions[i] = model.Deduction{RequestID: ids[i], UserID: "alice", Quantity: 1, OrderID: fmt.Sprintf("o%d", i)}
			}
			if _, err := st.Admit(b.Context(), campaign, admits, model.RateLimits{}); err != nil {
				b.Fatalf("admit: %v", err)
			}
			reply, err := st.Deduct(b.Context(), campaign, deductions)
			if err == nil {
				err = st.MarkDurable(b.Context(), campaign, reply.Made, reply.Epoch)
			}
			if err != nil {
				b.Fatalf("deduct: %v", err)
			}
			reads := &resultReads{}
			rdb.AddHook(reads)
			h := newHarness(b, st, Options{MaxSubscriptionsPerConn: size, SubscribeRate: 1 << 30, SubscribeBurst: 1 << 30,
				ReadLimit: 1 << 20, SendBuffer: size + 1, RecheckInterval: time.Hour})
			ws := mustDial(b, h, "alice")
			frame := subscribeFrame(ids...)
			frames := 0
			for b.Loop() {
				mustSend(b, ws, websocket.TextMessage, frame)
				for range size + 1 {
					if f := mustRead(b, ws); f.Type == "error" {
						b.Fatalf("got %+v, want the acknowledgement and results", f)
					}
				}
				frames++
			}
			b.ReportMetric(float64(reads.trips.Load())/float64(frames), "round-trips/op")
		})
	}
}
