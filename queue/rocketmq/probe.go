package rocketmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
)

// prober sends the few requests the library does not expose — route and
// offset queries for Ping, queue locks and unlocks for the rebalance
// handover, offset commits and dead-lettering whose answers are checked —
// over connections of its own (internal/remoting).
type prober struct {
	nameServers []string // as the library takes them (libraryNameServers)
	timeout     time.Duration

	mu      sync.Mutex
	conns   map[string]*remoting.Client // by address
	brokers map[string]string           // broker name -> master address, from the last route
	topics  []string                    // topics in use, for Ping
	closed  bool
}

func newProber(nameServers []string, timeout time.Duration) *prober {
	return &prober{nameServers: nameServers, timeout: timeout,
		conns: make(map[string]*remoting.Client), brokers: make(map[string]string)}
}

// remember adds a topic Ping should check.
func (p *prober) remember(topic string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Contains(p.topics, topic) {
		p.topics = append(p.topics, topic)
	}
}

func (p *prober) close() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.closed = true
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// call sends req to addr on a cached connection, dropping the connection
// if the call fails so the next one redials.
func (p *prober) call(ctx context.Context, addr string, req *remoting.Command) (*remoting.Command, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("probe closed")
	}
	c := p.conns[addr]
	if c != nil && closed(c) {
		// The peer closed it (a restart, a move): dial again, looking the
		// name up afresh, rather than fail this call.
		delete(p.conns, addr)
		c = nil
	}
	p.mu.Unlock()
	if c == nil {
		var err error
		if c, err = remoting.Dial(ctx, addr, nil); err != nil {
			return nil, err
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return nil, errors.New("probe closed")
		}
		if old := p.conns[addr]; old != nil {
			_ = c.Close()
			c = old
		} else {
			p.conns[addr] = c
		}
		p.mu.Unlock()
	}
	resp, err := c.Call(ctx, req)
	if err != nil {
		p.mu.Lock()
		if p.conns[addr] == c {
			delete(p.conns, addr)
		}
		p.mu.Unlock()
		_ = c.Close()
		return nil, err
	}
	return resp, nil
}

// closed reports whether c's connection has ended.
func closed(c *remoting.Client) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

// route is the part of a topic's route the prober uses.
type route struct {
	brokers    map[string]string // broker name -> master address
	queues     int
	readQueues map[string]int // broker name -> its read queues of the topic
}

// errNoTopic is the name server's TOPIC_NOT_EXIST.
var errNoTopic = errors.New("topic does not exist")

// route asks the name servers, in turn, for topic's route. It asks for
// standard JSON, but name servers before 4.9.4 answer in fastjson's dialect
// anyway, so the answer is parsed in either (queue/rocketmq/README.md, "Route
// bodies").
func (p *prober) route(ctx context.Context, topic string) (route, error) {
	var errs []error
	for _, ns := range p.nameServers {
		ns = dialAddr(ns) // dialed by name, so a name server that moved is found again
		resp, err := p.call(ctx, ns, remoting.RouteRequest(topic))
		if err != nil {
			errs = append(errs, fmt.Errorf("name server %s: %w", ns, err))
			continue
		}
		switch resp.Code {
		case remoting.Success:
		case remoting.TopicNotExist:
			return route{}, fmt.Errorf("route of %s: %w", topic, errNoTopic)
		default:
			return route{}, fmt.Errorf("route of %s: code %d: %s", topic, resp.Code, resp.Remark)
		}
		body, err := remoting.ParseRoute(resp.Body)
		if err != nil {
			return route{}, fmt.Errorf("route of %s: %w", topic, err)
		}
		r := route{brokers: make(map[string]string), readQueues: make(map[string]int)}
		for _, q := range body.QueueDatas {
			r.queues += q.ReadQueueNums
			r.readQueues[q.BrokerName] += q.ReadQueueNums
		}
		for _, b := range body.BrokerDatas {
			if a := b.BrokerAddrs[remoting.MasterID]; a != "" {
				r.brokers[b.BrokerName] = a
			}
		}
		p.mu.Lock()
		for name, a := range r.brokers {
			p.brokers[name] = a
		}
		p.mu.Unlock()
		return r, nil
	}
	return route{}, errors.Join(errs...)
}

// ping resolves the route of every topic in use (or fallback) and asks each
// broker for a queue's max offset. A topic that does not exist yet passes if
// the broker creates topics on first send (its template topic TBW102 is
// routed); then that broker is asked instead.
func (p *prober) ping(ctx context.Context, fallback string) error {
	p.mu.Lock()
	topics := slices.Clone(p.topics)
	p.mu.Unlock()
	if len(topics) == 0 && fallback != "" {
		topics = []string{fallback}
	}
	if len(topics) == 0 {
		// Nothing to look up: any answer from a name server will do.
		_, err := p.route(ctx, autoCreateTopic)
		if errors.Is(err, errNoTopic) {
			return nil
		}
		return err
	}
	for _, topic := range topics {
		t := topic
		r, err := p.route(ctx, t)
		if errors.Is(err, errNoTopic) {
			t = autoCreateTopic
			if r, err = p.route(ctx, t); errors.Is(err, errNoTopic) {
				return fmt.Errorf("topic %s does not exist and the broker does not create topics: %w", topic, err)
			}
		}
		if err != nil {
			return err
		}
		for name, addr := range r.brokers {
			resp, err := p.call(ctx, addr, remoting.NewRequest(remoting.GetMaxOffset,
				map[string]string{"topic": t, "queueId": "0"}, nil))
			if err != nil {
				return fmt.Errorf("broker %s at %s: %w", name, addr, err)
			}
			if resp.Code != remoting.Success {
				return fmt.Errorf("broker %s at %s: max offset of %s: code %d: %s", name, addr, t, resp.Code, resp.Remark)
			}
		}
	}
	return nil
}

