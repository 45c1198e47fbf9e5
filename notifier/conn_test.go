package notifier

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/testenv"
)

// maskedFrame builds a whole masked client frame, as a browser sends it.
func maskedFrame(fin bool, op int, payload []byte) []byte {
	b0 := byte(op)
	if fin {
		b0 |= finBit
	}
	f := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		f = append(f, maskBit|byte(n))
	case n <= 0xffff:
		f = append(f, maskBit|126)
		f = binary.BigEndian.AppendUint16(f, uint16(n))
	default:
		f = append(f, maskBit|127)
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	}
	key := []byte{0x5a, 0x13, 0xc7, 0x81}
	f = append(f, key...)
	for i, b := range payload {
		f = append(f, b^key[i%4])
	}
	return f
}

// mustWriteRaw writes bytes to the client's socket, bypassing gorilla.
func mustWriteRaw(t *testing.T, ws *websocket.Conn, b []byte) {
	t.Helper()
	_ = ws.NetConn().SetWriteDeadline(time.Now().Add(3 * time.Second))
	if _, err := ws.NetConn().Write(b); err != nil {
		t.Fatalf("write %d bytes: %v", len(b), err)
	}
}

// mustReadClosed reads until the server ends the connection and returns the
// error that ended it; a read timeout fails the test.
func mustReadClosed(t *testing.T, ws *websocket.Conn, within time.Duration) error {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(within))
	for {
		_, _, err := ws.ReadMessage()
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection still open after %v", within)
		}
		return err
	}
}

// TestWSIdleConnectionsHoldNoGoroutine: subscribed connections whose clients
// only send pongs stay open past the silence limit, and hold no goroutine
// while they wait (the old design held two each). Not parallel: it counts
// the process's goroutines.
func TestWSIdleConnectionsHoldNoGoroutine(t *testing.T) {
	const conns = 100
	const interval = time.Second
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{PingInterval: interval, MaxConnsPerIP: conns})
	runtime.GC()
	before := runtime.NumGoroutine()
	ids := make([]string, conns)
	clients := make([]*websocket.Conn, conns)
	for i := range clients {
		user := fmt.Sprintf("idle%d", i)
		ids[i] = e.newRequest(t, user)
		clients[i] = mustDial(t, h, user)
		if subscribed, _ := mustSubscribe(t, clients[i], ids[i]); !slices.Equal(subscribed, []string{ids[i]}) {
			t.Fatalf("got subscribed %v, want [%s]", subscribed, ids[i])
		}
	}
	// Pongs only (one goroutine here for all clients), for longer than 2.5
	// intervals of silence would last. Each pong starts a read round that
	// ends at once.
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(interval / 10)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, ws := range clients {
				if err := ws.WriteControl(websocket.PongMessage, nil, time.Now().Add(3*time.Second)); err != nil {
					t.Errorf("pong: %v", err)
					return
				}
			}
		}
	}()
	time.Sleep(3 * interval)
	if got := gaugeValue(h.m.WebSocketClients); got != conns {
		t.Fatalf("got %v WebSocket clients, want %d still open", got, conns)
	}
	testenv.Eventually(t, 5*time.Second, "the goroutines of idle connections gone", func() (bool, string) {
		grown := runtime.NumGoroutine() - before
		return grown < conns/10, fmt.Sprintf("%d more goroutines than before %d connections", grown, conns)
	})
	close(stop)
	<-stopped
	for i, ws := range clients {
		r := e.decide(t, ids[i], fmt.Sprintf("idle%d", i))
		e.publish(t, r)
		checkResult(t, mustReadResult(t, ws), r)
	}
}

// TestWSPingsStartNoWriter: the pinger writes the pings of idle connections
// itself; a writer goroutine per ping made every round a burst of one
// goroutine per connection.
func TestWSPingsStartNoWriter(t *testing.T) {
	t.Parallel()
	const conns, rounds = 20, 3
	const interval = 200 * time.Millisecond
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{PingInterval: interval, MaxConnsPerIP: conns})
	var pings atomic.Int64
	clients := make([]*websocket.Conn, conns)
	for i := range clients {
		user := fmt.Sprintf("pinged%d", i)
		id := e.newRequest(t, user)
		clients[i] = mustDial(t, h, user)
		if subscribed, _ := mustSubscribe(t, clients[i], id); !slices.Equal(subscribed, []string{id}) {
			t.Fatalf("got subscribed %v, want [%s]", subscribed, id)
		}
	}
	started := h.n.writersStarted.Load() // the subscribe answers' writers
	for _, ws := range clients {
		ws.SetPingHandler(func(data string) error {
			pings.Add(1)
			return ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(3*time.Second))
		})
		go func() {
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					return
				}
			}
		}()
	}
	testenv.Eventually(t, 30*time.Second, "ping rounds", func() (bool, string) {
		return pings.Load() >= conns*rounds, fmt.Sprintf("%d pings", pings.Load())
	})
	if got := h.n.writersStarted.Load() - started; got != 0 {
		t.Errorf("%d writer goroutines started for %d pings, want 0", got, pings.Load())
	}
}

