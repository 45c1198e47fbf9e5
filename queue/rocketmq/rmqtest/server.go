// Package rmqtest is a protocol-level RocketMQ broker double for tests: an
// in-process name server and broker on one loopback port that speak
// RocketMQ's remoting protocol (JSON headers) to the unmodified
// rocketmq-client-go v2.1.2, so the driver is tested through the real
// library and the real wire format. No RocketMQ broker can be installed on
// the machines that run the tests (see queue/rocketmq/README.md).
//
// It serves what the library uses: route info, heartbeats, send and batch
// send, long-poll pull (a pull with nothing to return is held open until a
// message arrives or the client's suspend timeout passes), consumer offsets,
// consumer lists with NOTIFY_CONSUMER_IDS_CHANGED pushed on membership
// changes, queue locks for orderly consumption (they expire after
// Options.LockTTL), send-back to %RETRY%<group> and %DLQ%<group>, topic
// creation and delay levels (kept, as a broker keeps them, in the schedule
// topic SCHEDULE_TOPIC_XXXX until due). It keeps everything in memory.
//
// It keeps a broker's limits where the client sees them: a pull answers at
// most 32 messages and 256 KiB; a pull that does not carry its subscription
// is refused (SUBSCRIPTION_NOT_EXIST) for a group no heartbeat registered,
// as after a restart; committed offsets reach "disk" every
// Options.OffsetFlushInterval; a trimmed queue moves consumers up
// (PULL_OFFSET_MOVED) and answers QUERY_NOT_FOUND to a group without an
// offset.
//
// Tests inspect its state (Messages, CommittedOffset, FlushedOffset, DLQ,
// Consumers, LockOwner) and inject faults: DropConnections, InjectFault
// (answer a request code with an error, or swallow its response),
// SetLatency, Restart with state kept or lost, Crash (offsets back to their
// last flush), Trim, ExpireLocks, and Listen (or ListenAt, on an address of the
// test's choosing), an extra port whose Close cuts off every client that
// came in through it — what a killed process looks
// like to a broker.
//
// The double aims at the behaviour the driver depends on, not at a broker:
// one broker, one name server, no disk (a crash is simulated), no tags or
// filters, no transactions, no replicas.
//
// All state is guarded by one mutex and the package has no package-level
// state, so it is race-clean (its tests run under -race; they talk to it with
// the project's own remoting client, not with the library, whose races would
// fail them).
package rmqtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
)

// Options configures a Server. Zero fields take the defaults.
type Options struct {
	// Addr is the listen address. Default "127.0.0.1:0".
	Addr string
	// Cluster and BrokerName appear in route data. Defaults
	// "DefaultCluster" and "broker-a".
	Cluster, BrokerName string
	// AutoCreateTopics creates a topic on the first send to it, as a broker
	// with autoCreateTopicEnable=true does (through the TBW102 default
	// topic). Route queries for unknown topics still answer TOPIC_NOT_EXIST.
	AutoCreateTopics bool
	// DefaultQueues is the queue count of auto-created topics (further
	// capped by the producer's defaultTopicQueueNums). Default 8.
	DefaultQueues int
	// LockTTL is how long a queue lock outlives its holder's last renewal
	// (rocketmq.broker.rebalance.lockMaxLiveTime on a real broker). Default
	// 60s.
	LockTTL time.Duration
	// ClientTimeout is how long a client stays registered without a
	// heartbeat (channelExpiredTimeout). Default 120s.
	ClientTimeout time.Duration
	// OffsetFlushInterval is how often committed consumer offsets are
	// written to disk (flushConsumerOffsetInterval): Crash rolls them back
	// to the last write. Default 5s.
	OffsetFlushInterval time.Duration
	// DelayLevels are the delays of levels 1..n (messageDelayLevel).
	// Default: 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h.
	DelayLevels []time.Duration
	// LegacyRoutes makes the name server answer every route query in
	// fastjson's dialect (brokerAddrs keys unquoted), as name servers before
	// 4.9.4 do whatever the request asks for. By default it answers as 4.9.4
	// does: fastjson's dialect to requests below version 401 (V4_9_4)
	// without acceptStandardJsonOnly=true, standard JSON otherwise.
	LegacyRoutes bool
	// Logger receives protocol errors and a debug line per request. Nil
	// discards.
	Logger *slog.Logger
}

