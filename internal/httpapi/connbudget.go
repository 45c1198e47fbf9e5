package httpapi

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// ConnBudgetOptions bound a listener's open connections (ConnBudget).
type ConnBudgetOptions struct {
	// MaxConns is the most connections the listener keeps open,
	// WebSockets included (they start as its connections): the process's
	// descriptor limit less a reserve for the admin listener, the Redis and
	// MySQL pools and files.
	MaxConns int
	// MaxConnsPerIP is the most one client address keeps open (0: no
	// bound). The address is the TCP peer's: behind a load balancer every
	// connection is the balancer's, so Exempt names it.
	MaxConnsPerIP int
	// Exempt reports whether an address is exempt from MaxConnsPerIP (the
	// trusted proxies). Nil: none is.
	Exempt func(netip.Addr) bool
	// SlowHeader is how long a connection may take to send its first
	// request before, at MaxConns, it may be cut to make room (a slowloris
	// holds connections that never finish a header). Default 1s.
	SlowHeader time.Duration
	// Observe is told each event: "refused" with reason "per_ip",
	// "process" or "fd_limit" (the accept itself failed: the process is out
	// of descriptors), and "closed" with reason "idle" or "slow_header".
	// Nil: nothing is told.
	Observe func(event, reason string)
}

// ConnBudget keeps a listener's connections within MaxConns, and each
// client address's within MaxConnsPerIP, so that a flood of idle or slow
// connections cannot take every descriptor: health checks, the admin
// listener and other clients keep being answered. At MaxConns it makes
// room by closing the connection idle longest between requests, else one
// that has not sent its first request within SlowHeader; when none is, the
// new connection is refused. A refused connection gets a 503 (429 when its
// address is at its bound) written at once and is closed. Install it with
// Listener and, on the http.Server, ConnState and Handler.
type ConnBudget struct {
	opts ConnBudgetOptions

	mu    sync.Mutex
	open  int
	perIP map[netip.Addr]int
	idle  list.List // *budgetConn, idle longest first
	fresh list.List // *budgetConn not served a request yet, oldest first
}

// NewConnBudget returns a ConnBudget.
func NewConnBudget(opts ConnBudgetOptions) *ConnBudget {
	if opts.SlowHeader <= 0 {
		opts.SlowHeader = time.Second
	}
	if opts.Observe == nil {
		opts.Observe = func(string, string) {}
	}
	b := &ConnBudget{opts: opts, perIP: map[netip.Addr]int{}}
	b.idle.Init()
	b.fresh.Init()
	return b
}

// Open returns the connections open now.
func (b *ConnBudget) Open() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// The answers to a refused connection, written before any request is read.
var (
	refusedProcess = refusal(http.StatusServiceUnavailable, "unavailable", "too many open connections, try again")
	refusedPerIP   = refusal(http.StatusTooManyRequests, "too_many_connections", "too many open connections from this address")
)

func refusal(status int, code, message string) []byte {
	body := fmt.Sprintf(`{"code":%q,"message":%q}`, code, message)
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}

// Listener wraps ln: its Accept returns only connections within the
// budget.
func (b *ConnBudget) Listener(ln net.Listener) net.Listener {
	return &budgetListener{Listener: ln, b: b}
}

type budgetListener struct {
	net.Listener
	b *ConnBudget
}

func (l *budgetListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				l.b.opts.Observe("refused", "fd_limit")
			}
			return nil, err // http.Server backs off on a temporary error
		}
		if bc := l.b.admit(c); bc != nil {
			return bc, nil
		}
	}
}

// admit counts c in, making room at MaxConns, or refuses it (nil).
func (b *ConnBudget) admit(c net.Conn) *budgetConn {
	var ip netip.Addr
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip = a.AddrPort().Addr().Unmap()
	}
	bc := &budgetConn{Conn: c, b: b, ip: ip, accepted: time.Now()}
	var evict *budgetConn
	var reason string
	b.mu.Lock()
	perIP := b.opts.MaxConnsPerIP > 0 && ip.IsValid() && (b.opts.Exempt == nil || !b.opts.Exempt(ip))
	switch {
	case perIP && b.perIP[ip] >= b.opts.MaxConnsPerIP:
		b.mu.Unlock()
		b.refuse(c, refusedPerIP, "per_ip")
		return nil
	case b.open >= b.opts.MaxConns:
		evict, reason = b.victimLocked(bc.accepted)
		if evict == nil {
			b.mu.Unlock()
			b.refuse(c, refusedProcess, "process")
			return nil
		}
		// Counted out now, so the room is this connection's whatever the
		// victim's Close does.
		b.releaseLocked(evict)
	}
	b.open++
	if ip.IsValid() {
		b.perIP[ip]++
	}
	bc.counted = true
	bc.elem = b.fresh.PushBack(bc)
	b.mu.Unlock()
	if evict != nil {
		b.opts.Observe("closed", reason)
		_ = evict.Conn.Close()
	}
	return bc
}

