// These tests talk to the double with the project's own remoting client,
// never with rocketmq-client-go, so they run under -race: the double must be
// race-clean even though the library is not.
package rmqtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue/rocketmq/internal/remoting"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

const callTimeout = 5 * time.Second

// shortDelays keep delay and retry tests fast: level n waits n*50ms.
func shortDelays() []time.Duration {
	out := make([]time.Duration, 18)
	for i := range out {
		out[i] = time.Duration(i+1) * 50 * time.Millisecond
	}
	return out
}

func mustStart(t *testing.T, opts rmqtest.Options) *rmqtest.Server {
	t.Helper()
	srv, err := rmqtest.Start(opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// client is a raw connection that records the requests the server pushes.
type client struct {
	*remoting.Client
	mu     sync.Mutex
	pushed []*remoting.Command
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c := &client{}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	rc, err := remoting.Dial(ctx, addr, func(cmd *remoting.Command) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.pushed = append(c.pushed, cmd)
	})
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c.Client = rc
	t.Cleanup(func() { _ = rc.Close() })
	return c
}

func (c *client) notifications() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, p := range c.pushed {
		if p.Code == remoting.NotifyConsumerIdsChanged {
			n++
		}
	}
	return n
}

// call sends a request and fails the test on a transport error.
func (c *client) call(t *testing.T, code int16, ext map[string]string, body []byte) *remoting.Command {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := c.Call(ctx, remoting.NewRequest(code, ext, body))
	if err != nil {
		t.Fatalf("request %d: %v", code, err)
	}
	return resp
}

// mustOK calls and fails the test unless the response is Success.
func (c *client) mustOK(t *testing.T, code int16, ext map[string]string, body []byte) *remoting.Command {
	t.Helper()
	resp := c.call(t, code, ext, body)
	if resp.Code != remoting.Success {
		t.Fatalf("request %d: got code %d (%s), want %d", code, resp.Code, resp.Remark, remoting.Success)
	}
	return resp
}

func sendExt(topic string, queueID int, props map[string]string) map[string]string {
	return map[string]string{
		"producerGroup": "pg", "topic": topic, "queueId": strconv.Itoa(queueID), "sysFlag": "0",
		"bornTimestamp": strconv.FormatInt(time.Now().UnixMilli(), 10), "flag": "0",
		"properties": remoting.EncodeProperties(props), "reconsumeTimes": "0", "unitMode": "false",
		"maxReconsumeTimes": "0", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4", "batch": "false",
	}
}

func (c *client) send(t *testing.T, topic string, queueID int, body string, props map[string]string) *remoting.Command {
	t.Helper()
	return c.call(t, remoting.SendMessage, sendExt(topic, queueID, props), []byte(body))
}

// pullExt is a pull's header. It carries its subscription (sysFlag bit 2),
// so the pull is served without a heartbeat first.
func pullExt(group, topic string, queueID int, offset int64, suspend time.Duration) map[string]string {
	flag := "4"
	if suspend > 0 {
		flag = "6"
	}
	return map[string]string{
		"consumerGroup": group, "topic": topic, "queueId": strconv.Itoa(queueID),
		"queueOffset": strconv.FormatInt(offset, 10), "maxMsgNums": "32", "sysFlag": flag, "commitOffset": "0",
		"suspendTimeoutMillis": strconv.FormatInt(suspend.Milliseconds(), 10), "subscription": "*", "subVersion": "0",
		"expressionType": "TAG",
	}
}

func (c *client) pull(t *testing.T, group, topic string, queueID int, offset int64, suspend time.Duration) (*remoting.Command, []remoting.Record) {
	t.Helper()
	resp := c.call(t, remoting.PullMessage, pullExt(group, topic, queueID, offset, suspend), nil)
	recs, err := remoting.DecodeRecords(resp.Body)
	if err != nil {
		t.Fatalf("decode pull body: %v", err)
	}
	return resp, recs
}

func heartbeat(t *testing.T, c *client, clientID string, groups ...string) {
	t.Helper()
	for _, g := range groups {
		subscribe(t, c, clientID, g)
	}
}

// subscribe sends a heartbeat of clientID as a member of group subscribed
// to topics, as the library's heartbeats list them.
func subscribe(t *testing.T, c *client, clientID, group string, topics ...string) {
	t.Helper()
	type subscription struct {
		Topic     string `json:"topic"`
		SubString string `json:"subString"`
	}
	type consumerData struct {
		GroupName     string         `json:"groupName"`
		ConsumeType   string         `json:"consumeType"`
		MessageModel  string         `json:"messageModel"`
		Subscriptions []subscription `json:"subscriptionDataSet"`
	}
	cd := consumerData{GroupName: group, ConsumeType: "CONSUME_PASSIVELY", MessageModel: "CLUSTERING", Subscriptions: []subscription{}}
	for _, topic := range topics {
		cd.Subscriptions = append(cd.Subscriptions, subscription{Topic: topic, SubString: "*"})
	}
	body, _ := json.Marshal(struct {
		ClientID  string         `json:"clientID"`
		Producers []any          `json:"producerDataSet"`
		Consumers []consumerData `json:"consumerDataSet"`
	}{ClientID: clientID, Producers: []any{}, Consumers: []consumerData{cd}})
	c.mustOK(t, remoting.HeartBeat, nil, body)
}

// waitFor polls cond for up to 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, what, func() (bool, string) { return cond(), "not yet" })
}

func TestRoute(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("orders", 3)
	c := dial(t, srv.Addr())
	tests := []struct {
		name       string
		topic      string
		wantCode   int16
		wantQueues int
	}{
		{"existing topic", "orders", remoting.Success, 3},
		{"unknown topic", "nope", remoting.TopicNotExist, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := c.call(t, remoting.GetRouteInfoByTopic, map[string]string{"topic": tc.topic}, nil)
			if resp.Code != tc.wantCode {
				t.Fatalf("got code %d, want %d", resp.Code, tc.wantCode)
			}
			if tc.wantCode != remoting.Success {
				return
			}
			var r struct {
				QueueDatas []struct {
					ReadQueueNums, WriteQueueNums, Perm int
				} `json:"queueDatas"`
				BrokerDatas []struct {
					BrokerAddrs map[string]string `json:"brokerAddrs"`
				} `json:"brokerDatas"`
			}
			if err := json.Unmarshal(resp.Body, &r); err != nil {
				t.Fatalf("decode route: %v", err)
			}
			if len(r.QueueDatas) != 1 || r.QueueDatas[0].ReadQueueNums != tc.wantQueues || r.QueueDatas[0].WriteQueueNums != tc.wantQueues || r.QueueDatas[0].Perm != 6 {
				t.Errorf("got queue data %+v, want one entry with %d read and write queues, perm 6", r.QueueDatas, tc.wantQueues)
			}
			if len(r.BrokerDatas) != 1 || r.BrokerDatas[0].BrokerAddrs["0"] != srv.Addr() {
				t.Errorf("got broker data %+v, want master 0 at %s", r.BrokerDatas, srv.Addr())
			}
		})
	}
}