// DefaultDelayLevels are RocketMQ's default delay levels 1..18.
func DefaultDelayLevels() []time.Duration {
	m, h := time.Minute, time.Hour
	return []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		m, 2 * m, 3 * m, 4 * m, 5 * m, 6 * m, 7 * m, 8 * m, 9 * m, 10 * m, 20 * m, 30 * m, h, 2 * h}
}

func (o Options) withDefaults() Options {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.Cluster == "" {
		o.Cluster = "DefaultCluster"
	}
	if o.BrokerName == "" {
		o.BrokerName = "broker-a"
	}
	if o.DefaultQueues <= 0 {
		o.DefaultQueues = 8
	}
	if o.LockTTL <= 0 {
		o.LockTTL = 60 * time.Second
	}
	if o.ClientTimeout <= 0 {
		o.ClientTimeout = 120 * time.Second
	}
	if o.OffsetFlushInterval <= 0 {
		o.OffsetFlushInterval = 5 * time.Second
	}
	if len(o.DelayLevels) == 0 {
		o.DelayLevels = DefaultDelayLevels()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}

// Server is a running double. All methods are safe for concurrent use.
type Server struct {
	opts Options
	log  *slog.Logger

	mu        sync.Mutex
	st        *state
	listeners []*Listener // listeners[0] is the main one
	conns     map[*conn]struct{}
	faults    map[int16]*Fault
	latency   time.Duration
	requests  map[int16]int
	stopped   bool          // between a Restart's stop and start, and after Close
	stop      chan struct{} // closed on stop; long polls and timers watch it
	wake      chan struct{} // wakes the delivery of delayed messages

	notifyOpaque atomic.Int32
	wg           sync.WaitGroup // connection handlers, request handlers, background loops
}

// Start listens on opts.Addr and serves until Close.
func Start(opts Options) (*Server, error) {
	opts = opts.withDefaults()
	s := &Server{
		opts:     opts,
		log:      opts.Logger,
		conns:    make(map[*conn]struct{}),
		faults:   make(map[int16]*Fault),
		requests: make(map[int16]int),
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("rmqtest: listen %s: %w", opts.Addr, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = s.newStateLocked()
	s.startLocked()
	s.addListenerLocked(ln)
	return s, nil
}

// defaultTopic is the template topic through which producers auto-create
// topics.
const defaultTopic = "TBW102"

// Addr is the main address: name server and broker share it.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listeners[0].addr.String()
}

// Close stops the server, drops every connection and waits for its
// goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.stopLocked()
	s.listeners = nil
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// Restart stops the server (listeners closed, connections dropped, held
// pulls answered by nothing), waits downtime, and listens again on the same
// ports. keepState false starts over empty, as a broker whose disk was lost;
// true keeps messages, offsets, topics and how far each delay level was
// delivered, as a broker shut down cleanly (which flushes its offsets) and
// restarted on its disk. Locks and client registrations are lost either way:
// they live in a real broker's memory.
func (s *Server) Restart(keepState bool, downtime time.Duration) error {
	return s.restart(downtime, func(st *state) *state {
		if !keepState {
			return s.newStateLocked()
		}
		st.flushOffsets()
		st.forgetSessions()
		return st
	})
}

// Crash stops the server as a killed broker process stops, waits downtime
// and starts it again on its disk: messages are kept (a broker writes them
// to the page cache, which outlives the process), but committed consumer
// offsets go back to their last flush (Options.OffsetFlushInterval), so the
// batches acknowledged since are delivered again. Locks and client
// registrations are lost, as on Restart.
func (s *Server) Crash(downtime time.Duration) error {
	return s.restart(downtime, func(st *state) *state {
		st.crashOffsets()
		st.forgetSessions()
		return st
	})
}

// restart stops the server, waits downtime, replaces the state with what
// next makes of it and listens again on the same ports.
func (s *Server) restart(downtime time.Duration, next func(*state) *state) error {
	s.mu.Lock()
	addrs := make([]string, len(s.listeners))
	for i, l := range s.listeners {
		addrs[i] = l.addr.String()
	}
	old := s.listeners
	s.stopLocked()
	s.mu.Unlock()
	// Wait for the old connections' handlers, so none of them touches the
	// state after the restart.
	s.wg.Wait()
	time.Sleep(downtime)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = next(s.st)
	s.listeners = nil
	s.startLocked()
	for i, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			s.stopLocked()
			return fmt.Errorf("rmqtest: restart: listen %s: %w", a, err)
		}
		l := s.addListenerLocked(ln)
		if i > 0 {
			// Keep the caller's handle working: it now stands for the new
			// socket on the same port.
			old[i].ln, old[i].addr = l.ln, l.addr
			s.listeners[i] = old[i]
		}
	}
	return nil
}

