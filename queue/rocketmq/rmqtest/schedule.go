package rmqtest

import (
	"maps"
	"strconv"
	"time"

	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
)

// Delayed messages, as a 4.9.4 broker keeps them (CommitLog.asyncPutMessage
// and ScheduleMessageService; queue/rocketmq/README.md, "Delay levels"): stored at
// once in the schedule topic, one queue per level, and moved to their real
// topic and queue as new messages when due.

// ScheduleTopic is the broker's schedule topic (RMQ_SYS_SCHEDULE_TOPIC):
// delay level L is its queue L-1. Its messages keep DELAY, REAL_TOPIC and
// REAL_QID, and stay after delivery, as in a broker until it trims old
// files; Messages shows them.
const ScheduleTopic = "SCHEDULE_TOPIC_XXXX"

// putLocked stores rec as a broker's commit log does. A message with a DELAY
// level above 0 goes to the schedule topic instead, its level clamped to the
// largest, its topic and queue kept in REAL_TOPIC and REAL_QID. Call with
// s.mu held.
func (s *Server) putLocked(rec remoting.Record) remoting.Record {
	level, _ := strconv.Atoi(rec.Properties[remoting.PropDelayLevel])
	if level <= 0 {
		return s.st.append(rec)
	}
	level = min(level, len(s.opts.DelayLevels))
	rec.Properties = maps.Clone(rec.Properties)
	rec.Properties[remoting.PropDelayLevel] = strconv.Itoa(level)
	rec.Properties[remoting.PropRealTopic] = rec.Topic
	rec.Properties[remoting.PropRealQueueID] = remoting.Itoa(rec.QueueID)
	rec.Topic, rec.QueueID = ScheduleTopic, int32(level-1)
	s.st.createTopic(ScheduleTopic, len(s.opts.DelayLevels), permReadWrite)
	stored := s.st.append(rec)
	s.signalScheduler()
	return stored
}

// signalScheduler wakes the delivery loop; call with s.mu held.
func (s *Server) signalScheduler() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// deliverDelayed is the broker's schedule service: it sleeps until the next
// delayed message is due (or a new one arrives) and delivers what is due.
func (s *Server) deliverDelayed(stop, wake chan struct{}) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		next := s.deliverDueLocked(time.Now())
		s.mu.Unlock()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-stop:
			return
		case <-wake:
		case <-timer.C:
		}
	}
}

// deliverDueLocked walks each level's queue of the schedule topic from the
// level's delivery offset, delivers every message due at now, in order, and
// stops at the first one not due yet: the rest of that queue, stored later
// with the same delay, is due later. It returns the earliest time a message
// still waiting is due (zero if none). The offsets are the broker's
// delayOffset.json, so they outlive a Restart that keeps the state. Call with
// s.mu held.
func (s *Server) deliverDueLocked(now time.Time) (next time.Time) {
	t := s.st.topics[ScheduleTopic]
	if t == nil {
		return time.Time{}
	}
	for qid, q := range t.queues {
		level := qid + 1
		if level > len(s.opts.DelayLevels) {
			continue
		}
		delay := s.opts.DelayLevels[level-1]
		off := max(s.st.delayOffsets[level], q.min)
		for ; off < q.maxOffset(); off++ {
			rec := q.at(off)
			due := time.UnixMilli(rec.StoreTimestamp).Add(delay)
			if due.After(now.Add(delay)) {
				due = now // the clock went back; the broker corrects it so
			}
			// Store timestamps are whole milliseconds: one more keeps a
			// message from coming before its send plus the delay (the
			// broker, checking every 100 ms, comes later still).
			due = due.Add(time.Millisecond)
			if due.After(now) {
				if next.IsZero() || due.Before(next) {
					next = due
				}
				break
			}
			s.deliverLocked(rec, now)
		}
		s.st.delayOffsets[level] = off
	}
	return next
}

// deliverLocked stores a due message as a new message (new offsets, new
// store time) in its real topic and queue, without DELAY; REAL_TOPIC and
// REAL_QID stay, as on the broker. A real queue the double does not have
// (its topic was never created) drops the message: a broker would store it
// in a queue no route names.
func (s *Server) deliverLocked(rec *remoting.Record, now time.Time) {
	out := *rec
	out.Properties = maps.Clone(rec.Properties)
	delete(out.Properties, remoting.PropDelayLevel)
	out.Topic = rec.Properties[remoting.PropRealTopic]
	qid, err := strconv.Atoi(rec.Properties[remoting.PropRealQueueID])
	t := s.st.topics[out.Topic]
	if err != nil || t == nil || qid < 0 || qid >= len(t.queues) {
		s.log.Warn("rmqtest: delayed message for a queue that does not exist", "topic", out.Topic, "queue", rec.Properties[remoting.PropRealQueueID])
		return
	}
	out.QueueID = int32(qid)
	out.StoreTimestamp = now.UnixMilli()
	s.st.append(out)
}