// TestRouteDialects: the name server answers a route query in the dialect
// a 4.9.4 name server would, byte for byte the committed example route with
// the double's address: fastjson's (unquoted brokerAddrs keys) to a request
// below version 401 without acceptStandardJsonOnly=true, standard JSON
// otherwise; with LegacyRoutes, as older name servers, fastjson's always.
func TestRouteDialects(t *testing.T) {
	tests := []struct {
		name     string
		legacy   bool
		version  int16
		header   string
		wantFile string
	}{
		{name: "library v2.1.2", version: 317, wantFile: "route-fastjson-4.9.4.json"},
		{name: "4.9.1", version: 395, wantFile: "route-fastjson-4.9.4.json"},
		{name: "4.9.1 asking for standard JSON", version: 395, header: "true", wantFile: "route-standard-4.9.4.json"},
		{name: "4.9.4", version: 401, wantFile: "route-standard-4.9.4.json"},
		{name: "4.9.4 to a legacy name server", legacy: true, version: 401, header: "true", wantFile: "route-fastjson-4.9.4.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := mustStart(t, rmqtest.Options{LegacyRoutes: tc.legacy})
			srv.CreateTopic("flashsale-purchases", 16)
			c := dial(t, srv.Addr())
			req := remoting.NewRequest(remoting.GetRouteInfoByTopic, map[string]string{"topic": "flashsale-purchases"}, nil)
			req.Version = tc.version
			if tc.header != "" {
				req.ExtFields[remoting.ExtStandardJSON] = tc.header
			}
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			resp, err := c.Call(ctx, req)
			if err != nil || resp.Code != remoting.Success {
				t.Fatalf("route: got %v, %v; want success", resp, err)
			}
			vector, err := os.ReadFile(filepath.Join("..", "testdata", tc.wantFile))
			if err != nil {
				t.Fatalf("read vector: %v", err)
			}
			want := strings.ReplaceAll(strings.TrimSpace(string(vector)), "172.18.0.3:10911", srv.Addr())
			if string(resp.Body) != want {
				t.Errorf("got  %s\nwant %s", resp.Body, want)
			}
		})
	}
}

func TestSend(t *testing.T) {
	tests := []struct {
		name       string
		autoCreate bool
		topic      string
		queueID    int
		wantCode   int16
		wantQueues int // of the topic afterwards
	}{
		{name: "existing topic", topic: "t", queueID: 1, wantCode: remoting.Success, wantQueues: 2},
		{name: "queue out of range", topic: "t", queueID: 2, wantCode: remoting.SystemError, wantQueues: 2},
		{name: "unknown topic", topic: "new", wantCode: remoting.TopicNotExist, wantQueues: 0},
		{name: "unknown topic, auto-create", autoCreate: true, topic: "new", queueID: 3, wantCode: remoting.Success, wantQueues: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := mustStart(t, rmqtest.Options{AutoCreateTopics: tc.autoCreate})
			srv.CreateTopic("t", 2)
			c := dial(t, srv.Addr())
			props := map[string]string{remoting.PropKeys: "req-1", remoting.PropShardingKey: "camp"}
			resp := c.send(t, tc.topic, tc.queueID, "hello", props)
			if resp.Code != tc.wantCode {
				t.Fatalf("send: got code %d (%s), want %d", resp.Code, resp.Remark, tc.wantCode)
			}
			if got := srv.Queues(tc.topic); got != tc.wantQueues {
				t.Errorf("queues of %s: got %d, want %d", tc.topic, got, tc.wantQueues)
			}
			if tc.wantCode != remoting.Success {
				return
			}
			if resp.Ext("queueId") != strconv.Itoa(tc.queueID) || resp.Ext("queueOffset") != "0" || resp.Ext("msgId") == "" {
				t.Errorf("send result: got %v, want queueId %d, queueOffset 0 and a msgId", resp.ExtFields, tc.queueID)
			}
			msgs := srv.Messages(tc.topic, tc.queueID)
			if len(msgs) != 1 || string(msgs[0].Body) != "hello" || msgs[0].Keys() != "req-1" || msgs[0].Properties[remoting.PropShardingKey] != "camp" {
				t.Errorf("stored: got %+v, want one message hello with keys req-1 and sharding key camp", msgs)
			}
		})
	}
}

func TestSendBatch(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("t", 2)
	c := dial(t, srv.Addr())
	batchExt := func() map[string]string {
		return map[string]string{"a": "pg", "b": "t", "c": "TBW102", "d": "4", "e": "1", "f": "0",
			"g": strconv.FormatInt(time.Now().UnixMilli(), 10), "h": "0", "i": "", "j": "0", "k": "false", "l": "0", "m": "true"}
	}
	var batch []remoting.BatchMessage
	for i := range 3 {
		batch = append(batch, remoting.BatchMessage{Body: fmt.Appendf(nil, "m%d", i), Properties: map[string]string{remoting.PropKeys: fmt.Sprint("r", i)}})
	}
	resp := c.mustOK(t, remoting.SendBatchMessage, batchExt(), remoting.EncodeBatch(batch...))
	if resp.Ext("queueOffset") != "0" {
		t.Errorf("batch result: got queueOffset %q, want 0", resp.Ext("queueOffset"))
	}
	msgs := srv.Messages("t", 1)
	if len(msgs) != 3 {
		t.Fatalf("stored: got %d messages, want 3", len(msgs))
	}
	for i, m := range msgs {
		if string(m.Body) != fmt.Sprint("m", i) || m.Keys() != fmt.Sprint("r", i) || m.QueueOffset != int64(i) {
			t.Errorf("message %d: got body %q keys %q offset %d, want m%d r%d %d", i, m.Body, m.Keys(), m.QueueOffset, i, i, i)
		}
	}

	delayed := remoting.EncodeBatch(remoting.BatchMessage{Body: []byte("x"), Properties: map[string]string{remoting.PropDelayLevel: "1"}})
	if resp := c.call(t, remoting.SendBatchMessage, batchExt(), delayed); resp.Code != remoting.MessageIllegal {
		t.Errorf("delayed batch: got code %d, want %d", resp.Code, remoting.MessageIllegal)
	}
}

