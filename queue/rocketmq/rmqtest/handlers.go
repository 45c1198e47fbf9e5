package rmqtest

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
)

// dispatch handles one request and returns its response (nil: none).
func (s *Server) dispatch(c *conn, req *remoting.Command) *remoting.Command {
	s.log.Debug("rmqtest: request", "code", req.Code, "ext", req.ExtFields)
	switch req.Code {
	case remoting.GetRouteInfoByTopic:
		return s.route(c, req)
	case remoting.HeartBeat:
		return s.heartbeat(c, req)
	case remoting.UnregisterClient:
		return s.unregisterClient(req)
	case remoting.SendMessage:
		return s.send(c, req)
	case remoting.SendBatchMessage:
		return s.sendBatch(c, req)
	case remoting.PullMessage:
		return s.pull(c, req)
	case remoting.QueryConsumerOffset:
		return s.queryOffset(req)
	case remoting.UpdateConsumerOffset:
		return s.updateOffset(req)
	case remoting.GetMaxOffset, remoting.GetMinOffset, remoting.SearchOffsetByTimestamp:
		return s.offsetBound(req)
	case remoting.GetConsumerListByGroup:
		return s.consumerList(req)
	case remoting.LockBatchMQ:
		return s.lockBatch(req)
	case remoting.UnlockBatchMQ:
		return s.unlockBatch(req)
	case remoting.ConsumerSendMsgBack:
		return s.sendBack(req)
	case remoting.UpdateAndCreateTopic:
		return s.createTopicRequest(req)
	}
	return remoting.NewResponse(req, remoting.RequestCodeNotSupported, fmt.Sprintf("request code %d not supported by rmqtest", req.Code))
}

func bad(req *remoting.Command, format string, args ...any) *remoting.Command {
	return remoting.NewResponse(req, remoting.SystemError, fmt.Sprintf(format, args...))
}

func extInt(req *remoting.Command, key string) (int64, error) {
	v, err := strconv.ParseInt(req.Ext(key), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("extFields[%s] = %q: %w", key, req.Ext(key), err)
	}
	return v, nil
}

// route answers GET_ROUTEINFO_BY_TOPIC. The broker address is the one the
// client dialed, so a client that came in through a Listener stays on it.
// The body's JSON dialect depends on the request, as on a 4.9.4 name server
// (see remoting.WantsStandardJSON), or is always fastjson's with
// Options.LegacyRoutes.
func (s *Server) route(c *conn, req *remoting.Command) *remoting.Command {
	name := req.Ext("topic")
	s.mu.Lock()
	t := s.st.topics[name]
	var n, perm int
	if t != nil {
		n, perm = len(t.queues), t.perm
	}
	s.mu.Unlock()
	if t == nil {
		return remoting.NewResponse(req, remoting.TopicNotExist, "No topic route info in name server for the topic: "+name)
	}
	r := remoting.TopicRoute{
		BrokerDatas: []remoting.BrokerData{{
			BrokerAddrs: map[int64]string{remoting.MasterID: c.local.String()}, BrokerName: s.opts.BrokerName, Cluster: s.opts.Cluster,
		}},
		QueueDatas: []remoting.QueueData{{BrokerName: s.opts.BrokerName, Perm: perm, ReadQueueNums: n, WriteQueueNums: n}},
	}
	body, err := r.Encode(!s.opts.LegacyRoutes && remoting.WantsStandardJSON(req))
	if err != nil {
		return bad(req, "encode route: %v", err)
	}
	resp := remoting.NewResponse(req, remoting.Success, "")
	resp.Body = body
	return resp
}

// heartbeatData is the HEART_BEAT body.
type heartbeatData struct {
	ClientID  string `json:"clientID"`
	Consumers []struct {
		GroupName     string `json:"groupName"`
		MessageModel  string `json:"messageModel"`
		Subscriptions []struct {
			Topic string `json:"topic"`
		} `json:"subscriptionDataSet"`
	} `json:"consumerDataSet"`
}

