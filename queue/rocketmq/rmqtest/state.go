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
	offsets   map[queueKey]int64         // committed consumer offsets, in memory
	flushed   map[queueKey]int64         // offsets as last flushed to disk: a crash goes back to them
	locks     map[queueKey]lockEntry
	groups    map[string]map[string]*clientReg // consumer group -> client id -> registration
	// delayOffsets is how far each delay level's queue of the schedule
	// topic has been delivered (the broker's delayOffset.json).
	delayOffsets map[int]int64
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
	topics   map[string]bool // subscribed, as of its last heartbeat
}

type topic struct {
	name   string
	perm   int
	queues []*queueLog
}

// queueLog is one queue: messages at offsets min..min+len-1 (those below
// min were trimmed) and a channel that is closed (and replaced) whenever a
// message is appended, which wakes held pulls.
type queueLog struct {
	min     int64
	msgs    []*remoting.Record
	arrived chan struct{}
}

// maxOffset is the offset the next message gets.
func (q *queueLog) maxOffset() int64 { return q.min + int64(len(q.msgs)) }

// at returns the message at offset o, which must be in [min, maxOffset).
func (q *queueLog) at(o int64) *remoting.Record { return q.msgs[o-q.min] }

func newState() *state {
	return &state{
		topics:   make(map[string]*topic),
		byCommit: make(map[int64]*remoting.Record),
		offsets:  make(map[queueKey]int64),
		flushed:  make(map[queueKey]int64),
		locks:    make(map[queueKey]lockEntry),
		groups:   make(map[string]map[string]*clientReg),

		delayOffsets: make(map[int]int64),
	}
}

// forgetSessions drops what a broker keeps only in memory: locks and client
// registrations.
func (st *state) forgetSessions() {
	clear(st.locks)
	clear(st.groups)
}

// flushOffsets writes the committed offsets to "disk", as a broker's
// ConsumerOffsetManager.persist does on a timer and at a clean shutdown.
func (st *state) flushOffsets() {
	clear(st.flushed)
	maps.Copy(st.flushed, st.offsets)
}

// crashOffsets rolls the committed offsets back to the last flush: what a
// broker that died without its shutdown reads from disk at its next start.
func (st *state) crashOffsets() {
	clear(st.offsets)
	maps.Copy(st.offsets, st.flushed)
}

// trim deletes the messages of a queue below offset upto (at most its max
// offset), as a broker's expired commit log files take them away.
func (st *state) trim(q *queueLog, upto int64) {
	upto = min(upto, q.maxOffset())
	for q.min < upto {
		delete(st.byCommit, q.msgs[0].CommitLogOffset)
		q.msgs[0] = nil
		q.msgs = q.msgs[1:]
		q.min++
	}
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
	rec.QueueOffset = q.maxOffset()
	rec.CommitLogOffset = st.commitLog
	st.commitLog++
	r := rec
	q.msgs = append(q.msgs, &r)
	st.byCommit[r.CommitLogOffset] = &r
	close(q.arrived)
	q.arrived = make(chan struct{})
	return r
}

// register records a consumer heartbeat and the topics it subscribes to;
// it reports whether the client is new to the group.
func (st *state) register(group, clientID string, c *conn, topics map[string]bool, now time.Time) bool {
	m := st.groups[group]
	if m == nil {
		m = make(map[string]*clientReg)
		st.groups[group] = m
	}
	reg, ok := m[clientID]
	if ok && reg.conn == c {
		reg.lastSeen, reg.topics = now, topics
		return false
	}
	m[clientID] = &clientReg{conn: c, lastSeen: now, topics: topics}
	return !ok
}

// subscribed reports whether a registered member of group subscribes to
// topic: a broker knows a group's subscriptions only from heartbeats.
func (st *state) subscribed(group, topic string) bool {
	for _, reg := range st.groups[group] {
		if reg.topics[topic] {
			return true
		}
	}
	return false
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