// TestLongPoll checks that a pull with nothing to return is held open until
// a message arrives (not answered at once, which makes clients spin), and
// answered "not found" when the suspend timeout passes.
func TestLongPoll(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("t", 1)
	c := dial(t, srv.Addr())

	start := time.Now()
	resp, _ := c.pull(t, "g", "t", 0, 0, 300*time.Millisecond)
	if resp.Code != remoting.PullNotFound || resp.Ext("nextBeginOffset") != "0" {
		t.Errorf("empty queue: got code %d next %q, want %d next 0", resp.Code, resp.Ext("nextBeginOffset"), remoting.PullNotFound)
	}
	if held := time.Since(start); held < 250*time.Millisecond {
		t.Errorf("empty queue: pull answered after %v, want it held for the 300ms suspend timeout", held)
	}

	type result struct {
		resp *remoting.Command
		recs []remoting.Record
		at   time.Time
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		resp, err := c.Call(ctx, remoting.NewRequest(remoting.PullMessage, pullExt("g", "t", 0, 0, 10*time.Second), nil))
		if err != nil {
			done <- result{}
			return
		}
		recs, _ := remoting.DecodeRecords(resp.Body)
		done <- result{resp, recs, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case <-done:
		t.Fatalf("pull answered before any message arrived, want it held")
	default:
	}
	sent := time.Now()
	if r := c.send(t, "t", 0, "late", nil); r.Code != remoting.Success {
		t.Fatalf("send: got code %d", r.Code)
	}
	r := <-done
	if r.resp == nil || r.resp.Code != remoting.Success || len(r.recs) != 1 || string(r.recs[0].Body) != "late" {
		t.Fatalf("held pull: got %+v, want the message that arrived", r)
	}
	if wait := r.at.Sub(sent); wait > time.Second {
		t.Errorf("held pull answered %v after the message arrived, want at once", wait)
	}
	if pulls := srv.Requests(remoting.PullMessage); pulls != 2 {
		t.Errorf("got %d pull requests, want 2", pulls)
	}
}

func TestPullAndOffsets(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("t", 1)
	c := dial(t, srv.Addr())
	for i := range 5 {
		c.send(t, "t", 0, fmt.Sprint("m", i), map[string]string{remoting.PropKeys: fmt.Sprint(i)})
	}
	tests := []struct {
		name     string
		offset   int64
		wantCode int16
		wantN    int
		wantNext string
	}{
		{"from start", 0, remoting.Success, 5, "5"},
		{"from middle", 3, remoting.Success, 2, "5"},
		{"past the end", 9, remoting.PullOffsetMoved, 0, "5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, recs := c.pull(t, "g", "t", 0, tc.offset, 0)
			if resp.Code != tc.wantCode || len(recs) != tc.wantN || resp.Ext("nextBeginOffset") != tc.wantNext || resp.Ext("maxOffset") != "5" {
				t.Fatalf("got code %d, %d messages, next %q, max %q; want %d, %d, %q, 5",
					resp.Code, len(recs), resp.Ext("nextBeginOffset"), resp.Ext("maxOffset"), tc.wantCode, tc.wantN, tc.wantNext)
			}
			for i, r := range recs {
				if want := tc.offset + int64(i); r.QueueOffset != want || r.Topic != "t" || r.StoreHost.String() != srv.Addr() {
					t.Errorf("record %d: got offset %d topic %q store host %v, want %d t %s", i, r.QueueOffset, r.Topic, r.StoreHost, want, srv.Addr())
				}
			}
		})
	}

	q := map[string]string{"consumerGroup": "g", "topic": "t", "queueId": "0"}
	if resp := c.mustOK(t, remoting.QueryConsumerOffset, q, nil); resp.Ext("offset") != "0" {
		t.Errorf("offset before any commit: got %q, want 0", resp.Ext("offset"))
	}
	// A pull carrying a commit offset (sysFlag bit 0) commits it.
	ext := pullExt("g", "t", 0, 2, 0)
	ext["sysFlag"], ext["commitOffset"] = "5", "2"
	c.mustOK(t, remoting.PullMessage, ext, nil)
	if off, ok := srv.CommittedOffset("g", "t", 0); !ok || off != 2 {
		t.Errorf("offset after a committing pull: got %d (%v), want 2", off, ok)
	}
	c.mustOK(t, remoting.UpdateConsumerOffset, map[string]string{"consumerGroup": "g", "topic": "t", "queueId": "0", "commitOffset": "4"}, nil)
	if resp := c.mustOK(t, remoting.QueryConsumerOffset, q, nil); resp.Ext("offset") != "4" {
		t.Errorf("offset after update: got %q, want 4", resp.Ext("offset"))
	}
	if resp := c.mustOK(t, remoting.GetMaxOffset, map[string]string{"topic": "t", "queueId": "0"}, nil); resp.Ext("offset") != "5" {
		t.Errorf("max offset: got %q, want 5", resp.Ext("offset"))
	}
}

