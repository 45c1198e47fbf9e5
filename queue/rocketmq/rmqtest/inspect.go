package rmqtest

import (
	"maps"
	"slices"
	"time"

	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
)

// Message is a stored message, as tests inspect it.
type Message struct {
	Topic          string
	QueueID        int
	QueueOffset    int64
	Body           []byte
	Properties     map[string]string
	ReconsumeTimes int
	Stored         time.Time
}

// Keys returns the message's KEYS property (the driver puts the request id
// there).
func (m Message) Keys() string { return m.Properties[remoting.PropKeys] }

func toMessage(r *remoting.Record) Message {
	return Message{
		Topic: r.Topic, QueueID: int(r.QueueID), QueueOffset: r.QueueOffset,
		Body: slices.Clone(r.Body), Properties: maps.Clone(r.Properties),
		ReconsumeTimes: int(r.ReconsumeTimes), Stored: time.UnixMilli(r.StoreTimestamp),
	}
}

// CreateTopic creates a topic with n read and write queues, or grows an
// existing one to n, as `mqadmin updateTopic` does on a real cluster.
func (s *Server) CreateTopic(topic string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.createTopic(topic, n, permReadWrite)
}

// Queues returns the number of queues of topic (0 if it does not exist).
func (s *Server) Queues(topic string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.st.topics[topic]; t != nil {
		return len(t.queues)
	}
	return 0
}

// Messages returns the messages stored in one queue (those not trimmed), in
// offset order.
func (s *Server) Messages(topic string, queueID int) []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.st.topics[topic]
	if t == nil || queueID < 0 || queueID >= len(t.queues) {
		return nil
	}
	out := make([]Message, len(t.queues[queueID].msgs))
	for i, r := range t.queues[queueID].msgs {
		out[i] = toMessage(r)
	}
	return out
}

// AllMessages returns the messages of every queue of topic, queue by queue.
func (s *Server) AllMessages(topic string) []Message {
	var out []Message
	for q := range s.Queues(topic) {
		out = append(out, s.Messages(topic, q)...)
	}
	return out
}

// DLQ returns the dead-letter messages of a consumer group.
func (s *Server) DLQ(group string) []Message { return s.Messages(dlqPrefix+group, 0) }

// Retries returns the messages sent back to a consumer group's retry topic
// and already due.
func (s *Server) Retries(group string) []Message { return s.Messages(retryPrefix+group, 0) }

// Scheduled returns how many delayed messages wait in the schedule topic
// (SCHEDULE_TOPIC_XXXX) for delivery.
func (s *Server) Scheduled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.st.topics[ScheduleTopic]
	if t == nil {
		return 0
	}
	n := 0
	for qid, q := range t.queues {
		n += int(q.maxOffset() - max(s.st.delayOffsets[qid+1], q.min))
	}
	return n
}

// CommittedOffset returns the offset group committed for a queue.
func (s *Server) CommittedOffset(group, topic string, queueID int) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	off, ok := s.st.offsets[queueKey{group: group, topic: topic, queue: queueID}]
	return off, ok
}

// FlushedOffset returns a queue's offset for group as last flushed to disk:
// what a Crash goes back to.
func (s *Server) FlushedOffset(group, topic string, queueID int) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	off, ok := s.st.flushed[queueKey{group: group, topic: topic, queue: queueID}]
	return off, ok
}

// Trim deletes a queue's messages below offset upto, as a broker deletes
// commit log files past their retention (fileReservedTime): the queue's min
// offset becomes upto (at most its max offset). Consumers behind it are
// moved up (PULL_OFFSET_MOVED), and a group that committed nothing for the
// queue gets QUERY_NOT_FOUND for its offset.
func (s *Server) Trim(topic string, queueID int, upto int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.st.topics[topic]; t != nil && queueID >= 0 && queueID < len(t.queues) {
		s.st.trim(t.queues[queueID], upto)
	}
}

// Consumers returns the client ids registered in a consumer group, sorted.
func (s *Server) Consumers(group string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.consumers(group)
}

// LockOwner returns the client id holding a queue's lock for group, or ""
// if it is free or expired.
func (s *Server) LockOwner(group, topic string, queueID int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.st.locks[queueKey{group: group, topic: topic, queue: queueID}]
	if !ok || time.Since(e.renewed) > s.opts.LockTTL {
		return ""
	}
	return e.clientID
}
