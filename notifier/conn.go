package notifier

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/model"
)

// An idle connection holds no goroutine: reads run when the poller reports
// the socket readable (poller_linux.go; elsewhere, and for TLS, a goroutine
// per connection blocks in the same read round), writes in a goroutine that
// exists only while something is queued, and pings come from one pinger for
// the whole process (pinger.go). docs/BENCHMARKS.md has the figures.

const (
	// readBufferSize is the connection's read buffer: the largest control
	// frame (131 bytes) fits, data frames are read through it. gorilla
	// reads from it (it reuses a hijacked reader above 256 bytes), so the
	// read round can peek at frame headers in it.
	readBufferSize = 512
	// writeBufferSize is the pooled buffer a write borrows; WriteMessage
	// sends a longer message as one frame all the same.
	writeBufferSize = 1024
	// handshakeBufferSize holds the 101 response gorilla builds.
	handshakeBufferSize = 256
)

// outMsg is one queued text frame.
type outMsg struct {
	data   []byte
	result bool // counts as a delivered result once written
}

// conn is one WebSocket client. gorilla allows one concurrent reader and one
// concurrent writer: a read round runs at most once at a time (reading), a
// writer goroutine at most once at a time (writing); control frames may be
// written by either.
type conn struct {
	n          *Notifier
	ws         *websocket.Conn
	br         *bufio.Reader // gorilla's reader too
	userID     string
	ip         string
	sendBuffer int
	fd         int    // the socket, when the poller watches it
	pollSeq    uint32 // tells this registration from an earlier one of fd

	// lastSeen is when the client last sent anything, since n.epoch.
	lastSeen atomic.Int64
	stopped  atomic.Bool // set under mu: no more messages are queued

	mu         sync.Mutex
	queue      []outMsg
	room       chan struct{} // closed when the queue shrinks or the connection stops
	writing    bool          // a writer goroutine runs
	reading    bool          // a read round runs
	dropped    bool          // the TCP connection is closed
	pingDue    bool
	pinged     time.Duration // since n.epoch
	closeCode  int           // 0 drops without a close frame
	closeText  string
	closeSent  bool
	closeTimer *time.Timer

	// The pinger's list, guarded by pinger.mu.
	pingPrev, pingNext *conn
	pingAt             time.Duration
	pingListed         bool

	subs map[string]*subscription // guarded by hub.mu
}

func newConn(ws *websocket.Conn, userID string, sendBuffer int) *conn {
	return &conn{
		ws:         ws,
		userID:     userID,
		sendBuffer: sendBuffer,
		fd:         -1,
		subs:       map[string]*subscription{},
	}
}

// stop ends the connection: with a close frame carrying code after what is
// queued, or at once when code is 0. Only the first call counts; it reports
// whether it was this one.
func (c *conn) stop(code int, text string) bool {
	if code == 0 {
		return c.drop()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped.Load() {
		return false
	}
	c.stopped.Store(true)
	c.closeCode, c.closeText = code, text
	c.wakeRoomLocked()
	c.n.startWriterLocked(c)
	return true
}

func (c *conn) stopping() bool { return c.stopped.Load() }

// drop closes the TCP connection at once. It reports whether this call did.
// The connection is forgotten (hub, counts) once no read round runs, so a
// subscribe frame being answered cannot register after its connection is
// gone.
func (c *conn) drop() bool {
	c.mu.Lock()
	if c.dropped {
		c.mu.Unlock()
		return false
	}
	c.dropped = true
	c.stopped.Store(true)
	c.queue = nil
	c.wakeRoomLocked()
	if c.closeTimer != nil {
		c.closeTimer.Stop()
	}
	// Unregister before the close: the descriptor's number is reused at once.
	c.n.poller.remove(c)
	_ = c.ws.Close()
	reading := c.reading
	c.mu.Unlock()
	if !reading {
		c.n.forget(c)
	}
	return true
}

func (c *conn) wakeRoomLocked() {
	if c.room != nil {
		close(c.room)
		c.room = nil
	}
}

// seen records that the client sent something.
func (c *conn) seen() { c.lastSeen.Store(int64(c.n.clock())) }

// forget removes a dropped connection from the notifier.
func (n *Notifier) forget(c *conn) {
	n.pings.remove(c)
	n.hub.removeConn(c)
	n.untrack(c)
	n.leave(c.userID, c.ip)
}

// push queues m for c's writer, waiting up to wait for room (0: not at all,
// as the hub must never block on one client). A client that cannot keep up
// is dropped. Only c's read round waits (wait > 0): it writes what it queued
// itself when the round ends (flushRound), so a writer goroutine is started
// for it only when the queue is full.
func (n *Notifier) push(c *conn, m outMsg, wait time.Duration) {
	var timeout *time.Timer
	for {
		c.mu.Lock()
		if c.stopped.Load() {
			c.mu.Unlock()
			return
		}
		if len(c.queue) < c.sendBuffer {
			c.queue = append(c.queue, m)
			if wait <= 0 {
				n.startWriterLocked(c)
			}
			c.mu.Unlock()
			return
		}
		if wait <= 0 {
			c.mu.Unlock()
			break
		}
		n.startWriterLocked(c) // to make room
		if c.room == nil {
			c.room = make(chan struct{})
		}
		room := c.room
		c.mu.Unlock()
		if timeout == nil {
			timeout = time.NewTimer(wait)
			defer timeout.Stop()
		}
		select {
		case <-room:
		case <-timeout.C:
			wait = 0 // one last look, then drop
		}
	}
	if c.drop() {
		n.log.Warn("dropped slow WebSocket client", "user_id", c.userID, "send_buffer", c.sendBuffer)
	}
}

// startWriterLocked starts c's writer unless one runs. Called with c.mu held.
func (n *Notifier) startWriterLocked(c *conn) {
	if c.writing || c.dropped {
		return
	}
	c.writing = true
	n.writersStarted.Add(1)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.writeLoop(c)
	}()
}