// TestPullLimits: a pull answers at most 32 messages and, past the first
// message, 256 KiB of records, whatever the client asks for (the library
// asks for the driver's batch size, up to 1024).
func TestPullLimits(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("small", 1)
	srv.CreateTopic("large", 1)
	c := dial(t, srv.Addr())
	for i := range 40 {
		c.send(t, "small", 0, fmt.Sprint("m", i), nil)
	}
	big := func(kib int) string { return string(make([]byte, kib<<10)) }
	for _, kib := range []int{100, 100, 100, 300, 1} {
		c.send(t, "large", 0, big(kib), nil)
	}
	tests := []struct {
		name   string
		topic  string
		offset int64
		ask    string
		want   int
	}{
		{name: "count capped at 32", topic: "small", offset: 0, ask: "256", want: 32},
		{name: "the rest", topic: "small", offset: 32, ask: "256", want: 8},
		{name: "fewer asked", topic: "small", offset: 0, ask: "5", want: 5},
		{name: "bytes capped at 256 KiB", topic: "large", offset: 0, ask: "32", want: 2},
		{name: "a first message over the cap goes alone", topic: "large", offset: 3, ask: "32", want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ext := pullExt("g", tc.topic, 0, tc.offset, 0)
			ext["maxMsgNums"] = tc.ask
			resp := c.mustOK(t, remoting.PullMessage, ext, nil)
			recs, err := remoting.DecodeRecords(resp.Body)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			next := strconv.FormatInt(tc.offset+int64(tc.want), 10)
			if len(recs) != tc.want || resp.Ext("nextBeginOffset") != next {
				t.Errorf("got %d records, next %s; want %d, next %s", len(recs), resp.Ext("nextBeginOffset"), tc.want, next)
			}
			if len(recs) > 1 && len(resp.Body) > 256<<10 {
				t.Errorf("got %d bytes in %d records, want at most 256 KiB", len(resp.Body), len(recs))
			}
		})
	}
}

// TestSubscriptionNotExist: a pull that does not carry its subscription
// (what the library sends) is refused with SUBSCRIPTION_NOT_EXIST until a
// heartbeat registers the group with the topic, and again after a restart
// until the group's next heartbeat.
func TestSubscriptionNotExist(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("t", 1)
	srv.CreateTopic("u", 1)
	c := dial(t, srv.Addr())
	c.send(t, "t", 0, "m", nil)
	pull := func(c *client, topic string) int16 {
		ext := pullExt("g", topic, 0, 0, 0)
		ext["sysFlag"] = "0"
		return c.call(t, remoting.PullMessage, ext, nil).Code
	}
	if code := pull(c, "t"); code != remoting.SubscriptionNotExist {
		t.Errorf("before any heartbeat: got code %d, want %d", code, remoting.SubscriptionNotExist)
	}
	subscribe(t, c, "A", "g", "t")
	if code := pull(c, "t"); code != remoting.Success {
		t.Errorf("after the group's heartbeat: got code %d, want %d", code, remoting.Success)
	}
	if code := pull(c, "u"); code != remoting.SubscriptionNotExist {
		t.Errorf("a topic the group does not subscribe to: got code %d, want %d", code, remoting.SubscriptionNotExist)
	}
	if err := srv.Restart(true, 0); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	c = dial(t, srv.Addr())
	if code := pull(c, "t"); code != remoting.SubscriptionNotExist {
		t.Errorf("after a restart: got code %d, want %d until the next heartbeat", code, remoting.SubscriptionNotExist)
	}
	subscribe(t, c, "A", "g", "t")
	if code := pull(c, "t"); code != remoting.Success {
		t.Errorf("after the next heartbeat: got code %d, want %d", code, remoting.Success)
	}
}

// TestOffsetFlushAndCrash: committed offsets reach "disk" every
// OffsetFlushInterval and at a clean restart; a crash keeps the messages
// and goes back to the offsets last flushed.
func TestOffsetFlushAndCrash(t *testing.T) {
	commit := func(c *client, off int) {
		c.mustOK(t, remoting.UpdateConsumerOffset, map[string]string{"consumerGroup": "g", "topic": "t", "queueId": "0", "commitOffset": strconv.Itoa(off)}, nil)
	}
	query := func(c *client) string {
		return c.mustOK(t, remoting.QueryConsumerOffset, map[string]string{"consumerGroup": "g", "topic": "t", "queueId": "0"}, nil).Ext("offset")
	}

	t.Run("never flushed", func(t *testing.T) {
		srv := mustStart(t, rmqtest.Options{OffsetFlushInterval: time.Hour})
		srv.CreateTopic("t", 1)
		c := dial(t, srv.Addr())
		for range 3 {
			c.send(t, "t", 0, "m", nil)
		}
		commit(c, 3)
		if err := srv.Crash(0); err != nil {
			t.Fatalf("Crash: %v", err)
		}
		c = dial(t, srv.Addr())
		if _, ok := srv.CommittedOffset("g", "t", 0); ok || query(c) != "0" {
			t.Errorf("after a crash before any flush: got offset %s, want none (0)", query(c))
		}
		if n := len(srv.Messages("t", 0)); n != 3 {
			t.Errorf("messages after a crash: got %d, want 3", n)
		}
	})
	t.Run("clean restart flushes", func(t *testing.T) {
		srv := mustStart(t, rmqtest.Options{OffsetFlushInterval: time.Hour})
		srv.CreateTopic("t", 1)
		c := dial(t, srv.Addr())
		commit(c, 2)
		if err := srv.Restart(true, 0); err != nil {
			t.Fatalf("Restart: %v", err)
		}
		c = dial(t, srv.Addr())
		commit(c, 5)
		if err := srv.Crash(0); err != nil {
			t.Fatalf("Crash: %v", err)
		}
		if got := query(dial(t, srv.Addr())); got != "2" {
			t.Errorf("crash after a clean restart: got offset %s, want 2 (flushed at the restart)", got)
		}
	})
	t.Run("flushed on the timer", func(t *testing.T) {
		srv := mustStart(t, rmqtest.Options{OffsetFlushInterval: 20 * time.Millisecond})
		srv.CreateTopic("t", 1)
		c := dial(t, srv.Addr())
		commit(c, 4)
		waitFor(t, "the flush", func() bool { off, ok := srv.FlushedOffset("g", "t", 0); return ok && off == 4 })
		if err := srv.Crash(0); err != nil {
			t.Fatalf("Crash: %v", err)
		}
		if got := query(dial(t, srv.Addr())); got != "4" {
			t.Errorf("crash after a flush: got offset %s, want 4", got)
		}
	})
}

