package notifier

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/model"
)

// subState is where a subscription is in its life. Every transition happens
// under hub.mu, which is what makes delivery exactly once: whichever path
// (publication, the first stored read, a re-check) moves a subscription to
// subDone is the only one that sends its result.
type subState int

const (
	// subPending: registered, its stored result is being read. A final
	// result published now is stashed, and handed over when the read ends.
	subPending subState = iota
	// subActive: verified as the caller's (or, Redis down, not disproved)
	// and waiting for a final result.
	subActive
	// subDone: result handed over, or subscription refused or dropped.
	subDone
)

// subscription is one connection waiting on one request id.
type subscription struct {
	requestID string
	userID    string
	conn      *conn
	state     subState      // guarded by hub.mu
	stash     *model.Result // guarded by hub.mu
	// ended is set with subDone, before a result frame is queued: a
	// progress frame queued after it would follow the result (progress.go).
	ended atomic.Bool
}

// entry holds the subscriptions of one request id (a shopper may have two
// tabs open).
type entry struct {
	requestID string
	subs      map[*subscription]struct{}
	// active counts the subscriptions in subActive; the entry is in the
	// hub's check order while it is above zero.
	active int
	// checked is when the stored result was last read for these
	// subscriptions; the re-check loop reads the oldest first.
	checked time.Time
	// prev and next link the hub's check order.
	prev, next *entry
	// seq is the request's admission sequence number, 0 when unknown; ahead
	// the last count of requests before it sent in a progress frame, -1
	// before the first (owned by the progress loop).
	seq   int64
	ahead int64
	// fresh marks a subscription activated since the last progress round:
	// it gets a frame even when the count did not move.
	fresh bool
}

// hub indexes the process's subscriptions by request id.
type hub struct {
	mu   sync.Mutex
	byID map[string]*entry
	// oldest and newest end the entries with an active subscription, in
	// the order of their checked times: due walks from the front and stops
	// at the first entry not yet due, so a tick costs what is due, not what
	// waits.
	oldest, newest *entry
	// subscriptions follows the number of subscriptions, when set.
	subscriptions prometheus.Gauge
	// dueVisits counts the entries due has looked at (tests check that a
	// tick walks no further than what is due).
	dueVisits int
	// activations counts subscriptions turned active: the progress loop
	// walks the waiting entries only when it moved or a campaign's
	// decisions did.
	activations uint64
	// tags counts the request ids with subscriptions per tag (a campaign,
	// or a bucket of one: model.TagOfRequest): the results channels the
	// notifier needs (feeds.go).
	tags map[string]int
}

// activationCount returns how many subscriptions have turned active.
func (h *hub) activationCount() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.activations
}

func newHub() *hub { return &hub{byID: map[string]*entry{}, tags: map[string]int{}} }

// tagsWaitedOn returns the tags with a subscription.
func (h *hub) tagsWaitedOn() map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]bool, len(h.tags))
	for c := range h.tags {
		out[c] = true
	}
	return out
}

// waitingOn returns the request ids of tag with an active subscription.
func (h *hub) waitingOn(tag string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []string
	for id, e := range h.byID {
		if t, _ := model.TagOfRequest(id); t == tag && e.active > 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

// add registers pending subscriptions of c for ids (valid, distinct) in
// order, as long as c stays within limit subscriptions. It returns the new
// subscriptions, the ids c already waits on, and the ids over the cap.
func (h *hub) add(c *conn, ids []string, limit int) (added []*subscription, existing, over []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		if _, ok := c.subs[id]; ok {
			existing = append(existing, id)
			continue
		}
		if len(c.subs) >= limit {
			over = append(over, id)
			continue
		}
		s := &subscription{requestID: id, userID: c.userID, conn: c}
		c.subs[id] = s
		e := h.byID[id]
		if e == nil {
			e = &entry{requestID: id, subs: map[*subscription]struct{}{}, ahead: -1}
			h.byID[id] = e
			tag, _ := model.TagOfRequest(id)
			h.tags[tag]++
		}
		e.subs[s] = struct{}{}
		added = append(added, s)
	}
	if h.subscriptions != nil {
		h.subscriptions.Add(float64(len(added)))
	}
	return added, existing, over
}

// activate ends the pending state of s once its stored result r was read
// and found to be the caller's (or stands in for one: decidedOrWaiting).
// It returns the result to send when r is
// final or a final result was published meanwhile; then s is done.
func (h *hub) activate(s *subscription, r model.Result, now time.Time) (model.Result, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.state != subPending {
		return model.Result{}, false
	}
	switch {
	case r.Status.Final():
		h.removeLocked(s)
		return r, true
	case s.stash != nil:
		h.removeLocked(s)
		return *s.stash, true
	}
	s.state = subActive
	e := h.byID[s.requestID]
	if r.Seq > 0 {
		e.seq = r.Seq
	}
	e.active++
	e.fresh = true
	h.activations++
	h.checkedLocked(e, now)
	return model.Result{}, false
}

// cancel removes a subscription that was refused.
func (h *hub) cancel(s *subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.state != subDone {
		h.removeLocked(s)
	}
}

// publish hands the final result r to every active subscription of its
// request, removing them, and stashes r for the pending ones. The caller
// sends r to the returned subscriptions. A subscription may turn active
// with nothing proving it the caller's (Redis was down, or had nothing for
// its request), so a result naming another user is never handed over; the
// re-check tells such a waiter not_found (settle).
func (h *hub) publish(r model.Result) []*subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.byID[r.RequestID]
	if e == nil {
		return nil
	}
	var out []*subscription
	for s := range e.subs {
		if r.UserID != "" && r.UserID != s.userID {
			continue
		}
		switch s.state {
		case subPending:
			s.stash = &r
		case subActive:
			out = append(out, s)
		}
	}
	for _, s := range out {
		h.removeLocked(s)
	}
	return out
}