// flushRound writes, in the read round's goroutine, what the round queued
// and no writer took: a subscribe frame's answers cost no goroutine of
// their own. It returns once the queue is empty with no writer running, so
// a message queued later starts a writer as usual.
func (n *Notifier) flushRound(c *conn) {
	for {
		c.mu.Lock()
		if c.writing || c.dropped || len(c.queue) == 0 {
			c.mu.Unlock()
			return
		}
		c.writing = true
		c.mu.Unlock()
		n.writeLoop(c)
	}
}

// writeLoop writes what is due, then the close frame once stopped, and
// returns when nothing is left.
func (n *Notifier) writeLoop(c *conn) {
	for {
		var (
			m               outMsg
			ping, sendClose bool
		)
		c.mu.Lock()
		switch {
		case c.dropped:
			c.writing = false
			c.mu.Unlock()
			return
		case len(c.queue) > 0:
			m = c.queue[0]
			c.queue[0] = outMsg{}
			if c.queue = c.queue[1:]; len(c.queue) == 0 {
				c.queue = nil // an idle connection holds no queue
			}
			c.wakeRoomLocked()
		case c.pingDue:
			c.pingDue, ping = false, true
		case c.closeCode != 0 && !c.closeSent:
			c.closeSent, sendClose = true, true
		default:
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()

		deadline := time.Now().Add(n.opts.WriteTimeout)
		var err error
		switch {
		case ping:
			err = c.ws.WriteControl(websocket.PingMessage, nil, deadline)
		case sendClose:
			err = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(c.closeCode, c.closeText), deadline)
			if err == nil {
				n.awaitClose(c)
			}
		default:
			err = n.write(c, m, deadline)
		}
		if err != nil {
			n.log.Debug("websocket write", "user_id", c.userID, "err", err)
			c.drop()
			return
		}
	}
}

func (n *Notifier) write(c *conn, m outMsg, deadline time.Time) error {
	_ = c.ws.SetWriteDeadline(deadline)
	if err := c.ws.WriteMessage(websocket.TextMessage, m.data); err != nil {
		return err
	}
	if m.result {
		n.metrics.ResultsDelivered.WithLabelValues("ws").Inc()
	}
	return nil
}