// TestWSSubscribeStartsNoWriter: the read round writes a subscribe frame's
// answers (the acknowledgement, a result already final) itself; only a
// result published later starts a writer goroutine.
func TestWSSubscribeStartsNoWriter(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{RecheckInterval: time.Hour})
	queued, final := e.newRequest(t, "alice"), e.newRequest(t, "alice")
	r := e.decide(t, final, "alice")
	ws := mustDial(t, h, "alice")
	started := h.n.writersStarted.Load()
	if subscribed, _ := mustSubscribe(t, ws, queued, final); !slices.Equal(subscribed, []string{queued, final}) {
		t.Fatalf("got subscribed %v, want [%s %s]", subscribed, queued, final)
	}
	checkResult(t, mustReadResult(t, ws), r)
	if got := h.n.writersStarted.Load() - started; got != 0 {
		t.Errorf("got %d writer goroutines started for a subscribe frame's answers, want 0", got)
	}
	// The round may still be in its writer's last look at the queue, which
	// would write the published result too.
	testenv.Eventually(t, 5*time.Second, "the read round to end", func() (bool, string) {
		h.n.mu.Lock()
		conns := slices.Collect(maps.Keys(h.n.conns))
		h.n.mu.Unlock()
		for _, c := range conns {
			c.mu.Lock()
			busy := c.reading || c.writing
			c.mu.Unlock()
			if busy {
				return false, "a connection still reading or writing"
			}
		}
		return true, ""
	})
	later := e.decide(t, queued, "alice")
	e.publish(t, later)
	checkResult(t, mustReadResult(t, ws), later)
	if got := h.n.writersStarted.Load() - started; got != 1 {
		t.Errorf("got %d writer goroutines started after a published result, want 1", got)
	}
}

// TestWSSilentClientClosed: a client that answers no ping is dropped 2.5
// ping intervals after it was last heard from, not before.
func TestWSSilentClientClosed(t *testing.T) {
	t.Parallel()
	const interval = 100 * time.Millisecond
	_, f := fakeEnv(t)
	h := newHarness(t, f, Options{PingInterval: interval})
	start := time.Now()
	ws := mustDial(t, h, "alice")
	var pings atomic.Int64
	ws.SetPingHandler(func(string) error { pings.Add(1); return nil }) // no pong
	err := mustReadClosed(t, ws, 5*time.Second)
	if d := time.Since(start); d < interval*5/2 {
		t.Errorf("closed after %v (%v), want at least 2.5 intervals (%v)", d, err, interval*5/2)
	}
	if pings.Load() < 2 {
		t.Errorf("got %d pings before the close, want at least 2", pings.Load())
	}
	testenv.Eventually(t, 3*time.Second, "no WebSocket clients", func() (bool, string) {
		n := gaugeValue(h.m.WebSocketClients)
		return n == 0, fmt.Sprintf("%v clients", n)
	})
}

// TestWSPartialFrameClosed: a client that starts a frame and stalls is
// dropped once ReadTimeout has passed (the old design waited for the ping
// timeout, 50 s by default).
func TestWSPartialFrameClosed(t *testing.T) {
	t.Parallel()
	const readTimeout = 200 * time.Millisecond
	_, f := fakeEnv(t)
	h := newHarness(t, f, Options{ReadTimeout: readTimeout})
	whole := maskedFrame(true, websocket.TextMessage, []byte(subscribeFrame("x")))
	tests := []struct {
		name string
		sent []byte
	}{
		{name: "first header byte", sent: whole[:1]},
		{name: "header and part of the payload", sent: whole[:10]},
		{name: "part of a ping", sent: maskedFrame(true, websocket.PingMessage, []byte("hello"))[:8]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := mustDial(t, h, "alice")
			start := time.Now()
			mustWriteRaw(t, ws, tt.sent)
			err := mustReadClosed(t, ws, 5*time.Second)
			if d := time.Since(start); d < readTimeout {
				t.Errorf("closed after %v (%v), want at least the read timeout %v", d, err, readTimeout)
			}
		})
	}
	testenv.Eventually(t, 3*time.Second, "no WebSocket clients", func() (bool, string) {
		n := gaugeValue(h.m.WebSocketClients)
		return n == 0, fmt.Sprintf("%v clients", n)
	})
}

