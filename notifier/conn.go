package notifier

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/model"
)

// outMsg is one queued text frame.
type outMsg struct {
	data   []byte
	result bool // counts as a delivered result once written
}

// conn is one WebSocket client. Its handler goroutine reads; one writer
// goroutine owns all writes except control frames, because gorilla allows a
// single concurrent writer.
type conn struct {
	ws         *websocket.Conn
	userID     string
	send       chan outMsg
	done       chan struct{} // closed by stop
	readerDone chan struct{} // closed when the read loop returns
	stopOnce   sync.Once
	closeCode  int // set before done is closed; 0 drops without a close frame
	closeText  string

	subs map[string]*subscription // guarded by hub.mu
}

func newConn(ws *websocket.Conn, userID string, buffer int) *conn {
	return &conn{
		ws:         ws,
		userID:     userID,
		send:       make(chan outMsg, buffer),
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
		subs:       map[string]*subscription{},
	}
}

// stop ends the connection: with a close frame carrying code, or at once
// when code is 0. Only the first call counts; it reports whether it was this
// one.
func (c *conn) stop(code int, text string) bool {
	first := false
	c.stopOnce.Do(func() {
		first = true
		c.closeCode, c.closeText = code, text
		close(c.done)
		if code == 0 {
			// Unblocks a writer stuck on a slow client and the reader.
			_ = c.ws.Close()
		}
	})
	return first
}

func (c *conn) stopping() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// push queues m for c's writer, waiting up to wait for room (0: not at all,
// as the hub must never block on one client). A client that cannot keep up
// is dropped.
func (n *Notifier) push(c *conn, m outMsg, wait time.Duration) {
	if c.stopping() {
		return
	}
	select {
	case c.send <- m:
		return
	default:
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case c.send <- m:
			return
		case <-c.done:
			return
		case <-t.C:
		}
	}
	if c.stop(0, "") {
		n.log.Warn("dropped slow WebSocket client", "user_id", c.userID, "send_buffer", cap(c.send))
	}
}

// enter admits a WebSocket handler for userID from ip and counts its
// connection, unless the notifier is shutting down or a cap is reached.
// Every nil return is paired with a leave.
func (n *Notifier) enter(userID, ip string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.closing:
		return fmt.Errorf("websocket: shutting down: %w", model.ErrUnavailable)
	case n.openUser[userID] >= n.opts.MaxConnsPerUser:
		return fmt.Errorf("websocket: user has %d connections: %w", n.openUser[userID], model.ErrTooManyConns)
	case n.openIP[ip] >= n.opts.MaxConnsPerIP:
		return fmt.Errorf("websocket: %s has %d connections: %w", ip, n.openIP[ip], model.ErrTooManyConns)
	case n.open >= n.opts.MaxConns:
		if now := time.Now(); now.Sub(n.fullLogged) >= time.Minute {
			n.fullLogged = now
			n.log.Warn("WebSocket budget exhausted: refusing upgrades", "max_conns", n.opts.MaxConns)
		}
		return fmt.Errorf("websocket: %d connections open: %w", n.open, model.ErrUnavailable)
	}
	n.open++
	n.openUser[userID]++
	n.openIP[ip]++
	n.wg.Add(1)
	return nil
}

// leave ends what enter admitted.
func (n *Notifier) leave(userID, ip string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.open--
	if n.openUser[userID]--; n.openUser[userID] == 0 {
		delete(n.openUser, userID)
	}
	if n.openIP[ip]--; n.openIP[ip] == 0 {
		delete(n.openIP, ip)
	}
	n.wg.Done()
}

// refuseUpgrade answers an upgrade that enter refused. It is not logged:
// refusals are expected under load, and a flood of them must not flood the
// log too. Connection: close frees the refused client's descriptor at once.
func (n *Notifier) refuseUpgrade(c *gin.Context, err error) {
	status, body := httpapi.Classify(err)
	c.Header("Retry-After", strconv.Itoa(connRetryAfter))
	c.Header("Connection", "close")
	c.AbortWithStatusJSON(status, body)
}