// TestTrim: a trimmed queue keeps its offsets, reports its new min offset,
// moves a pull from below it up (PULL_OFFSET_MOVED to the min), answers
// QUERY_NOT_FOUND to a group that committed nothing, and cannot send a
// trimmed message back.
func TestTrim(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("t", 1)
	c := dial(t, srv.Addr())
	sent := time.Now().UnixMilli()
	for i := range 5 {
		c.send(t, "t", 0, fmt.Sprint("m", i), nil)
	}
	_, first := c.pull(t, "g", "t", 0, 0, 0)
	srv.Trim("t", 0, 3)

	if msgs := srv.Messages("t", 0); len(msgs) != 2 || msgs[0].QueueOffset != 3 {
		t.Errorf("messages after the trim: got %d starting at %v, want 2 starting at 3", len(msgs), msgs)
	}
	q := map[string]string{"topic": "t", "queueId": "0"}
	for _, tc := range []struct {
		code int16
		want string
	}{{remoting.GetMinOffset, "3"}, {remoting.GetMaxOffset, "5"}} {
		if got := c.mustOK(t, tc.code, q, nil).Ext("offset"); got != tc.want {
			t.Errorf("request %d: got offset %s, want %s", tc.code, got, tc.want)
		}
	}
	search := map[string]string{"topic": "t", "queueId": "0", "timestamp": strconv.FormatInt(sent-1000, 10)}
	if got := c.mustOK(t, remoting.SearchOffsetByTimestamp, search, nil).Ext("offset"); got != "3" {
		t.Errorf("search from before the first message: got %s, want 3", got)
	}
	query := map[string]string{"consumerGroup": "new", "topic": "t", "queueId": "0"}
	if resp := c.call(t, remoting.QueryConsumerOffset, query, nil); resp.Code != remoting.QueryNotFound {
		t.Errorf("offset of a group that committed nothing: got code %d, want %d", resp.Code, remoting.QueryNotFound)
	}
	resp, recs := c.pull(t, "new", "t", 0, 0, 0)
	if resp.Code != remoting.PullOffsetMoved || resp.Ext("nextBeginOffset") != "3" || resp.Ext("minOffset") != "3" || len(recs) != 0 {
		t.Errorf("pull from a trimmed offset: got code %d next %s min %s with %d records, want %d next 3 min 3",
			resp.Code, resp.Ext("nextBeginOffset"), resp.Ext("minOffset"), len(recs), remoting.PullOffsetMoved)
	}
	if resp, recs := c.pull(t, "new", "t", 0, 3, 0); resp.Code != remoting.Success || len(recs) != 2 || string(recs[0].Body) != "m3" {
		t.Errorf("pull from the min offset: got code %d with %d records, want m3 and m4", resp.Code, len(recs))
	}
	c.mustOK(t, remoting.UpdateConsumerOffset, map[string]string{"consumerGroup": "new", "topic": "t", "queueId": "0", "commitOffset": "4"}, nil)
	if got := c.mustOK(t, remoting.QueryConsumerOffset, query, nil).Ext("offset"); got != "4" {
		t.Errorf("offset once committed: got %s, want 4", got)
	}
	back := c.call(t, remoting.ConsumerSendMsgBack, map[string]string{
		"group": "g", "offset": strconv.FormatInt(first[0].CommitLogOffset, 10), "delayLevel": "-1",
		"originMsgId": "X", "originTopic": "t", "unitMode": "false", "maxReconsumeTimes": "16",
	}, nil)
	if back.Code != remoting.SystemError || len(srv.DLQ("g")) != 0 {
		t.Errorf("send-back of a trimmed message: got code %d, %d in the DLQ; want %d, none", back.Code, len(srv.DLQ("g")), remoting.SystemError)
	}
}

// TestConsumerGroup checks registration by heartbeat, the consumer list,
// the retry topic, and NOTIFY_CONSUMER_IDS_CHANGED pushed to the members
// when one joins or its connection goes away.
func TestConsumerGroup(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	a, b := dial(t, srv.Addr()), dial(t, srv.Addr())
	heartbeat(t, a, "A", "g")
	heartbeat(t, a, "A", "g") // a renewal is not news
	if n := a.notifications(); n != 1 {
		t.Errorf("after A joined and renewed: A got %d notifications, want 1", n)
	}
	heartbeat(t, b, "B", "g")
	waitFor(t, "A to hear that B joined", func() bool { return a.notifications() == 2 })

	resp := a.mustOK(t, remoting.GetConsumerListByGroup, map[string]string{"consumerGroup": "g"}, nil)
	var list struct {
		IDs []string `json:"consumerIdList"`
	}
	if err := json.Unmarshal(resp.Body, &list); err != nil || !slices.Equal(list.IDs, []string{"A", "B"}) {
		t.Errorf("consumer list: got %v (%v), want [A B]", list.IDs, err)
	}
	if n := srv.Queues("%RETRY%g"); n != 1 {
		t.Errorf("retry topic: got %d queues, want 1", n)
	}

	_ = b.Close()
	waitFor(t, "B to leave when its connection closed", func() bool { return slices.Equal(srv.Consumers("g"), []string{"A"}) })
	waitFor(t, "A to hear that B left", func() bool { return a.notifications() == 3 })
	if resp := a.call(t, remoting.GetConsumerListByGroup, map[string]string{"consumerGroup": "empty"}, nil); resp.Code != remoting.SystemError {
		t.Errorf("consumer list of an empty group: got code %d, want %d", resp.Code, remoting.SystemError)
	}
}

func TestConsumerExpires(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{ClientTimeout: 200 * time.Millisecond})
	c := dial(t, srv.Addr())
	heartbeat(t, c, "A", "g")
	waitFor(t, "A to expire without heartbeats", func() bool { return len(srv.Consumers("g")) == 0 })
}