// newStateLocked returns an empty state, with the default topic when topics
// are created on first send.
func (s *Server) newStateLocked() *state {
	st := newState()
	if s.opts.AutoCreateTopics {
		st.createTopic(defaultTopic, s.opts.DefaultQueues, permReadWrite)
	}
	return st
}

// startLocked starts the background loops.
func (s *Server) startLocked() {
	s.stopped = false
	s.stop = make(chan struct{})
	s.wake = make(chan struct{}, 1)
	stop, wake := s.stop, s.wake
	s.wg.Add(3)
	go func() { defer s.wg.Done(); s.deliverDelayed(stop, wake) }()
	go func() { defer s.wg.Done(); s.expireClients(stop) }()
	go func() { defer s.wg.Done(); s.flushOffsets(stop) }()
}

// stopLocked closes listeners and connections and stops the loops.
func (s *Server) stopLocked() {
	if s.stopped {
		return
	}
	s.stopped = true
	close(s.stop)
	for _, l := range s.listeners {
		_ = l.ln.Close()
	}
	for c := range s.conns {
		_ = c.Close()
	}
}

// Listener is an extra port of the Server. Clients that reach the name
// server through it are told the broker is on it too, so everything they do
// goes through it.
type Listener struct {
	s    *Server
	ln   net.Listener
	addr *net.TCPAddr
}

// Listen opens an extra port on the same host. Closing it cuts off the
// clients that use it.
func (s *Server) Listen() (*Listener, error) { return s.listen("") }

// ListenAt opens an extra listener on addr. Another loopback address with
// the port of an earlier listener is a name server and broker that moved to
// a new IP, as a recreated container does.
func (s *Server) ListenAt(addr string) (*Listener, error) { return s.listen(addr) }

// listen opens an extra listener on addr, or on a free port of the main
// listener's host if addr is empty.
func (s *Server) listen(addr string) (*Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errors.New("rmqtest: server stopped")
	}
	if addr == "" {
		addr = net.JoinHostPort(s.listeners[0].addr.IP.String(), "0")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rmqtest: listen %s: %w", addr, err)
	}
	return s.addListenerLocked(ln), nil
}

// Addr is the listener's address.
func (l *Listener) Addr() string { return l.addr.String() }

// Close stops accepting and drops every connection that came in through
// this listener. The clients see connection refused from then on.
func (l *Listener) Close() error {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	err := l.ln.Close()
	for c := range s.conns {
		if c.via == l.ln {
			_ = c.Close()
		}
	}
	for i, x := range s.listeners {
		if x.ln == l.ln && i > 0 {
			s.listeners = append(s.listeners[:i], s.listeners[i+1:]...)
			break
		}
	}
	return err
}