// awaitClose gives the client closeGrace to answer the close frame (the read
// round drops the connection when the answer comes), then drops it.
func (n *Notifier) awaitClose(c *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dropped {
		c.closeTimer = time.AfterFunc(closeGrace, func() { c.drop() })
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

// hijackWriter hands gorilla the connection with a read buffer of ours in
// place of net/http's 4 KB ones, which gorilla would otherwise keep for the
// connection's life.
type hijackWriter struct {
	http.ResponseWriter
	br *bufio.Reader
	bw *bufio.Writer
}

func (w *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := w.ResponseWriter.(http.Hijacker).Hijack()
	if err != nil || brw.Reader.Buffered() > 0 {
		return nc, brw, err // gorilla refuses early data itself
	}
	w.br.Reset(nc)
	w.bw.Reset(nc)
	return nc, bufio.NewReadWriter(w.br, w.bw), nil
}

// serveWS upgrades the request and returns: the connection lives on in the
// poller, the pinger and the hub.
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
	bw := n.handshakeWriters.Get().(*bufio.Writer)
	w := &hijackWriter{ResponseWriter: c.Writer, br: bufio.NewReaderSize(nil, readBufferSize), bw: bw}
	ws, err := n.upgrader.Upgrade(w, c.Request, nil)
	bw.Reset(nil)
	n.handshakeWriters.Put(bw)
	if err != nil {
		n.leave(userID, ip)
		return // the upgrader has answered with an HTTP error
	}
	ws.SetReadLimit(n.opts.ReadLimit)
	cn := newConn(ws, userID, n.opts.SendBuffer)
	cn.n, cn.ip, cn.br = n, ip, w.br
	now := n.clock()
	cn.lastSeen.Store(int64(now))
	cn.pinged = now
	n.track(cn)

	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.dropped {
		return
	}
	n.pings.add(cn, now)
	if n.poller.add(cn) {
		return
	}
	cn.reading = true
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.readBlocking(cn)
	}()
}

// readable starts a read round for c, which the poller found readable.
func (n *Notifier) readable(c *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dropped || c.reading {
		return
	}
	c.reading = true
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		ok := n.readRound(c)
		n.flushRound(c)
		n.endRead(c, ok)
	}()
}

// readBlocking is the read side of a connection the poller cannot watch: a
// goroutine that waits for the first byte of each round.
func (n *Notifier) readBlocking(c *conn) {
	for {
		_ = c.ws.SetReadDeadline(time.Time{})
		if _, err := c.br.Peek(1); err != nil {
			n.log.Debug("websocket closed", "user_id", c.userID, "err", err)
			break
		}
		ok := n.readRound(c)
		n.flushRound(c)
		if !ok {
			break
		}
	}
	n.endRead(c, false)
}

// endRead ends a read round: the connection is re-armed in the poller when
// ok, else dropped; a connection dropped meanwhile is forgotten here.
func (n *Notifier) endRead(c *conn, ok bool) {
	if !ok {
		c.drop()
	}
	c.mu.Lock()
	c.reading = false
	dropped := c.dropped
	if !dropped {
		ok = n.poller.rearm(c)
	}
	c.mu.Unlock()
	switch {
	case dropped:
		n.forget(c)
	case !ok:
		c.drop()
	}
}

// readRound reads every frame the client has sent, and reports whether the
// connection stays open. Control frames between messages are handled here,
// as gorilla's NextReader would block for the next data frame after them.
func (n *Notifier) readRound(c *conn) bool {
	for {
		if !n.readFrame(c) {
			return false
		}
		if c.br.Buffered() == 0 {
			return true
		}
	}
}

// readFrame reads one control frame or one whole message, which must
// arrive whole within ReadTimeout: a slow or partial frame holds a goroutine
// that long at most.
func (n *Notifier) readFrame(c *conn) bool {
	_ = c.ws.SetReadDeadline(time.Now().Add(n.opts.ReadTimeout))
	hdr, err := c.br.Peek(2)
	if err != nil {
		n.log.Debug("websocket closed", "user_id", c.userID, "err", err)
		return false
	}
	c.seen()
	if op, size, ok := controlFrame(hdr); ok {
		frame, err := c.br.Peek(size)
		if err != nil {
			n.log.Debug("websocket closed", "user_id", c.userID, "err", err)
			return false
		}
		if op == websocket.PingMessage {
			payload := unmaskedPayload(frame)
			_ = c.ws.WriteControl(websocket.PongMessage, payload, time.Now().Add(n.opts.WriteTimeout))
		}
		_, _ = c.br.Discard(size)
		return true
	}
	// Data frames, close frames and anything invalid: gorilla answers a
	// close frame and reports bad ones with the right close code.
	typ, data, err := c.ws.ReadMessage()
	if err != nil {
		n.log.Debug("websocket closed", "user_id", c.userID, "err", err)
		return false
	}
	if c.stopping() {
		return true // drain until the client answers our close frame
	}
	ids, err := parseSubscribe(typ, data)
	if err != nil {
		if got, _ := n.invalid.take(c.userID, 1, n.opts.now()); got == 0 {
			c.stop(websocket.ClosePolicyViolation, "too many invalid frames")
			return true
		}
		n.push(c, outMsg{data: idError(codeInvalid, "", err.Error())}, n.opts.WriteTimeout)
		return true
	}
	n.subscribe(c, ids)
	return true
}