// heartbeat registers the client's consumer groups, creates their retry
// topics and tells each group about a new member.
func (s *Server) heartbeat(c *conn, req *remoting.Command) *remoting.Command {
	var hb heartbeatData
	if err := json.Unmarshal(req.Body, &hb); err != nil {
		return bad(req, "heartbeat body: %v", err)
	}
	now := time.Now()
	s.mu.Lock()
	var changed []string
	for _, cd := range hb.Consumers {
		topics := make(map[string]bool, len(cd.Subscriptions))
		for _, sub := range cd.Subscriptions {
			topics[sub.Topic] = true
		}
		if s.st.register(cd.GroupName, hb.ClientID, c, topics, now) {
			changed = append(changed, cd.GroupName)
		}
		if _, ok := s.st.topics[retryPrefix+cd.GroupName]; !ok && !strings.EqualFold(cd.MessageModel, "BROADCASTING") {
			s.st.createTopic(retryPrefix+cd.GroupName, 1, permReadWrite)
		}
	}
	notify := s.groupConnsLocked(changed)
	s.mu.Unlock()
	s.notify(notify)
	return remoting.NewResponse(req, remoting.Success, "")
}

func (s *Server) unregisterClient(req *remoting.Command) *remoting.Command {
	s.mu.Lock()
	var notify []groupNotice
	if g := req.Ext("consumerGroup"); g != "" && s.st.unregister(g, req.Ext("clientID")) {
		notify = s.groupConnsLocked([]string{g})
	}
	s.mu.Unlock()
	s.notify(notify)
	return remoting.NewResponse(req, remoting.Success, "")
}

// sendHeader is the part of SEND_MESSAGE's and SEND_BATCH_MESSAGE's headers
// the double uses.
type sendHeader struct {
	topic, defaultTopic string
	queueID             int
	defaultQueues       int
	sysFlag, flag       int32
	bornTimestamp       int64
	properties          map[string]string
}

func parseSend(req *remoting.Command, batch bool) (sendHeader, error) {
	key := func(long, short string) string {
		if batch {
			return req.Ext(short)
		}
		return req.Ext(long)
	}
	var h sendHeader
	h.topic = key("topic", "b")
	h.defaultTopic = key("defaultTopic", "c")
	ints := []struct {
		value string // as sent; absent fields keep their zero value
		set   func(int64)
	}{
		{key("queueId", "e"), func(v int64) { h.queueID = int(v) }},
		{key("sysFlag", "f"), func(v int64) { h.sysFlag = int32(v) }},
		{key("bornTimestamp", "g"), func(v int64) { h.bornTimestamp = v }},
		{key("flag", "h"), func(v int64) { h.flag = int32(v) }},
		{key("defaultTopicQueueNums", "d"), func(v int64) { h.defaultQueues = int(v) }},
	}
	for _, f := range ints {
		if f.value == "" {
			continue
		}
		v, err := strconv.ParseInt(f.value, 10, 64)
		if err != nil {
			return h, fmt.Errorf("send header: %w", err)
		}
		f.set(v)
	}
	if h.topic == "" {
		return h, fmt.Errorf("send header: no topic")
	}
	h.properties = remoting.DecodeProperties(key("properties", "i"))
	return h, nil
}

// topicForSendLocked returns the topic's queue count, creating the topic through
// the default topic when auto-creation is on; ok false means it does not
// exist. Call with s.mu held.
func (s *Server) topicForSendLocked(h sendHeader) (int, bool) {
	if t := s.st.topics[h.topic]; t != nil {
		return len(t.queues), true
	}
	if !s.opts.AutoCreateTopics || h.defaultTopic != defaultTopic || s.st.topics[defaultTopic] == nil {
		return 0, false
	}
	n := s.opts.DefaultQueues
	if h.defaultQueues > 0 {
		n = min(n, h.defaultQueues)
	}
	return len(s.st.createTopic(h.topic, n, permReadWrite).queues), true
}

func (s *Server) newRecord(c *conn, h sendHeader, body []byte, props map[string]string, flag int32) remoting.Record {
	now := time.Now()
	return remoting.Record{
		Topic: h.topic, QueueID: int32(h.queueID), Flag: flag, SysFlag: h.sysFlag,
		BornTimestamp: h.bornTimestamp, BornHost: tcpAddr(c.RemoteAddr()),
		StoreTimestamp: now.UnixMilli(), StoreHost: c.local,
		Body: body, Properties: props,
	}
}