func TestLocks(t *testing.T) {
	const ttl = 300 * time.Millisecond
	srv := mustStart(t, rmqtest.Options{LockTTL: ttl})
	srv.CreateTopic("t", 2)
	c := dial(t, srv.Addr())
	mq := func(q int) rmqtest.MessageQueue {
		return rmqtest.MessageQueue{Topic: "t", BrokerName: "broker-a", QueueID: q}
	}
	lock := func(code int16, client string, qs ...int) []int {
		body := map[string]any{"consumerGroup": "g", "clientId": client, "mqSet": []rmqtest.MessageQueue{}}
		var set []rmqtest.MessageQueue
		for _, q := range qs {
			set = append(set, mq(q))
		}
		body["mqSet"] = set
		raw, _ := json.Marshal(body)
		resp := c.mustOK(t, code, nil, raw)
		var out struct {
			MQs []rmqtest.MessageQueue `json:"lockOKMQSet"`
		}
		_ = json.Unmarshal(resp.Body, &out)
		var got []int
		for _, m := range out.MQs {
			got = append(got, m.QueueID)
		}
		slices.Sort(got)
		return got
	}
	steps := []struct {
		name   string
		code   int16
		client string
		queues []int
		sleep  time.Duration
		want   []int // queues locked (lock requests only)
	}{
		{name: "A locks both", code: remoting.LockBatchMQ, client: "A", queues: []int{0, 1}, want: []int{0, 1}},
		{name: "A renews", code: remoting.LockBatchMQ, client: "A", queues: []int{0}, want: []int{0}},
		{name: "B is refused", code: remoting.LockBatchMQ, client: "B", queues: []int{0, 1}, want: nil},
		{name: "B cannot unlock A's", code: remoting.UnlockBatchMQ, client: "B", queues: []int{0}},
		{name: "still refused", code: remoting.LockBatchMQ, client: "B", queues: []int{0}, want: nil},
		{name: "A unlocks 0", code: remoting.UnlockBatchMQ, client: "A", queues: []int{0}},
		{name: "B gets 0", code: remoting.LockBatchMQ, client: "B", queues: []int{0, 1}, want: []int{0}},
		{name: "A's lock on 1 expires", code: remoting.LockBatchMQ, client: "B", queues: []int{1}, sleep: 2 * ttl, want: []int{1}},
	}
	for _, s := range steps {
		time.Sleep(s.sleep)
		got := lock(s.code, s.client, s.queues...)
		if s.code == remoting.LockBatchMQ && !slices.Equal(got, s.want) {
			t.Errorf("%s: got %v locked, want %v", s.name, got, s.want)
		}
	}
	if owner := srv.LockOwner("g", "t", 1); owner != "B" {
		t.Errorf("owner of queue 1: got %q, want B", owner)
	}

	// The test's fast-forward: B's locks expire at once, for group g only.
	lockOther := func(client string) {
		raw, _ := json.Marshal(map[string]any{"consumerGroup": "other", "clientId": client, "mqSet": []rmqtest.MessageQueue{mq(0)}})
		c.mustOK(t, remoting.LockBatchMQ, nil, raw)
	}
	lockOther("C")
	if n := srv.ExpireLocks("g"); n != 2 {
		t.Errorf("ExpireLocks: got %d locks expired, want 2 (B's)", n)
	}
	if got := lock(remoting.LockBatchMQ, "A", 0, 1); !slices.Equal(got, []int{0, 1}) {
		t.Errorf("after ExpireLocks: got %v locked by A, want [0 1]", got)
	}
	if owner := srv.LockOwner("other", "t", 0); owner != "C" {
		t.Errorf("another group's lock after ExpireLocks: got owner %q, want C", owner)
	}
}

// TestDelayedMessage: a message with DELAY level L is stored at once in
// SCHEDULE_TOPIC_XXXX, queue L-1, with its topic and queue in REAL_TOPIC and
// REAL_QID (the send result names the queue asked for and the schedule
// queue's offset), and when due it is stored again in its real queue as a
// new message, without DELAY, as a 4.9.4 broker does.
func TestDelayedMessage(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{DelayLevels: shortDelays()})
	srv.CreateTopic("t", 2)
	c := dial(t, srv.Addr())
	sent := time.Now()
	resp := c.send(t, "t", 1, "later", map[string]string{remoting.PropDelayLevel: "4", remoting.PropKeys: "r1"}) // 200ms
	c.send(t, "t", 1, "now", nil)

	sched := srv.Messages(rmqtest.ScheduleTopic, 3)
	if len(sched) != 1 {
		t.Fatalf("schedule queue of level 4: got %d messages, want 1", len(sched))
	}
	wantProps := map[string]string{remoting.PropDelayLevel: "4", remoting.PropKeys: "r1", remoting.PropRealTopic: "t", remoting.PropRealQueueID: "1"}
	if s := sched[0]; string(s.Body) != "later" || s.QueueOffset != 0 || !maps.Equal(s.Properties, wantProps) {
		t.Errorf("scheduled: got %+v, want body later at offset 0 with properties %v", s, wantProps)
	}
	if resp.Ext("queueId") != "1" || resp.Ext("queueOffset") != "0" {
		t.Errorf("send result: got queueId %s, queueOffset %s; want the queue asked for (1) and the schedule queue's offset (0)", resp.Ext("queueId"), resp.Ext("queueOffset"))
	}
	if msgs := srv.Messages("t", 1); len(msgs) != 1 || string(msgs[0].Body) != "now" || srv.Scheduled() != 1 {
		t.Fatalf("right after sending: got %d stored in t, %d scheduled; want only the undelayed one in t", len(msgs), srv.Scheduled())
	}

	waitFor(t, "the delayed message", func() bool { return len(srv.Messages("t", 1)) == 2 })
	if since := time.Since(sent); since < 200*time.Millisecond {
		t.Errorf("delayed message stored after %v, want >= 200ms", since)
	}
	m := srv.Messages("t", 1)[1]
	delete(wantProps, remoting.PropDelayLevel)
	if string(m.Body) != "later" || m.QueueOffset != 1 || !maps.Equal(m.Properties, wantProps) || m.Stored.Before(sched[0].Stored.Add(200*time.Millisecond)) {
		t.Errorf("delivered: got %+v, want body later at offset 1, stored 200ms after it was scheduled, with properties %v", m, wantProps)
	}
	if n := srv.Scheduled(); n != 0 || len(srv.Messages(rmqtest.ScheduleTopic, 3)) != 1 {
		t.Errorf("after delivery: got %d waiting, want 0, and the schedule queue keeping its message", n)
	}
}

