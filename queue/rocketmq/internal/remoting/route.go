package remoting

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Route bodies (GET_ROUTEINFO_BY_TOPIC) come in two JSON dialects, chosen by
// the name server per request (4.9.4's DefaultRequestProcessor): standard
// JSON to a request of Version or later, or with the header
// acceptStandardJsonOnly=true; fastjson's default otherwise, which writes the
// Long keys of brokerAddrs unquoted ({0:"host:port"}), not JSON. Name
// servers before 4.9.4 answer every request in fastjson's dialect. Example
// bodies of both are in queue/rocketmq/testdata.

// ExtStandardJSON is the route request header asking for standard JSON.
const ExtStandardJSON = "acceptStandardJsonOnly"

// MasterID is the broker id of a master in BrokerData.BrokerAddrs.
const MasterID = 0

// RouteRequest returns a GET_ROUTEINFO_BY_TOPIC request for topic that asks
// for standard JSON both ways a 4.9.4 name server honours.
func RouteRequest(topic string) *Command {
	return NewRequest(GetRouteInfoByTopic, map[string]string{"topic": topic, ExtStandardJSON: "true"}, nil)
}

// WantsStandardJSON reports whether a 4.9.4 name server answers the route
// request req in standard JSON. The header is a Java Boolean, parsed
// ignoring case.
func WantsStandardJSON(req *Command) bool {
	return req.Version >= Version || strings.EqualFold(req.Ext(ExtStandardJSON), "true")
}

// TopicRoute is a route body: the fields of 4.9.4's TopicRouteData. Fields
// are declared in name order, the order fastjson writes them in.
type TopicRoute struct {
	BrokerDatas       []BrokerData        `json:"brokerDatas"`
	FilterServerTable map[string][]string `json:"filterServerTable"`
	// OrderTopicConf is null, so left out, unless the name server runs with
	// orderMessageEnable.
	OrderTopicConf string      `json:"orderTopicConf,omitempty"`
	QueueDatas     []QueueData `json:"queueDatas"`
}

// BrokerData is one broker of a route (4.9.4's BrokerData).
type BrokerData struct {
	BrokerAddrs map[int64]string `json:"brokerAddrs"` // broker id -> address
	BrokerName  string           `json:"brokerName"`
	Cluster     string           `json:"cluster"`
}

// QueueData is one broker's queues of a topic (4.9.4's QueueData).
type QueueData struct {
	BrokerName     string `json:"brokerName"`
	Perm           int    `json:"perm"`
	ReadQueueNums  int    `json:"readQueueNums"`
	TopicSysFlag   int    `json:"topicSysFlag"`
	WriteQueueNums int    `json:"writeQueueNums"`
}

// Encode returns r in standard JSON, or in fastjson's default dialect when
// standard is false. Both write fields and map keys sorted.
func (r TopicRoute) Encode(standard bool) ([]byte, error) {
	if r.FilterServerTable == nil {
		r.FilterServerTable = map[string][]string{}
	}
	if standard {
		return json.Marshal(r)
	}
	var b bytes.Buffer
	b.WriteString(`{"brokerDatas":[`)
	for i, bd := range r.BrokerDatas {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"brokerAddrs":{`)
		for j, id := range slices.Sorted(maps.Keys(bd.BrokerAddrs)) {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(id, 10)) // the unquoted key
			b.WriteByte(':')
			writeJSON(&b, bd.BrokerAddrs[id])
		}
		b.WriteString(`},"brokerName":`)
		writeJSON(&b, bd.BrokerName)
		b.WriteString(`,"cluster":`)
		writeJSON(&b, bd.Cluster)
		b.WriteByte('}')
	}
	b.WriteString(`],"filterServerTable":`)
	writeJSON(&b, r.FilterServerTable)
	if r.OrderTopicConf != "" {
		b.WriteString(`,"orderTopicConf":`)
		writeJSON(&b, r.OrderTopicConf)
	}
	b.WriteString(`,"queueDatas":`)
	writeJSON(&b, r.QueueDatas)
	b.WriteByte('}')
	return b.Bytes(), nil
}

// writeJSON writes v, which cannot fail to encode (strings, the filter
// server table, queue data).
func writeJSON(b *bytes.Buffer, v any) {
	out, _ := json.Marshal(v)
	b.Write(out)
}

// ParseRoute decodes a route body in either dialect.
func ParseRoute(body []byte) (TopicRoute, error) {
	var r TopicRoute
	if err := json.Unmarshal(QuoteNumericKeys(body), &r); err != nil {
		return TopicRoute{}, fmt.Errorf("remoting: route body: %w", err)
	}
	return r, nil
}

// QuoteNumericKeys returns b with every object key written as a bare number
// (fastjson's Long map keys) put in quotes, which makes fastjson's dialect
// standard JSON. Standard JSON comes back unchanged: strings are copied as
// they are, whatever braces, colons or escaped quotes they hold, and numbers
// in value positions are left alone.
func QuoteNumericKeys(b []byte) []byte {
	out := make([]byte, 0, len(b)+8)
	var open []byte // '{' or '[' of each container not closed yet
	atKey := false  // after '{' or an object's ',': a key comes next
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '"':
			end := stringEnd(b, i)
			out = append(out, b[i:end]...)
			i = end - 1
			atKey = false
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			out = append(out, c)
		case atKey && (c == '-' || '0' <= c && c <= '9'):
			end := i + 1
			for end < len(b) && isNumberByte(b[end]) {
				end++
			}
			out = append(out, '"')
			out = append(out, b[i:end]...)
			out = append(out, '"')
			i = end - 1
			atKey = false
		default:
			out = append(out, c)
			atKey = false
			switch c {
			case '{':
				open = append(open, c)
				atKey = true
			case '[':
				open = append(open, c)
			case '}', ']':
				if len(open) > 0 {
					open = open[:len(open)-1]
				}
			case ',':
				atKey = len(open) > 0 && open[len(open)-1] == '{'
			}
		}
	}
	return out
}

// stringEnd returns the index just past the string that starts with the
// quote at b[start], or len(b) if it is not closed.
func stringEnd(b []byte, start int) int {
	for i := start + 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++ // the escaped byte, a quote included
		case '"':
			return i + 1
		}
	}
	return len(b)
}

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}
