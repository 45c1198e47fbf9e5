package notifier

import (
	"sync"
	"time"
)

// pinger visits every connection each half ping interval with one timer for
// the whole process: connections wait in a list in the order of their next
// visit (every visit is the same period away, so appending keeps it sorted),
// and a tick costs only the visits due.
type pinger struct {
	period time.Duration
	clock  func() time.Duration
	visit  func(c *conn, now time.Duration)

	mu         sync.Mutex
	head, tail *conn
	timer      *time.Timer
	stopped    bool
}

func newPinger(period time.Duration, clock func() time.Duration, visit func(*conn, time.Duration)) *pinger {
	p := &pinger{period: period, clock: clock, visit: visit}
	p.timer = time.AfterFunc(time.Hour, p.tick)
	p.timer.Stop()
	return p
}

// add lists c for a visit one period after now.
func (p *pinger) add(c *conn, now time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || c.pingListed {
		return
	}
	wasEmpty := p.head == nil
	p.appendLocked(c, now+p.period)
	if wasEmpty {
		p.timer.Reset(p.period)
	}
}

func (p *pinger) appendLocked(c *conn, at time.Duration) {
	c.pingAt, c.pingListed = at, true
	c.pingPrev, c.pingNext = p.tail, nil
	if p.tail != nil {
		p.tail.pingNext = c
	} else {
		p.head = c
	}
	p.tail = c
}

func (p *pinger) remove(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeLocked(c)
}

func (p *pinger) removeLocked(c *conn) {
	if !c.pingListed {
		return
	}
	if c.pingPrev != nil {
		c.pingPrev.pingNext = c.pingNext
	} else {
		p.head = c.pingNext
	}
	if c.pingNext != nil {
		c.pingNext.pingPrev = c.pingPrev
	} else {
		p.tail = c.pingPrev
	}
	c.pingPrev, c.pingNext, c.pingListed = nil, nil, false
}

// tick visits the connections due, and those due within an eighth of a
// period so that one tick serves many, and moves them to the end.
func (p *pinger) tick() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	now := p.clock()
	var due []*conn
	for c := p.head; c != nil && c.pingAt <= now+p.period/8; c = p.head {
		p.removeLocked(c)
		p.appendLocked(c, now+p.period)
		due = append(due, c)
	}
	if p.head != nil {
		p.timer.Reset(max(0, p.head.pingAt-now))
	}
	p.mu.Unlock()
	for _, c := range due {
		p.visit(c, now)
	}
}

func (p *pinger) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	p.timer.Stop()
}