// TestDelayLevels: levels above the largest are clamped to it, and each
// level's queue delivers in the order its messages were stored, each once.
func TestDelayLevels(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{DelayLevels: shortDelays()})
	srv.CreateTopic("t", 4)
	c := dial(t, srv.Addr())
	for i := range 4 {
		c.send(t, "t", 3-i, fmt.Sprint("m", i), map[string]string{remoting.PropDelayLevel: "2"})
	}
	c.send(t, "t", 0, "clamped", map[string]string{remoting.PropDelayLevel: "99"})
	if got := srv.Messages(rmqtest.ScheduleTopic, 17); len(got) != 1 || got[0].Properties[remoting.PropDelayLevel] != "18" {
		t.Errorf("level 99: got %v in the queue of level 18, want the message with DELAY 18", got)
	}
	waitFor(t, "every delayed message", func() bool { return len(srv.AllMessages("t")) == 5 })
	delivered := map[int64]string{} // commit log offset -> body
	for q := range 4 {
		_, recs := c.pull(t, "inspect", "t", q, 0, 0)
		for _, r := range recs {
			if string(r.Body) != "clamped" {
				delivered[r.CommitLogOffset] = string(r.Body)
			}
		}
	}
	var order []string
	for _, off := range slices.Sorted(maps.Keys(delivered)) {
		order = append(order, delivered[off])
	}
	if !slices.Equal(order, []string{"m0", "m1", "m2", "m3"}) {
		t.Errorf("level 2: got %v stored in this order, want m0..m3 once each, in the order they were sent", order)
	}
}