func (s *Server) addListenerLocked(ln net.Listener) *Listener {
	l := &Listener{s: s, ln: ln, addr: ln.Addr().(*net.TCPAddr)}
	s.listeners = append(s.listeners, l)
	stop := s.stop
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.accept(l, stop)
	}()
	return l
}

func (s *Server) accept(l *Listener, stop chan struct{}) {
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			return
		}
		c := &conn{Conn: nc, s: s, via: l.ln, local: l.addr, closed: make(chan struct{}), stop: stop}
		s.mu.Lock()
		if s.stopped || s.stop != stop {
			s.mu.Unlock()
			_ = nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
		}()
	}
}

// DropConnections closes every client connection (listeners stay open, so
// clients may reconnect at once). It returns how many were dropped.
func (s *Server) DropConnections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.conns)
	for c := range s.conns {
		_ = c.Close()
	}
	return n
}

// Fault changes how the double answers one request code.
type Fault struct {
	// Code is the response code to answer with, without handling the
	// request (e.g. remoting.SystemBusy), unless Stored is set. Ignored
	// when Swallow is set.
	Code int16
	// Remark goes with Code.
	Remark string
	// Stored handles the request and then answers Code in place of its
	// success, with the success's headers: a 4.9.4 broker that stored a
	// send but timed out flushing it to disk or a replica answers
	// FLUSH_DISK_TIMEOUT (10), SLAVE_NOT_AVAILABLE (11) or
	// FLUSH_SLAVE_TIMEOUT (12) this way (SendMessageProcessor's
	// handlePutMessageResult), and the client reports a send status that
	// is not SEND_OK.
	Stored bool
	// Swallow handles the request but never answers it: the client cannot
	// tell whether it took effect (a send whose response was lost).
	Swallow bool
	// Times is how many requests the fault applies to; 0 means until
	// ClearFaults.
	Times int
}

// InjectFault applies f to requests with code reqCode, replacing any fault
// on that code.
func (s *Server) InjectFault(reqCode int16, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[reqCode] = &f
}

// ClearFaults removes every injected fault and the latency.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.faults)
	s.latency = 0
}

// SetLatency delays every response by d.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// ExpireLocks makes every queue lock of group expire now, as if its holder
// had stopped renewing it LockTTL ago, and returns how many it expired. It
// is the fast-forward for tests whose consumers run the client library with
// its own renewal period (20 s), which needs a lock lifetime well above it:
// a test can have a dead consumer's queues taken over without waiting that
// long. Live holders take theirs back at their next renewal.
func (s *Server) ExpireLocks(group string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k := range s.st.locks {
		if k.group == group {
			delete(s.st.locks, k)
			n++
		}
	}
	return n
}

// Requests returns how many requests with code the double has received.
func (s *Server) Requests(code int16) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[code]
}

// takeFault returns the fault for code, if any, and counts it down.
func (s *Server) takeFault(code int16) (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[code]++
	f, ok := s.faults[code]
	if !ok {
		return Fault{}, false
	}
	out := *f
	if f.Times > 0 {
		f.Times--
		if f.Times == 0 {
			delete(s.faults, code)
		}
	}
	return out, true
}

// conn is one client connection.
type conn struct {
	net.Conn
	s      *Server
	via    net.Listener
	local  *net.TCPAddr // the address the client dialed: this broker's address for it
	stop   chan struct{}
	closed chan struct{}

	writeMu   sync.Mutex
	closeOnce sync.Once
}

// Close closes the connection once; the serve loop then unregisters its
// clients.
func (c *conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		err = c.Conn.Close()
	})
	return err
}