// TestWSFraming: the frames a client may send, however TCP cuts them.
func TestWSFraming(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{})
	tests := []struct {
		name string
		// writes returns the raw writes to send for a subscription to id.
		writes func(id string) [][]byte
		// acks is how many subscription acknowledgements come back.
		acks int
		// pong is the payload the server must answer a ping with, if any.
		pong string
	}{
		{name: "message split across writes", acks: 1, writes: func(id string) [][]byte {
			b := maskedFrame(true, websocket.TextMessage, []byte(subscribeFrame(id)))
			return [][]byte{b[:1], b[1:4], b[4:20], b[20:]}
		}},
		{name: "two messages in one write", acks: 2, writes: func(id string) [][]byte {
			b := maskedFrame(true, websocket.TextMessage, []byte(subscribeFrame(id)))
			return [][]byte{slices.Concat(b, b)}
		}},
		{name: "fragmented message with a ping between", acks: 1, pong: "mid", writes: func(id string) [][]byte {
			msg := []byte(subscribeFrame(id))
			return [][]byte{
				maskedFrame(false, websocket.TextMessage, msg[:5]),
				maskedFrame(true, websocket.PingMessage, []byte("mid")),
				maskedFrame(true, 0 /* continuation */, msg[5:]),
			}
		}},
		{name: "ping, pong and a message in one write", acks: 1, pong: "are you there?", writes: func(id string) [][]byte {
			return [][]byte{slices.Concat(
				maskedFrame(true, websocket.PingMessage, []byte("are you there?")),
				maskedFrame(true, websocket.PongMessage, []byte("unsolicited")),
				maskedFrame(true, websocket.TextMessage, []byte(subscribeFrame(id))),
			)}
		}},
		{name: "ping split across writes", pong: "split", writes: func(string) [][]byte {
			b := maskedFrame(true, websocket.PingMessage, []byte("split"))
			return [][]byte{b[:3], b[3:]}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := mustDial(t, h, "alice")
			pongs := make(chan string, 4)
			ws.SetPongHandler(func(p string) error { pongs <- p; return nil })
			id := e.newRequest(t, "alice")
			for _, w := range tt.writes(id) {
				mustWriteRaw(t, ws, w)
				time.Sleep(10 * time.Millisecond) // separate TCP segments, most likely
			}
			for range tt.acks {
				if f := mustRead(t, ws); f.Type != "subscribed" || !slices.Equal(f.RequestIDs, []string{id}) {
					t.Fatalf("got %+v, want subscribed [%s]", f, id)
				}
			}
			if tt.acks > 0 {
				r := e.decide(t, id, "alice")
				e.publish(t, r)
				checkResult(t, mustReadResult(t, ws), r)
			}
			if tt.pong != "" {
				if tt.acks == 0 {
					// Reading is what runs the pong handler.
					_ = ws.SetReadDeadline(time.Now().Add(quiet))
					_, _, _ = ws.ReadMessage()
				}
				select {
				case got := <-pongs:
					if got != tt.pong {
						t.Errorf("got pong %q, want %q", got, tt.pong)
					}
				default:
					t.Errorf("got no pong, want %q", tt.pong)
				}
			}
		})
	}
}

// TestWSCloseHandshake: the server answers a client's close frame with its
// own and forgets the connection.
func TestWSCloseHandshake(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{})
	ws := mustDial(t, h, "alice")
	mustSubscribe(t, ws, e.newRequest(t, "alice"))
	if err := ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(3*time.Second)); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := mustReadClosed(t, ws, 3*time.Second); !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
		t.Errorf("got %v, want the close echoed (%d)", err, websocket.CloseNormalClosure)
	}
	testenv.Eventually(t, 3*time.Second, "no WebSocket clients", func() (bool, string) {
		n := gaugeValue(h.m.WebSocketClients)
		return n == 0, fmt.Sprintf("%v clients", n)
	})
	if got := h.n.hub.size(); got != 0 {
		t.Errorf("got %d request ids left in the hub, want 0", got)
	}
}

// TestWSOverTLS: a connection the poller cannot watch (TLS keeps decrypted
// bytes of its own) reads in a goroutine and works the same.
func TestWSOverTLS(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	srv := httptest.NewUnstartedServer(nil)
	srv.TLS = &tls.Config{}
	h := startHarness(t, f, Options{}, srv)
	d := testDialer()
	d.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
	ws, _, err := h.dial(t, d, "alice", nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	id := e.newRequest(t, "alice")
	if subscribed, _ := mustSubscribe(t, ws, id); !slices.Equal(subscribed, []string{id}) {
		t.Fatalf("got subscribed %v, want [%s]", subscribed, id)
	}
	r := e.decide(t, id, "alice")
	e.publish(t, r)
	checkResult(t, mustReadResult(t, ws), r)
	_ = ws.Close()
	testenv.Eventually(t, 3*time.Second, "no WebSocket clients", func() (bool, string) {
		n := gaugeValue(h.m.WebSocketClients)
		return n == 0, fmt.Sprintf("%v clients", n)
	})
}
