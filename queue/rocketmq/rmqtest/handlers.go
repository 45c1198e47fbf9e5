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
	body, err := json.Marshal(map[string]any{
		"orderTopicConf": "",
		"queueDatas": []map[string]any{{
			"brokerName": s.opts.BrokerName, "readQueueNums": n, "writeQueueNums": n, "perm": perm, "topicSynFlag": 0,
		}},
		"brokerDatas": []map[string]any{{
			"cluster": s.opts.Cluster, "brokerName": s.opts.BrokerName, "brokerAddrs": map[string]string{"0": c.local.String()},
		}},
		"filterServerTable": map[string]any{},
	})
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
		GroupName    string `json:"groupName"`
		MessageModel string `json:"messageModel"`
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
		if s.st.register(cd.GroupName, hb.ClientID, c, now) {
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
// schedule and enters its queue when due, as on a broker.
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
	rec := s.newRecord(c, h, req.Body, h.properties, h.flag)
	resp := remoting.NewResponse(req, remoting.Success, "")
	if level, _ := strconv.Atoi(h.properties[remoting.PropDelayLevel]); level > 0 {
		level = min(level, len(s.opts.DelayLevels))
		seq := s.st.schedule(time.Now().Add(s.opts.DelayLevels[level-1]), rec)
		s.signalScheduler()
		resp.ExtFields["msgId"] = remoting.OffsetMsgID(c.local, -1-seq)
		resp.ExtFields["queueId"] = remoting.Itoa(level - 1)
		resp.ExtFields["queueOffset"] = remoting.Itoa(seq)
		return resp
	}
	stored := s.st.append(rec)
	resp.ExtFields["msgId"] = remoting.OffsetMsgID(c.local, stored.CommitLogOffset)
	resp.ExtFields["queueId"] = remoting.Itoa(stored.QueueID)
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

// maxPullBytes bounds one pull response, like a broker's
// maxTransferBytesOnMessageInMemory.
const maxPullBytes = 4 << 20

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
	const (
		flagCommitOffset = 1
		flagSuspend      = 2
	)
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
	// A broker commits the offset a pull carries.
	if sysFlag&flagCommitOffset != 0 && commitOffset >= 0 && group != "" {
		s.st.offsets[key] = commitOffset
	}
	q := t.queues[qid]
	s.mu.Unlock()

	deadline := time.Now().Add(time.Duration(suspendMillis) * time.Millisecond)
	for {
		s.mu.Lock()
		maxOffset := int64(len(q.msgs))
		var recs []remoting.Record
		size := 0
		for o := offset; o >= 0 && o < maxOffset && int64(len(recs)) < max(maxMsgs, 1); o++ {
			r := *q.msgs[o]
			size += len(r.Body) + 200
			if len(recs) > 0 && size > maxPullBytes {
				break
			}
			recs = append(recs, r)
		}
		arrived := q.arrived
		s.mu.Unlock()

		resp := remoting.NewResponse(req, remoting.Success, "")
		resp.ExtFields["minOffset"] = "0"
		resp.ExtFields["maxOffset"] = remoting.Itoa(maxOffset)
		resp.ExtFields["suggestWhichBrokerId"] = "0"
		switch {
		case offset < 0 || offset > maxOffset:
			resp.Code = remoting.PullOffsetMoved
			resp.ExtFields["nextBeginOffset"] = remoting.Itoa(min(max(offset, 0), maxOffset))
			return resp
		case len(recs) > 0:
			body, err := remoting.EncodeRecords(nil, recs...)
			if err != nil {
				return bad(req, "pull: %v", err)
			}
			resp.Body = body
			resp.ExtFields["nextBeginOffset"] = remoting.Itoa(offset + int64(len(recs)))
			return resp
		}
		wait := time.Until(deadline)
		if sysFlag&flagSuspend == 0 || wait <= 0 || !c.waitFor(arrived, wait) {
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
	s.mu.Unlock()
	if !ok {
		// Nothing committed: a queue that was never trimmed is read from 0,
		// as a broker answers for its min offset 0 (the double never trims).
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
	msgs := t.queues[qid].msgs
	var off int64
	switch req.Code {
	case remoting.GetMaxOffset:
		off = int64(len(msgs))
	case remoting.GetMinOffset:
		off = 0
	case remoting.SearchOffsetByTimestamp:
		ts, err := extInt(req, "timestamp")
		if err != nil {
			return bad(req, "search offset: %v", err)
		}
		off = int64(len(msgs))
		for i, m := range msgs {
			if m.StoreTimestamp >= ts {
				off = int64(i)
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
	s.st.schedule(time.Now().Add(s.opts.DelayLevels[level-1]), rec)
	s.signalScheduler()
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

// signalScheduler wakes the delay scheduler; call with s.mu held.
func (s *Server) signalScheduler() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// scheduleDelayed moves delayed messages into their queues when due, with
// DELAY removed, as a broker's schedule service does.
func (s *Server) scheduleDelayed(stop, wake chan struct{}) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		due, next := s.st.takeDue(time.Now())
		for _, rec := range due {
			delete(rec.Properties, remoting.PropDelayLevel)
			if t := s.st.topics[rec.Topic]; t != nil && int(rec.QueueID) < len(t.queues) {
				s.st.append(rec)
			}
		}
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
