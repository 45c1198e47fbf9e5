//go:build linux

package notifier

import (
	"errors"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// poller starts a read round when a watched connection turns readable, so an
// idle connection holds no goroutine: one epoll instance and one goroutine
// waiting on it for the whole process. Go's own netpoller keeps its
// registration of the socket; the read round reads through net.Conn as
// usual.
//
// Registrations are one-shot and level-triggered: a round re-arms its
// connection when done, so at most one round runs per connection, and data
// that came meanwhile wakes it again at once.
type poller struct {
	epfd   int
	wakefd int // an eventfd: written to end wait
	ready  func(*conn)
	done   chan struct{}

	mu     sync.Mutex
	byFD   map[int32]*conn
	seq    uint32
	closed bool
}

const watchedEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

func newPoller(ready func(*conn)) (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, err
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wakefd)}); err != nil {
		_ = unix.Close(wakefd)
		_ = unix.Close(epfd)
		return nil, err
	}
	p := &poller{epfd: epfd, wakefd: wakefd, ready: ready, done: make(chan struct{}), byFD: map[int32]*conn{}}
	go p.wait()
	return p, nil
}

func (p *poller) wait() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		for _, ev := range events[:n] {
			if ev.Fd == int32(p.wakefd) {
				return
			}
			// An event read before its connection was removed may name
			// the descriptor's next connection.
			p.mu.Lock()
			c := p.byFD[ev.Fd]
			if c != nil && c.pollSeq != uint32(ev.Pad) {
				c = nil
			}
			p.mu.Unlock()
			if c != nil {
				p.ready(c)
			}
		}
	}
}

// add watches c's socket, armed, and reports whether it could: a connection
// without a socket of its own (TLS buffers what it decrypts) cannot be.
// Called with c.mu held.
func (p *poller) add(c *conn) bool {
	if p == nil {
		return false
	}
	sc, ok := c.ws.NetConn().(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	fd := -1
	if rc.Control(func(s uintptr) { fd = int(s) }) != nil || fd < 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.seq++
	c.fd, c.pollSeq = fd, p.seq
	p.byFD[int32(fd)] = c
	ev := unix.EpollEvent{Events: watchedEvents, Fd: int32(fd), Pad: int32(c.pollSeq)}
	if unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev) != nil {
		delete(p.byFD, int32(fd))
		c.fd = -1
		return false
	}
	return true
}

// rearm watches c again after a read round and reports whether it could.
// Called with c.mu held; a connection it does not watch needs nothing.
func (p *poller) rearm(c *conn) bool {
	if p == nil || c.fd < 0 {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	ev := unix.EpollEvent{Events: watchedEvents, Fd: int32(c.fd), Pad: int32(c.pollSeq)}
	return unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, c.fd, &ev) == nil
}

// remove stops watching c; it must come before the socket is closed. Called
// with c.mu held. It makes no system call: closing the socket takes it out
// of the epoll set (nothing dups the descriptor), and until then an event
// for it finds no connection here; a socket per purchase paid an
// EPOLL_CTL_DEL each.
func (p *poller) remove(c *conn) {
	if p == nil || c.fd < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byFD[int32(c.fd)] == c {
		delete(p.byFD, int32(c.fd))
	}
	c.fd = -1
}

// close ends the waiting goroutine and releases the epoll instance.
func (p *poller) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	var one [8]byte
	one[0] = 1 // eventfd counters are host-endian; any nonzero value wakes
	_, _ = unix.Write(p.wakefd, one[:])
	<-p.done
	_ = unix.Close(p.wakefd)
	_ = unix.Close(p.epfd)
}