func (c *conn) serve() {
	defer c.s.connGone(c)
	r := bufio.NewReader(c.Conn)
	var reqs sync.WaitGroup
	defer reqs.Wait()
	for {
		cmd, err := remoting.Read(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.s.log.Debug("rmqtest: read", "remote", c.RemoteAddr(), "err", err)
			}
			_ = c.Close()
			return
		}
		if cmd.IsResponse() {
			continue // answers to our NOTIFY pushes, which expect none
		}
		// Requests on one connection are multiplexed by opaque: a held pull
		// must not block the heartbeat behind it.
		reqs.Add(1)
		go func() {
			defer reqs.Done()
			c.handle(cmd)
		}()
	}
}

func (c *conn) handle(req *remoting.Command) {
	f, faulty := c.s.takeFault(req.Code)
	var resp *remoting.Command
	switch {
	case faulty && !f.Swallow && !f.Stored:
		resp = remoting.NewResponse(req, f.Code, f.Remark)
	default:
		resp = c.s.dispatch(c, req)
		if faulty && f.Stored && resp != nil && resp.Code == remoting.Success {
			resp.Code, resp.Remark = f.Code, f.Remark
		}
	}
	if faulty && f.Swallow {
		return
	}
	if resp == nil {
		return
	}
	c.s.mu.Lock()
	lat := c.s.latency
	c.s.mu.Unlock()
	if lat > 0 {
		select {
		case <-time.After(lat):
		case <-c.closed:
			return
		}
	}
	if err := c.write(resp); err != nil {
		c.s.log.Debug("rmqtest: write", "remote", c.RemoteAddr(), "err", err)
	}
}

func (c *conn) write(cmd *remoting.Command) error {
	frame, err := remoting.Encode(cmd)
	if err != nil {
		return err
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Conn.Write(frame)
	return err
}

// push sends a server-initiated request (NOTIFY_CONSUMER_IDS_CHANGED). The
// library answers nothing to it.
func (c *conn) push(req *remoting.Command) {
	req.Opaque = c.s.notifyOpaque.Add(1)
	if err := c.write(req); err != nil {
		c.s.log.Debug("rmqtest: push", "remote", c.RemoteAddr(), "err", err)
	}
}

// connGone unregisters the clients of a closed connection, as a broker does
// on a channel close, and tells the rest of their groups.
func (s *Server) connGone(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	groups := s.st.unregisterConn(c)
	notify := s.groupConnsLocked(groups)
	s.mu.Unlock()
	s.notify(notify)
}

// groupNotice is one NOTIFY_CONSUMER_IDS_CHANGED to send.
type groupNotice struct {
	c     *conn
	group string
}

// groupConnsLocked lists the connections of the remaining consumers of
// groups.
func (s *Server) groupConnsLocked(groups []string) []groupNotice {
	var out []groupNotice
	for _, g := range groups {
		for _, reg := range s.st.groups[g] {
			out = append(out, groupNotice{c: reg.conn, group: g})
		}
	}
	return out
}

func (s *Server) notify(ns []groupNotice) {
	for _, n := range ns {
		n.c.push(remoting.NewRequest(remoting.NotifyConsumerIdsChanged, map[string]string{"consumerGroup": n.group}, nil))
	}
}

// expireClients drops clients that stopped sending heartbeats.
func (s *Server) expireClients(stop chan struct{}) {
	t := time.NewTicker(min(s.opts.ClientTimeout/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			s.mu.Lock()
			groups := s.st.expireClients(now.Add(-s.opts.ClientTimeout))
			notify := s.groupConnsLocked(groups)
			s.mu.Unlock()
			s.notify(notify)
		}
	}
}

// flushOffsets writes the committed offsets to "disk" every
// OffsetFlushInterval, as a broker's scheduled ConsumerOffsetManager.persist
// does.
func (s *Server) flushOffsets(stop chan struct{}) {
	t := time.NewTicker(s.opts.OffsetFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.mu.Lock()
			s.st.flushOffsets()
			s.mu.Unlock()
		}
	}
}

// waitFor blocks until ch is closed, the connection closes, the server stops
// or d passes; it reports whether ch was closed.
func (c *conn) waitFor(ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
	case <-c.closed:
	case <-c.stop:
	}
	return false
}