// activeUser returns the user of an active subscription of id.
func (h *hub) activeUser(id string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.byID[id]; e != nil {
		for s := range e.subs {
			if s.state == subActive {
				return s.userID, true
			}
		}
	}
	return "", false
}

// dropActive removes and returns the active subscriptions of id.
func (h *hub) dropActive(id string) []*subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.byID[id]
	if e == nil {
		return nil
	}
	var out []*subscription
	for s := range e.subs {
		if s.state == subActive {
			out = append(out, s)
		}
	}
	for _, s := range out {
		h.removeLocked(s)
	}
	return out
}

// removeConn removes every subscription of a closed connection.
func (h *hub) removeConn(c *conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range c.subs {
		h.removeLocked(s)
	}
}

func (h *hub) removeLocked(s *subscription) {
	wasActive := s.state == subActive
	s.state = subDone
	s.ended.Store(true)
	if h.subscriptions != nil {
		h.subscriptions.Dec()
	}
	if s.conn.subs[s.requestID] == s {
		delete(s.conn.subs, s.requestID)
	}
	e := h.byID[s.requestID]
	if e == nil {
		return
	}
	delete(e.subs, s)
	if wasActive {
		if e.active--; e.active == 0 {
			h.unlinkLocked(e)
		}
	}
	if len(e.subs) == 0 {
		delete(h.byID, s.requestID)
		tag, _ := model.TagOfRequest(s.requestID)
		if h.tags[tag]--; h.tags[tag] <= 0 {
			delete(h.tags, tag)
		}
	}
}

// checkedLocked records that the stored result of e was read at now and
// moves e to the back of the check order. A time older than the newest
// entry's (two goroutines' clocks read out of order) takes the newest's,
// so the order stays sorted.
func (h *hub) checkedLocked(e *entry, now time.Time) {
	h.unlinkLocked(e)
	if h.newest != nil && now.Before(h.newest.checked) {
		now = h.newest.checked
	}
	e.checked = now
	e.prev = h.newest
	if h.newest != nil {
		h.newest.next = e
	} else {
		h.oldest = e
	}
	h.newest = e
}

func (h *hub) unlinkLocked(e *entry) {
	if e.prev == nil && h.oldest != e {
		return // not linked
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		h.oldest = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		h.newest = e.prev
	}
	e.prev, e.next = nil, nil
}

// due returns up to limit request ids with an active subscription whose
// stored result was last read at or before cutoff, least recently read first.
func (h *hub) due(cutoff time.Time, limit int) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []string
	for e := h.oldest; e != nil && len(ids) < limit; e = e.next {
		h.dueVisits++
		if e.checked.After(cutoff) {
			break
		}
		ids = append(ids, e.requestID)
	}
	return ids
}

// touch records that the stored results of ids were read at now, for the
// ids that still have an active subscription.
func (h *hub) touch(ids []string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		if e := h.byID[id]; e != nil && e.active > 0 {
			h.checkedLocked(e, now)
		}
	}
}

// size returns the number of request ids with subscriptions (for tests).
func (h *hub) size() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byID)
}