// autoCreateTopic is the template topic of brokers that create topics on
// first send (autoCreateTopicEnable).
const autoCreateTopic = "TBW102"

// brokerAddr returns the master address of a broker, looking the topic's
// route up if the broker is not known yet.
func (p *prober) brokerAddr(ctx context.Context, brokerName, topic string) (string, error) {
	p.mu.Lock()
	a := p.brokers[brokerName]
	p.mu.Unlock()
	if a != "" {
		return a, nil
	}
	r, err := p.route(ctx, topic)
	if err != nil {
		return "", err
	}
	if a = r.brokers[brokerName]; a == "" {
		return "", fmt.Errorf("broker %s not in the route of %s", brokerName, topic)
	}
	return a, nil
}

// lockBody is LOCK_BATCH_MQ's and UNLOCK_BATCH_MQ's body.
type lockBody struct {
	ConsumerGroup string                   `json:"consumerGroup"`
	ClientID      string                   `json:"clientId"`
	MQs           []primitive.MessageQueue `json:"mqSet"`
}

// lock asks the broker to lock mqs (all on one broker) for clientID and
// returns those it locked.
func (p *prober) lock(ctx context.Context, group, clientID string, mqs []primitive.MessageQueue) ([]primitive.MessageQueue, error) {
	if len(mqs) == 0 {
		return nil, nil
	}
	addr, err := p.brokerAddr(ctx, mqs[0].BrokerName, mqs[0].Topic)
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(lockBody{ConsumerGroup: group, ClientID: clientID, MQs: mqs})
	resp, err := p.call(ctx, addr, remoting.NewRequest(remoting.LockBatchMQ, nil, body))
	if err != nil {
		return nil, err
	}
	if resp.Code != remoting.Success {
		return nil, fmt.Errorf("lock: code %d: %s", resp.Code, resp.Remark)
	}
	var out struct {
		MQs []primitive.MessageQueue `json:"lockOKMQSet"`
	}
	if err := json.Unmarshal(resp.Body, &out); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	return out.MQs, nil
}

// unlock releases clientID's locks on mqs (all on one broker).
func (p *prober) unlock(ctx context.Context, group, clientID string, mqs []primitive.MessageQueue) error {
	if len(mqs) == 0 {
		return nil
	}
	addr, err := p.brokerAddr(ctx, mqs[0].BrokerName, mqs[0].Topic)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(lockBody{ConsumerGroup: group, ClientID: clientID, MQs: mqs})
	resp, err := p.call(ctx, addr, remoting.NewRequest(remoting.UnlockBatchMQ, nil, body))
	if err != nil {
		return err
	}
	if resp.Code != remoting.Success {
		return fmt.Errorf("unlock: code %d: %s", resp.Code, resp.Remark)
	}
	return nil
}

// commitOffset raises group's committed offset of mq to off, and leaves a
// higher one alone: the library may have moved the queue past it (a trimmed
// queue), or another consumer committed further.
func (p *prober) commitOffset(ctx context.Context, group string, mq primitive.MessageQueue, off int64) error {
	addr, err := p.brokerAddr(ctx, mq.BrokerName, mq.Topic)
	if err != nil {
		return err
	}
	ext := map[string]string{"consumerGroup": group, "topic": mq.Topic, "queueId": remoting.Itoa(mq.QueueId)}
	resp, err := p.call(ctx, addr, remoting.NewRequest(remoting.QueryConsumerOffset, ext, nil))
	if err != nil {
		return err
	}
	switch resp.Code {
	case remoting.Success:
		if cur, err := strconv.ParseInt(resp.Ext("offset"), 10, 64); err == nil && cur >= off {
			return nil
		}
	case remoting.QueryNotFound: // nothing committed
	default:
		return fmt.Errorf("query offset: code %d: %s", resp.Code, resp.Remark)
	}
	ext["commitOffset"] = remoting.Itoa(off)
	if resp, err = p.call(ctx, addr, remoting.NewRequest(remoting.UpdateConsumerOffset, ext, nil)); err != nil {
		return err
	}
	if resp.Code != remoting.Success {
		return fmt.Errorf("update offset: code %d: %s", resp.Code, resp.Remark)
	}
	return nil
}

// deadLetter sends msg, consumed from mq, to group's dead-letter topic
// (CONSUMER_SEND_MSG_BACK with delay level -1) and reports the broker's
// refusal as an error, which the library's own send-back ignores.
func (p *prober) deadLetter(ctx context.Context, group string, mq primitive.MessageQueue, msg *primitive.MessageExt, maxReconsume int) error {
	addr, err := p.brokerAddr(ctx, mq.BrokerName, mq.Topic)
	if err != nil {
		return err
	}
	ext := map[string]string{
		"group": group, "offset": remoting.Itoa(msg.CommitLogOffset), "delayLevel": "-1",
		"originMsgId": msg.MsgId, "originTopic": msg.Topic, "unitMode": "false",
		"maxReconsumeTimes": remoting.Itoa(maxReconsume),
	}
	resp, err := p.call(ctx, addr, remoting.NewRequest(remoting.ConsumerSendMsgBack, ext, nil))
	if err != nil {
		return err
	}
	if resp.Code != remoting.Success {
		return fmt.Errorf("send back: code %d: %s", resp.Code, resp.Remark)
	}
	return nil
}