// TestDelayedAcrossRestart: the schedule's progress survives a restart on
// the broker's disk (delayOffset.json): what was delivered before it is not
// delivered again, what was still waiting is delivered after it, once; a
// broker whose disk was lost has neither.
func TestDelayedAcrossRestart(t *testing.T) {
	tests := []struct {
		name      string
		keepState bool
		want      []string // in t afterwards
	}{
		{"state kept", true, []string{"early", "late"}},
		{"state lost", false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			levels := shortDelays()
			levels[17] = 700 * time.Millisecond
			srv := mustStart(t, rmqtest.Options{DelayLevels: levels})
			srv.CreateTopic("t", 1)
			c := dial(t, srv.Addr())
			c.send(t, "t", 0, "early", map[string]string{remoting.PropDelayLevel: "1"}) // 50ms
			c.send(t, "t", 0, "late", map[string]string{remoting.PropDelayLevel: "18"}) // 700ms
			waitFor(t, "the early message", func() bool { return len(srv.Messages("t", 0)) == 1 })
			if srv.Scheduled() != 1 {
				t.Fatalf("before the restart: got %d waiting, want the late one", srv.Scheduled())
			}
			if err := srv.Restart(tc.keepState, 0); err != nil {
				t.Fatalf("Restart: %v", err)
			}
			if !tc.keepState {
				srv.CreateTopic("t", 1)
			}
			// Delivery moves a message and its level's offset at once, so
			// with nothing waiting, every delivery there will be is done.
			waitFor(t, "the schedule to drain", func() bool { return srv.Scheduled() == 0 })
			var got []string
			for _, m := range srv.Messages("t", 0) {
				got = append(got, string(m.Body))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("delivered: got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSendBack checks CONSUMER_SEND_MSG_BACK: to the retry topic with one
// more reconsume and a delay, or to the dead-letter queue when the maximum
// is reached or the level is negative (what orderly consumers send).
func TestSendBack(t *testing.T) {
	tests := []struct {
		name      string
		level     string
		maxTimes  string
		wantRetry bool
	}{
		{name: "retry", level: "0", maxTimes: "16", wantRetry: true},
		{name: "maximum reached", level: "0", maxTimes: "0", wantRetry: false},
		{name: "negative level", level: "-1", maxTimes: "16", wantRetry: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := mustStart(t, rmqtest.Options{DelayLevels: shortDelays()})
			srv.CreateTopic("t", 1)
			c := dial(t, srv.Addr())
			c.send(t, "t", 0, "poison", map[string]string{remoting.PropKeys: "r1"})
			_, recs := c.pull(t, "g", "t", 0, 0, 0)
			if len(recs) != 1 {
				t.Fatalf("pull: got %d records, want 1", len(recs))
			}
			c.mustOK(t, remoting.ConsumerSendMsgBack, map[string]string{
				"group": "g", "offset": strconv.FormatInt(recs[0].CommitLogOffset, 10), "delayLevel": tc.level,
				"originMsgId": "X", "originTopic": "t", "unitMode": "false", "maxReconsumeTimes": tc.maxTimes,
			}, nil)
			var got []rmqtest.Message
			if tc.wantRetry {
				waitFor(t, "the retry message", func() bool { got = srv.Retries("g"); return len(got) == 1 })
				if len(srv.DLQ("g")) != 0 {
					t.Errorf("DLQ: got %d messages, want 0", len(srv.DLQ("g")))
				}
			} else {
				got = srv.DLQ("g")
				if len(got) != 1 || len(srv.Retries("g")) != 0 {
					t.Fatalf("got %d in DLQ and %d retries, want 1 and 0", len(got), len(srv.Retries("g")))
				}
			}
			m := got[0]
			if string(m.Body) != "poison" || m.Keys() != "r1" || m.ReconsumeTimes != 1 || m.Properties[remoting.PropRetryTopic] != "t" {
				t.Errorf("sent back: got %+v, want body poison, keys r1, reconsume 1, RETRY_TOPIC t", m)
			}
		})
	}
}

func TestFaults(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("t", 1)
	c := dial(t, srv.Addr())

	srv.InjectFault(remoting.SendMessage, rmqtest.Fault{Code: remoting.SystemBusy, Remark: "busy", Times: 1})
	if resp := c.send(t, "t", 0, "a", nil); resp.Code != remoting.SystemBusy || len(srv.Messages("t", 0)) != 0 {
		t.Errorf("injected error: got code %d with %d stored, want %d with none", resp.Code, len(srv.Messages("t", 0)), remoting.SystemBusy)
	}
	if resp := c.send(t, "t", 0, "b", nil); resp.Code != remoting.Success {
		t.Errorf("after the fault's one use: got code %d, want success", resp.Code)
	}

	srv.InjectFault(remoting.SendMessage, rmqtest.Fault{Swallow: true})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := c.Call(ctx, remoting.NewRequest(remoting.SendMessage, sendExt("t", 0, nil), []byte("c")))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || len(srv.Messages("t", 0)) != 2 {
		t.Errorf("swallowed response: got %v with %d stored, want a timeout with the message stored", err, len(srv.Messages("t", 0)))
	}

	srv.ClearFaults()
	srv.SetLatency(150 * time.Millisecond)
	start := time.Now()
	c.send(t, "t", 0, "d", nil)
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("with 150ms latency: answered after %v", took)
	}
	srv.ClearFaults()

	if n := srv.DropConnections(); n != 1 {
		t.Errorf("DropConnections: got %d, want 1", n)
	}
	select {
	case <-c.Done():
	case <-time.After(callTimeout):
		t.Fatalf("connection still open after DropConnections")
	}
	c2 := dial(t, srv.Addr()) // the listener stays open
	c2.mustOK(t, remoting.GetMaxOffset, map[string]string{"topic": "t", "queueId": "0"}, nil)

	if resp := c2.call(t, 999, nil, nil); resp.Code != remoting.RequestCodeNotSupported {
		t.Errorf("unknown request code: got %d, want %d", resp.Code, remoting.RequestCodeNotSupported)
	}
}

func TestRestart(t *testing.T) {
	tests := []struct {
		name      string
		keepState bool
		wantMsgs  int
	}{
		{"state kept", true, 1},
		{"state lost", false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := mustStart(t, rmqtest.Options{})
			srv.CreateTopic("t", 1)
			c := dial(t, srv.Addr())
			c.send(t, "t", 0, "a", nil)
			c.mustOK(t, remoting.UpdateConsumerOffset, map[string]string{"consumerGroup": "g", "topic": "t", "queueId": "0", "commitOffset": "1"}, nil)
			heartbeat(t, c, "A", "g")
			addr := srv.Addr()

			if err := srv.Restart(tc.keepState, 100*time.Millisecond); err != nil {
				t.Fatalf("Restart: %v", err)
			}
			select {
			case <-c.Done():
			case <-time.After(callTimeout):
				t.Fatalf("old connection still open after the restart")
			}
			if srv.Addr() != addr {
				t.Errorf("address after restart: got %s, want %s", srv.Addr(), addr)
			}
			c2 := dial(t, addr)
			if got := len(srv.Messages("t", 0)); got != tc.wantMsgs {
				t.Errorf("messages after restart: got %d, want %d", got, tc.wantMsgs)
			}
			_, kept := srv.CommittedOffset("g", "t", 0)
			if kept != tc.keepState {
				t.Errorf("committed offset kept: got %v, want %v", kept, tc.keepState)
			}
			if n := len(srv.Consumers("g")); n != 0 {
				t.Errorf("registered consumers after restart: got %d, want 0 (they live in memory)", n)
			}
			if tc.keepState {
				c2.send(t, "t", 0, "b", nil)
				if resp, recs := c2.pull(t, "g", "t", 0, 0, 0); resp.Code != remoting.Success || len(recs) != 2 {
					t.Errorf("pull after restart: got code %d with %d records, want 2", resp.Code, len(recs))
				}
			}
		})
	}
}

// TestListener checks the extra port: routes through it name it as the
// broker, and closing it cuts its clients off (and out of their groups)
// while other clients carry on.
func TestListener(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("t", 1)
	l, err := srv.Listen()
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	viaL, viaMain := dial(t, l.Addr()), dial(t, srv.Addr())
	resp := viaL.mustOK(t, remoting.GetRouteInfoByTopic, map[string]string{"topic": "t"}, nil)
	var r struct {
		BrokerDatas []struct {
			BrokerAddrs map[string]string `json:"brokerAddrs"`
		} `json:"brokerDatas"`
	}
	if err := json.Unmarshal(resp.Body, &r); err != nil || len(r.BrokerDatas) != 1 || r.BrokerDatas[0].BrokerAddrs["0"] != l.Addr() {
		t.Fatalf("route through the listener: got %+v (%v), want broker at %s", r, err, l.Addr())
	}
	heartbeat(t, viaL, "dying", "g")
	heartbeat(t, viaMain, "alive", "g")

	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-viaL.Done():
	case <-time.After(callTimeout):
		t.Fatalf("connection through the closed listener still open")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := remoting.Dial(ctx, l.Addr(), nil); err == nil {
		t.Errorf("dial the closed listener: got nil error, want connection refused")
	}
	waitFor(t, "the cut-off client to leave its group", func() bool { return slices.Equal(srv.Consumers("g"), []string{"alive"}) })
	viaMain.mustOK(t, remoting.GetMaxOffset, map[string]string{"topic": "t", "queueId": "0"}, nil)
}

// TestListenAt: a listener on an address of the test's choosing (another
// loopback IP, the port of an earlier listener) is named as the broker to
// the clients that come in through it.
func TestListenAt(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	srv.CreateTopic("t", 1)
	first, err := srv.ListenAt("127.0.0.2:0")
	if err != nil {
		t.Fatalf("ListenAt: %v", err)
	}
	_, port, _ := net.SplitHostPort(first.Addr())
	moved, err := srv.ListenAt(net.JoinHostPort("127.0.0.3", port))
	if err != nil {
		t.Fatalf("ListenAt the same port on another address: %v", err)
	}
	for _, l := range []*rmqtest.Listener{first, moved} {
		resp := dial(t, l.Addr()).mustOK(t, remoting.GetRouteInfoByTopic, map[string]string{"topic": "t"}, nil)
		if !strings.Contains(string(resp.Body), `"`+l.Addr()+`"`) {
			t.Errorf("route through %s: got %s, want the broker there", l.Addr(), resp.Body)
		}
	}
}

// TestGarbage checks that a bad frame closes the connection without
// disturbing the server.
func TestGarbage(t *testing.T) {
	srv := mustStart(t, rmqtest.Options{})
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte{0, 0, 0, 8, 7, 0, 0, 0, 1, 2, 3, 4}); err != nil {
		t.Fatalf("write: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(callTimeout))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Errorf("read after a bad frame: got data, want the connection closed")
	}
	if resp := dial(t, srv.Addr()).call(t, remoting.GetRouteInfoByTopic, map[string]string{"topic": "x"}, nil); resp.Code != remoting.TopicNotExist {
		t.Errorf("new connection after a bad frame: got code %d, want %d", resp.Code, remoting.TopicNotExist)
	}
}