func (n *Notifier) track(c *conn) {
	n.mu.Lock()
	n.conns[c] = struct{}{}
	closing := n.closing
	n.mu.Unlock()
	n.metrics.WebSocketClients.Inc()
	if closing {
		// Shutdown took its snapshot before this connection was tracked.
		c.stop(websocket.CloseGoingAway, "server shutting down")
	}
}

func (n *Notifier) untrack(c *conn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
	n.metrics.WebSocketClients.Dec()
}

func (n *Notifier) serveWS(c *gin.Context, userID string) {
	if !n.upgrader.CheckOrigin(c.Request) {
		httpapi.Abort(c, n.log, fmt.Errorf("websocket origin: %w", model.ErrForbidden))
		return
	}
	ip := c.ClientIP()
	if err := n.enter(userID, ip); err != nil {
		n.refuseUpgrade(c, err)
		return
	}
	defer n.leave(userID, ip)
	ws, err := n.upgrader.Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		return // the upgrader has answered with an HTTP error
	}
	cn := newConn(ws, userID, n.opts.SendBuffer)
	n.track(cn)
	defer n.untrack(cn)

	ws.SetReadLimit(n.opts.ReadLimit)
	pongWait := n.opts.PingInterval * 5 / 2
	_ = ws.SetReadDeadline(time.Now().Add(pongWait))
	ws.SetPongHandler(func(string) error { return ws.SetReadDeadline(time.Now().Add(pongWait)) })

	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		n.writeLoop(cn)
	}()
	n.readLoop(c.Request.Context(), cn)
	cn.stop(0, "")
	n.hub.removeConn(cn)
	<-writerDone
}

func (n *Notifier) readLoop(ctx context.Context, c *conn) {
	defer close(c.readerDone)
	for {
		typ, data, err := c.ws.ReadMessage()
		if err != nil {
			n.log.Debug("websocket closed", "user_id", c.userID, "err", err)
			return
		}
		if c.stopping() {
			continue // drain until the client answers our close frame
		}
		ids, err := parseSubscribe(typ, data)
		if err != nil {
			if got, _ := n.invalid.take(c.userID, 1, n.opts.now()); got == 0 {
				c.stop(websocket.ClosePolicyViolation, "too many invalid frames")
				continue
			}
			n.push(c, outMsg{data: idError(codeInvalid, "", err.Error())}, n.opts.WriteTimeout)
			continue
		}
		n.subscribe(ctx, c, ids)
	}
}

func (n *Notifier) writeLoop(c *conn) {
	ping := time.NewTicker(n.opts.PingInterval)
	defer ping.Stop()
	for {
		select {
		case m := <-c.send:
			if !n.write(c, m) {
				c.stop(0, "")
				return
			}
		case <-ping.C:
			if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(n.opts.WriteTimeout)); err != nil {
				c.stop(0, "")
				return
			}
		case <-c.done:
			n.closeGracefully(c)
			return
		}
	}
}

func (n *Notifier) write(c *conn, m outMsg) bool {
	_ = c.ws.SetWriteDeadline(time.Now().Add(n.opts.WriteTimeout))
	if err := c.ws.WriteMessage(websocket.TextMessage, m.data); err != nil {
		n.log.Debug("websocket write", "user_id", c.userID, "err", err)
		return false
	}
	if m.result {
		n.metrics.ResultsDelivered.WithLabelValues("ws").Inc()
	}
	return true
}

// closeGracefully flushes what is queued (results already handed over),
// sends the close frame and gives the client a moment to answer before the
// TCP connection is closed.
func (n *Notifier) closeGracefully(c *conn) {
	defer c.ws.Close()
	if c.closeCode == 0 {
		return
	}
flush:
	for {
		select {
		case m := <-c.send:
			if !n.write(c, m) {
				return
			}
		default:
			break flush
		}
	}
	msg := websocket.FormatCloseMessage(c.closeCode, c.closeText)
	if err := c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(n.opts.WriteTimeout)); err != nil {
		return
	}
	t := time.NewTimer(closeGrace)
	defer t.Stop()
	select {
	case <-c.readerDone:
	case <-t.C:
	}
}