func tcpAddr(a net.Addr) *net.TCPAddr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t
	}
	return nil
}

// send answers SEND_MESSAGE. A message with a DELAY property waits in the
// schedule topic and enters its queue when due, as on a broker (schedule.go).
func (s *Server) send(c *conn, req *remoting.Command) *remoting.Command {
	h, err := parseSend(req, false)
	if err != nil {
		return bad(req, "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.topicForSendLocked(h)
	if !ok {
		return remoting.NewResponse(req, remoting.TopicNotExist, "topic["+h.topic+"] not exist, apply first please!")
	}
	if h.queueID < 0 || h.queueID >= n {
		return bad(req, "request queueId[%d] is illegal, topic %s has %d queues", h.queueID, h.topic, n)
	}
	stored := s.putLocked(s.newRecord(c, h, req.Body, h.properties, h.flag))
	resp := remoting.NewResponse(req, remoting.Success, "")
	resp.ExtFields["msgId"] = remoting.OffsetMsgID(c.local, stored.CommitLogOffset)
	// The queue asked for, even when a delayed message went to the schedule
	// topic, whose offset queueOffset is then: SendMessageProcessor answers
	// so.
	resp.ExtFields["queueId"] = remoting.Itoa(h.queueID)
	resp.ExtFields["queueOffset"] = remoting.Itoa(stored.QueueOffset)
	return resp
}

// sendBatch answers SEND_BATCH_MESSAGE: every message of the batch goes to
// the one queue, consecutively. Brokers refuse delayed messages in a batch.
func (s *Server) sendBatch(c *conn, req *remoting.Command) *remoting.Command {
	h, err := parseSend(req, true)
	if err != nil {
		return bad(req, "%v", err)
	}
	msgs, err := remoting.DecodeBatch(req.Body)
	if err != nil || len(msgs) == 0 {
		return remoting.NewResponse(req, remoting.MessageIllegal, fmt.Sprintf("bad batch body (%d messages): %v", len(msgs), err))
	}
	for _, m := range msgs {
		if level, _ := strconv.Atoi(m.Properties[remoting.PropDelayLevel]); level > 0 {
			return remoting.NewResponse(req, remoting.MessageIllegal, "TimeDelayLevel is not supported for batched messages")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.topicForSendLocked(h)
	if !ok {
		return remoting.NewResponse(req, remoting.TopicNotExist, "topic["+h.topic+"] not exist, apply first please!")
	}
	if h.queueID < 0 || h.queueID >= n {
		return bad(req, "request queueId[%d] is illegal, topic %s has %d queues", h.queueID, h.topic, n)
	}
	ids := make([]string, len(msgs))
	var first remoting.Record
	for i, m := range msgs {
		stored := s.st.append(s.newRecord(c, h, m.Body, m.Properties, m.Flag))
		if i == 0 {
			first = stored
		}
		ids[i] = remoting.OffsetMsgID(c.local, stored.CommitLogOffset)
	}
	resp := remoting.NewResponse(req, remoting.Success, "")
	resp.ExtFields["msgId"] = strings.Join(ids, ",")
	resp.ExtFields["queueId"] = remoting.Itoa(first.QueueID)
	resp.ExtFields["queueOffset"] = remoting.Itoa(first.QueueOffset)
	return resp
}

// A pull answers at most maxPullMessages records and, past the first,
// maxPullBytes of them, whatever the client asks: a broker's
// maxTransferCountOnMessageInMemory and maxTransferBytesOnMessageInMemory
// (MessageStoreConfig), which apply to messages still in memory (a broker
// reading from disk is stricter still: 8 messages, 64 KiB).
const (
	maxPullMessages = 32
	maxPullBytes    = 256 << 10
)

// Pull sysFlag bits (PullSysFlag).
const (
	pullCommitOffset = 1 << 0
	pullSuspend      = 1 << 1
	pullSubscription = 1 << 2
)

// pull answers PULL_MESSAGE. With nothing to return and the suspend flag
// set, it holds the request until a message arrives or the client's
// suspend timeout passes: answering at once makes the library pull again
// immediately, in a busy loop.
func (s *Server) pull(c *conn, req *remoting.Command) *remoting.Command {
	group, name := req.Ext("consumerGroup"), req.Ext("topic")
	var qid, offset, maxMsgs, sysFlag, commitOffset, suspendMillis int64
	for _, f := range []struct {
		key string
		dst *int64
	}{{"queueId", &qid}, {"queueOffset", &offset}, {"maxMsgNums", &maxMsgs}, {"sysFlag", &sysFlag},
		{"commitOffset", &commitOffset}, {"suspendTimeoutMillis", &suspendMillis}} {
		v, err := extInt(req, f.key)
		if err != nil {
			return bad(req, "pull: %v", err)
		}
		*f.dst = v
	}
	key := queueKey{group: group, topic: name, queue: int(qid)}

	s.mu.Lock()
	t := s.st.topics[name]
	if t == nil {
		s.mu.Unlock()
		return remoting.NewResponse(req, remoting.TopicNotExist, "topic["+name+"] not exist, apply first please!")
	}
	if qid < 0 || int(qid) >= len(t.queues) {
		s.mu.Unlock()
		return bad(req, "pull: queueId %d out of range for %s", qid, name)
	}
	// A pull that does not carry its subscription is served from the
	// group's, which a broker learns from heartbeats only: after a restart,
	// until the group's next heartbeat, there is none.
	if sysFlag&pullSubscription == 0 {
		if len(s.st.groups[group]) == 0 {
			s.mu.Unlock()
			return remoting.NewResponse(req, remoting.SubscriptionNotExist, "the consumer's group info not exist")
		}
		if !s.st.subscribed(group, name) {
			s.mu.Unlock()
			return remoting.NewResponse(req, remoting.SubscriptionNotExist, "the consumer's subscription not exist")
		}
	}
	// A broker commits the offset a pull carries.
	if sysFlag&pullCommitOffset != 0 && commitOffset >= 0 && group != "" {
		s.st.offsets[key] = commitOffset
	}
	q := t.queues[qid]
	s.mu.Unlock()

	limit := min(max(maxMsgs, 1), maxPullMessages)
	deadline := time.Now().Add(time.Duration(suspendMillis) * time.Millisecond)
	for {
		s.mu.Lock()
		minOffset, maxOffset := q.min, q.maxOffset()
		var body []byte
		var n int64
		for o := offset; o >= minOffset && o < maxOffset && n < limit; o++ {
			rec, err := remoting.EncodeRecords(nil, *q.at(o))
			if err != nil {
				s.mu.Unlock()
				return bad(req, "pull: %v", err)
			}
			if n > 0 && len(body)+len(rec) > maxPullBytes {
				break
			}
			body = append(body, rec...)
			n++
		}
		arrived := q.arrived
		s.mu.Unlock()

		resp := remoting.NewResponse(req, remoting.Success, "")
		resp.ExtFields["minOffset"] = remoting.Itoa(minOffset)
		resp.ExtFields["maxOffset"] = remoting.Itoa(maxOffset)
		resp.ExtFields["suggestWhichBrokerId"] = "0"
		switch {
		case offset >= 0 && offset < minOffset:
			// Trimmed (OFFSET_TOO_SMALL): start again at the oldest message
			// kept.
			resp.Code = remoting.PullOffsetMoved
			resp.ExtFields["nextBeginOffset"] = remoting.Itoa(minOffset)
			return resp
		case offset < 0 || offset > maxOffset:
			resp.Code = remoting.PullOffsetMoved
			resp.ExtFields["nextBeginOffset"] = remoting.Itoa(min(max(offset, 0), maxOffset))
			return resp
		case n > 0:
			resp.Body = body
			resp.ExtFields["nextBeginOffset"] = remoting.Itoa(offset + n)
			return resp
		}
		wait := time.Until(deadline)
		if sysFlag&pullSuspend == 0 || wait <= 0 || !c.waitFor(arrived, wait) {
			resp.Code = remoting.PullNotFound
			resp.ExtFields["nextBeginOffset"] = remoting.Itoa(offset)
			return resp
		}
	}
}

func (s *Server) queryOffset(req *remoting.Command) *remoting.Command {
	qid, err := extInt(req, "queueId")
	if err != nil {
		return bad(req, "query offset: %v", err)
	}
	key := queueKey{group: req.Ext("consumerGroup"), topic: req.Ext("topic"), queue: int(qid)}
	s.mu.Lock()
	off, ok := s.st.offsets[key]
	var minOffset int64
	if t := s.st.topics[key.topic]; t != nil && key.queue >= 0 && key.queue < len(t.queues) {
		minOffset = t.queues[key.queue].min
	}
	s.mu.Unlock()
	if !ok {
		if minOffset > 0 {
			// Nothing committed and the queue no longer starts at 0: a
			// broker leaves the client to decide where to start.
			return remoting.NewResponse(req, remoting.QueryNotFound, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
		}
		off = 0
	}
	resp := remoting.NewResponse(req, remoting.Success, "")
	resp.ExtFields["offset"] = remoting.Itoa(off)
	return resp
}

func (s *Server) updateOffset(req *remoting.Command) *remoting.Command {
	qid, err := extInt(req, "queueId")
	if err != nil {
		return bad(req, "update offset: %v", err)
	}
	off, err := extInt(req, "commitOffset")
	if err != nil {
		return bad(req, "update offset: %v", err)
	}
	key := queueKey{group: req.Ext("consumerGroup"), topic: req.Ext("topic"), queue: int(qid)}
	s.mu.Lock()
	s.st.offsets[key] = off
	s.mu.Unlock()
	return remoting.NewResponse(req, remoting.Success, "")
}

// offsetBound answers GET_MAX_OFFSET, GET_MIN_OFFSET and
// SEARCH_OFFSET_BY_TIMESTAMP.
func (s *Server) offsetBound(req *remoting.Command) *remoting.Command {
	qid, err := extInt(req, "queueId")
	if err != nil {
		return bad(req, "offset: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.st.topics[req.Ext("topic")]
	if t == nil || qid < 0 || int(qid) >= len(t.queues) {
		return remoting.NewResponse(req, remoting.TopicNotExist, "no such queue")
	}
	q := t.queues[qid]
	var off int64
	switch req.Code {
	case remoting.GetMaxOffset:
		off = q.maxOffset()
	case remoting.GetMinOffset:
		off = q.min
	case remoting.SearchOffsetByTimestamp:
		ts, err := extInt(req, "timestamp")
		if err != nil {
			return bad(req, "search offset: %v", err)
		}
		off = q.maxOffset()
		for _, m := range q.msgs {
			if m.StoreTimestamp >= ts {
				off = m.QueueOffset
				break
			}
		}
	}
	resp := remoting.NewResponse(req, remoting.Success, "")
	resp.ExtFields["offset"] = remoting.Itoa(off)
	return resp
}

func (s *Server) consumerList(req *remoting.Command) *remoting.Command {
	s.mu.Lock()
	ids := s.st.consumers(req.Ext("consumerGroup"))
	s.mu.Unlock()
	if len(ids) == 0 {
		return bad(req, "no consumer for this group, %s", req.Ext("consumerGroup"))
	}
	body, _ := json.Marshal(map[string][]string{"consumerIdList": ids})
	resp := remoting.NewResponse(req, remoting.Success, "")
	resp.Body = body
	return resp
}

// MessageQueue is a queue as the lock requests name it.
type MessageQueue struct {
	Topic      string `json:"topic"`
	BrokerName string `json:"brokerName"`
	QueueID    int    `json:"queueId"`
}

type lockBody struct {
	ConsumerGroup string         `json:"consumerGroup"`
	ClientID      string         `json:"clientId"`
	MQs           []MessageQueue `json:"mqSet"`
}

func (s *Server) lockBatch(req *remoting.Command) *remoting.Command {
	var b lockBody
	if err := json.Unmarshal(req.Body, &b); err != nil {
		return bad(req, "lock body: %v", err)
	}
	now := time.Now()
	locked := []MessageQueue{}
	s.mu.Lock()
	for _, mq := range b.MQs {
		if s.st.lock(queueKey{group: b.ConsumerGroup, topic: mq.Topic, queue: mq.QueueID}, b.ClientID, now, s.opts.LockTTL) {
			locked = append(locked, mq)
		}
	}
	s.mu.Unlock()
	body, _ := json.Marshal(map[string][]MessageQueue{"lockOKMQSet": locked})
	resp := remoting.NewResponse(req, remoting.Success, "")
	resp.Body = body
	return resp
}

func (s *Server) unlockBatch(req *remoting.Command) *remoting.Command {
	var b lockBody
	if err := json.Unmarshal(req.Body, &b); err != nil {
		return bad(req, "unlock body: %v", err)
	}
	s.mu.Lock()
	for _, mq := range b.MQs {
		s.st.unlock(queueKey{group: b.ConsumerGroup, topic: mq.Topic, queue: mq.QueueID}, b.ClientID)
	}
	s.mu.Unlock()
	return remoting.NewResponse(req, remoting.Success, "")
}

// defaultMaxReconsumeTimes applies when a send-back names no maximum.
const defaultMaxReconsumeTimes = 16

// sendBack answers CONSUMER_SEND_MSG_BACK as a broker does: the stored
// message goes to %RETRY%<group> with reconsumeTimes+1 and delay level
// 3+reconsumeTimes (or the level asked for), or, when its reconsume times
// reached the maximum or the level is negative, to %DLQ%<group>.
func (s *Server) sendBack(req *remoting.Command) *remoting.Command {
	group := req.Ext("group")
	off, err := extInt(req, "offset")
	if err != nil {
		return bad(req, "send back: %v", err)
	}
	level, err := extInt(req, "delayLevel")
	if err != nil {
		return bad(req, "send back: %v", err)
	}
	maxTimes := int64(defaultMaxReconsumeTimes)
	if req.Ext("maxReconsumeTimes") != "" {
		if maxTimes, err = extInt(req, "maxReconsumeTimes"); err != nil {
			return bad(req, "send back: %v", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	orig, ok := s.st.byCommit[off]
	if !ok {
		return bad(req, "look message by offset failed, %d", off)
	}
	rec := *orig
	rec.Properties = make(map[string]string, len(orig.Properties)+2)
	for k, v := range orig.Properties {
		rec.Properties[k] = v
	}
	if rec.Properties[remoting.PropRetryTopic] == "" {
		rec.Properties[remoting.PropRetryTopic] = orig.Topic
	}
	if rec.Properties[remoting.PropOriginMessageID] == "" {
		rec.Properties[remoting.PropOriginMessageID] = req.Ext("originMsgId")
	}
	rec.ReconsumeTimes = orig.ReconsumeTimes + 1
	rec.StoreTimestamp = time.Now().UnixMilli()
	rec.QueueID = 0
	if int64(orig.ReconsumeTimes) >= maxTimes || level < 0 {
		rec.Topic = dlqPrefix + group
		delete(rec.Properties, remoting.PropDelayLevel)
		s.st.createTopic(rec.Topic, 1, permReadWrite)
		s.st.append(rec)
		return remoting.NewResponse(req, remoting.Success, "")
	}
	if level == 0 {
		level = 3 + int64(orig.ReconsumeTimes)
	}
	level = min(level, int64(len(s.opts.DelayLevels)))
	rec.Topic = retryPrefix + group
	rec.Properties[remoting.PropDelayLevel] = remoting.Itoa(level)
	s.st.createTopic(rec.Topic, 1, permReadWrite)
	s.putLocked(rec)
	return remoting.NewResponse(req, remoting.Success, "")
}

func (s *Server) createTopicRequest(req *remoting.Command) *remoting.Command {
	name := req.Ext("topic")
	n, err := extInt(req, "writeQueueNums")
	if err != nil || name == "" || n < 1 || n > 1024 {
		return bad(req, "create topic %q: bad queue count (%v)", name, err)
	}
	perm := int64(permReadWrite)
	if req.Ext("perm") != "" {
		if perm, err = extInt(req, "perm"); err != nil {
			return bad(req, "create topic: %v", err)
		}
	}
	s.mu.Lock()
	s.st.createTopic(name, int(n), int(perm))
	s.mu.Unlock()
	return remoting.NewResponse(req, remoting.Success, "")
}
