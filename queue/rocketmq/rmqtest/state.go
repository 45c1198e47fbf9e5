package rmqtest

import (
	"maps"
	"slices"
	"time"

	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
)

// Topic permissions (PermName): 2 write, 4 read.
const permReadWrite = 6

// Prefixes of a consumer group's retry and dead-letter topics.
const (
	retryPrefix = "%RETRY%"
	dlqPrefix   = "%DLQ%"
)

// state is everything the double stores. Server.mu guards it.
type state struct {
	topics    map[string]*topic
	commitLog int64                      // next commit log offset; one per message
	byCommit  map[int64]*remoting.Record // stored messages by commit log offset, for send-back
	offsets   map[queueKey]int64         // committed consumer offsets
	locks     map[queueKey]lockEntry
	groups    map[string]map[string]*clientReg // consumer group -> client id -> registration
	delayed   []delayedMsg                     // scheduled messages, sorted by due
	scheduled int64                            // sequence of delayed messages, for send results
}

// queueKey names a queue, or a group's view of it when group is set.
type queueKey struct {
	group, topic string
	queue        int
}

type lockEntry struct {
	clientID string
	renewed  time.Time
}

type clientReg struct {
	conn     *conn
	lastSeen time.Time
}

type topic struct {
	name   string
	perm   int
	queues []*queueLog
}

// queueLog is one queue: messages at offsets 0..len-1 and a channel that is
// closed (and replaced) whenever a message is appended, which wakes held
// pulls.
type queueLog struct {
	msgs    []*remoting.Record
	arrived chan struct{}
}

type delayedMsg struct {
	due time.Time
	rec remoting.Record
}

func newState() *state {
	return &state{
		topics:   make(map[string]*topic),
		byCommit: make(map[int64]*remoting.Record),
		offsets:  make(map[queueKey]int64),
		locks:    make(map[queueKey]lockEntry),
		groups:   make(map[string]map[string]*clientReg),
	}
}

// forgetSessions drops what a broker keeps only in memory: locks and client
// registrations.
func (st *state) forgetSessions() {
	clear(st.locks)
	clear(st.groups)
}

// createTopic creates a topic or grows it to n queues.
func (st *state) createTopic(name string, n, perm int) *topic {
	t := st.topics[name]
	if t == nil {
		t = &topic{name: name}
		st.topics[name] = t
	}
	t.perm = perm
	for len(t.queues) < n {
		t.queues = append(t.queues, &queueLog{arrived: make(chan struct{})})
	}
	return t
}

// append stores rec at the end of its queue, assigning the queue and
// commit log offsets, and wakes held pulls.
func (st *state) append(rec remoting.Record) remoting.Record {
	q := st.topics[rec.Topic].queues[rec.QueueID]
	rec.QueueOffset = int64(len(q.msgs))
	rec.CommitLogOffset = st.commitLog
	st.commitLog++
	r := rec
	q.msgs = append(q.msgs, &r)
	st.byCommit[r.CommitLogOffset] = &r
	close(q.arrived)
	q.arrived = make(chan struct{})
	return r
}

// schedule holds rec until due.
func (st *state) schedule(due time.Time, rec remoting.Record) int64 {
	i, _ := slices.BinarySearchFunc(st.delayed, due, func(d delayedMsg, t time.Time) int { return d.due.Compare(t) })
	st.delayed = slices.Insert(st.delayed, i+countEqual(st.delayed[i:], due), delayedMsg{due: due, rec: rec})
	st.scheduled++
	return st.scheduled - 1
}

// countEqual counts the leading entries due at t, so equal times keep their
// arrival order.
func countEqual(ds []delayedMsg, t time.Time) int {
	n := 0
	for n < len(ds) && ds[n].due.Equal(t) {
		n++
	}
	return n
}

// takeDue removes and returns the messages due at now, and the next due
// time (zero if none).
func (st *state) takeDue(now time.Time) ([]remoting.Record, time.Time) {
	var out []remoting.Record
	for len(st.delayed) > 0 && !st.delayed[0].due.After(now) {
		out = append(out, st.delayed[0].rec)
		st.delayed = st.delayed[1:]
	}
	if len(st.delayed) == 0 {
		return out, time.Time{}
	}
	return out, st.delayed[0].due
}

// register records a consumer heartbeat; it reports whether the client is
// new to the group.
func (st *state) register(group, clientID string, c *conn, now time.Time) bool {
	m := st.groups[group]
	if m == nil {
		m = make(map[string]*clientReg)
		st.groups[group] = m
	}
	reg, ok := m[clientID]
	if ok && reg.conn == c {
		reg.lastSeen = now
		return false
	}
	m[clientID] = &clientReg{conn: c, lastSeen: now}
	return !ok
}

// unregister removes a client from a group; it reports whether it was there.
func (st *state) unregister(group, clientID string) bool {
	if _, ok := st.groups[group][clientID]; !ok {
		return false
	}
	delete(st.groups[group], clientID)
	if len(st.groups[group]) == 0 {
		delete(st.groups, group)
	}
	return true
}

// unregisterConn removes the clients registered over c and returns the
// groups that lost a member.
func (st *state) unregisterConn(c *conn) []string {
	var changed []string
	for g, m := range st.groups {
		for id, reg := range m {
			if reg.conn == c {
				delete(m, id)
				changed = append(changed, g)
			}
		}
		if len(m) == 0 {
			delete(st.groups, g)
		}
	}
	return changed
}

// expireClients removes clients last seen before cutoff and returns the
// groups that lost a member.
func (st *state) expireClients(cutoff time.Time) []string {
	var changed []string
	for g, m := range st.groups {
		for id, reg := range m {
			if reg.lastSeen.Before(cutoff) {
				delete(m, id)
				changed = append(changed, g)
			}
		}
		if len(m) == 0 {
			delete(st.groups, g)
		}
	}
	return changed
}

// consumers returns a group's client ids, sorted.
func (st *state) consumers(group string) []string {
	return slices.Sorted(maps.Keys(st.groups[group]))
}

// lock gives the queue to clientID if it is free, expired or already
// clientID's; it reports success.
func (st *state) lock(k queueKey, clientID string, now time.Time, ttl time.Duration) bool {
	e, held := st.locks[k]
	if held && e.clientID != clientID && now.Sub(e.renewed) <= ttl {
		return false
	}
	st.locks[k] = lockEntry{clientID: clientID, renewed: now}
	return true
}

// unlock releases the queue if clientID holds it.
func (st *state) unlock(k queueKey, clientID string) {
	if e, ok := st.locks[k]; ok && e.clientID == clientID {
		delete(st.locks, k)
	}
}