// victimLocked picks the connection to close for room: the one idle
// longest, else the oldest that has not sent its first request within
// SlowHeader.
func (b *ConnBudget) victimLocked(now time.Time) (*budgetConn, string) {
	if e := b.idle.Front(); e != nil {
		return e.Value.(*budgetConn), "idle"
	}
	if e := b.fresh.Front(); e != nil {
		if c := e.Value.(*budgetConn); now.Sub(c.accepted) >= b.opts.SlowHeader {
			return c, "slow_header"
		}
	}
	return nil, ""
}

func (b *ConnBudget) refuse(c net.Conn, answer []byte, reason string) {
	b.opts.Observe("refused", reason)
	// A new connection's send buffer is empty: the write does not wait.
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(answer)
	_ = c.Close()
}

// releaseLocked counts c out, once.
func (b *ConnBudget) releaseLocked(c *budgetConn) {
	if !c.counted {
		return
	}
	c.counted = false
	b.open--
	if c.ip.IsValid() {
		if b.perIP[c.ip]--; b.perIP[c.ip] <= 0 {
			delete(b.perIP, c.ip)
		}
	}
	b.unlistLocked(c)
}

func (b *ConnBudget) unlistLocked(c *budgetConn) {
	if c.elem != nil {
		c.list().Remove(c.elem)
		c.elem = nil
	}
}

// ConnState is the http.Server's ConnState hook: a connection waiting for
// its next request is idle (the first to close for room); one that is
// hijacked (a WebSocket) or active is neither idle nor fresh.
func (b *ConnBudget) ConnState(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*budgetConn)
	if !ok {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !c.counted {
		return
	}
	switch state {
	case http.StateIdle:
		b.unlistLocked(c)
		c.served, c.idleList = true, true
		c.elem = b.idle.PushBack(c)
	case http.StateActive:
		if c.idleList {
			b.unlistLocked(c)
		}
	case http.StateHijacked:
		b.unlistLocked(c)
	}
}

type connKey struct{}

// ConnContext is the http.Server's ConnContext hook: it lets Handler find
// a request's connection.
func (b *ConnBudget) ConnContext(ctx context.Context, nc net.Conn) context.Context {
	if c, ok := nc.(*budgetConn); ok {
		return context.WithValue(ctx, connKey{}, c)
	}
	return ctx
}

// Handler marks a request's connection served as its handler starts: it
// sent a whole header, so it is no longer a slow one to cut.
func (b *ConnBudget) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// served is written only on the connection's own goroutine (its
		// handler and its Idle state), so this read needs no lock.
		if c, ok := r.Context().Value(connKey{}).(*budgetConn); ok && !c.served {
			b.mu.Lock()
			if !c.served && c.counted {
				c.served = true
				if !c.idleList {
					b.unlistLocked(c)
				}
			}
			b.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

// budgetConn is a connection counted in a ConnBudget until it closes.
type budgetConn struct {
	net.Conn
	b        *ConnBudget
	ip       netip.Addr
	accepted time.Time

	// Guarded by b.mu.
	counted  bool
	served   bool          // a request's handler ran
	idleList bool          // elem is in b.idle, else in b.fresh
	elem     *list.Element // nil when in neither list
}

func (c *budgetConn) list() *list.List {
	if c.idleList {
		return &c.b.idle
	}
	return &c.b.fresh
}

func (c *budgetConn) Close() error {
	c.b.mu.Lock()
	c.b.releaseLocked(c)
	c.b.mu.Unlock()
	return c.Conn.Close()
}

// SyscallConn lets the notifier's poller watch a WebSocket's descriptor.
func (c *budgetConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// CloseWrite lets net/http close a connection gracefully (a half close
// before the close).
func (c *budgetConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
