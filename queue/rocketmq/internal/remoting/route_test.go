package remoting

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"testing"
)

// The vectors under queue/rocketmq/testdata come from RocketMQ 4.9.4 (its
// README says how each was made).

func readVector(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", name))
	if err != nil {
		t.Fatalf("read vector: %v", err)
	}
	return bytes.TrimSpace(b)
}

// goldenRoute is the route of both route vectors.
func goldenRoute() TopicRoute {
	return TopicRoute{
		BrokerDatas:       []BrokerData{{BrokerAddrs: map[int64]string{MasterID: "172.18.0.3:10911"}, BrokerName: "broker-a", Cluster: "DefaultCluster"}},
		FilterServerTable: map[string][]string{},
		QueueDatas:        []QueueData{{BrokerName: "broker-a", Perm: 6, ReadQueueNums: 16, TopicSysFlag: 0, WriteQueueNums: 16}},
	}
}

// TestGoldenRoutes: the double writes 4.9.4's route bodies in both dialects
// byte for byte, and ParseRoute reads both.
func TestGoldenRoutes(t *testing.T) {
	tests := []struct {
		file     string
		standard bool
	}{
		{"route-fastjson-4.9.4.json", false},
		{"route-standard-4.9.4.json", true},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			want := readVector(t, tc.file)
			got, err := goldenRoute().Encode(tc.standard)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Encode(standard %v):\ngot  %s\nwant %s", tc.standard, got, want)
			}
			r, err := ParseRoute(want)
			if err != nil {
				t.Fatalf("ParseRoute: %v", err)
			}
			if !reflect.DeepEqual(r, goldenRoute()) {
				t.Errorf("ParseRoute: got %+v, want %+v", r, goldenRoute())
			}
		})
	}
}

func TestWantsStandardJSON(t *testing.T) {
	tests := []struct {
		name    string
		version int16
		header  string
		want    bool
	}{
		{"4.9.4", 401, "", true},
		{"later", 450, "", true},
		{"4.9.1", 395, "", false},
		{"library v2.1.2", 317, "", false},
		{"old version with the header", 317, "true", true},
		{"header in capitals", 317, "TRUE", true},
		{"header false", 317, "false", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := &Command{Code: GetRouteInfoByTopic, Version: tc.version, ExtFields: map[string]string{"topic": "t"}}
			if tc.header != "" {
				req.ExtFields[ExtStandardJSON] = tc.header
			}
			if got := WantsStandardJSON(req); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	if req := RouteRequest("t"); !WantsStandardJSON(req) || req.Ext(ExtStandardJSON) != "true" || req.Ext("topic") != "t" {
		t.Errorf("RouteRequest: got %+v, want topic t asking for standard JSON by version and header", req)
	}
}

func TestQuoteNumericKeys(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"fastjson broker addresses", `{"brokerAddrs":{0:"h:1",1:"h:2"}}`, `{"brokerAddrs":{"0":"h:1","1":"h:2"}}`},
		{"standard JSON unchanged", `{"brokerAddrs":{"0":"h:1"}}`, `{"brokerAddrs":{"0":"h:1"}}`},
		{"whitespace", "{ 0 : \"a\" ,\n\t-12:\"b\"}", "{ \"0\" : \"a\" ,\n\t\"-12\":\"b\"}"},
		{"numbers as values untouched", `{"a":0,"b":[1,2,{3:4}],"c":-1.5e3}`, `{"a":0,"b":[1,2,{"3":4}],"c":-1.5e3}`},
		{"array elements are no keys", `[0,{1:2},3]`, `[0,{"1":2},3]`},
		{"braces and colons inside strings", `{"s":"{0:\"x\",1:[2]}",5:"}{,0:"}`, `{"s":"{0:\"x\",1:[2]}","5":"}{,0:"}`},
		{"escaped backslash before a quote", `{"s":"a\\",7:"b"}`, `{"s":"a\\","7":"b"}`},
		{"escaped quotes and unicode", `{"k\"0":"\u0030:1",8:"\""}`, `{"k\"0":"\u0030:1","8":"\""}`},
		{"nested objects", `{"a":{1:{2:{3:"x"}}}}`, `{"a":{"1":{"2":{"3":"x"}}}}`},
		{"empty object", `{}`, `{}`},
		{"unterminated string kept", `{"a":"b`, `{"a":"b`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(QuoteNumericKeys([]byte(tc.in))); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// FuzzQuoteNumericKeys checks both directions on any JSON the fuzzer finds:
// standard JSON comes back byte for byte, and the same value written with
// its numeric keys unquoted (fastjson's way) comes back as equal JSON.
func FuzzQuoteNumericKeys(f *testing.F) {
	for _, s := range []string{
		`{"brokerDatas":[{"brokerAddrs":{"0":"172.18.0.3:10911"},"brokerName":"broker-a","cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[]}`,
		`{"0":{"1":"{2:\"3\"}"},"-4":[5,{"6":null}],"s":"\\\"7\":8"}`,
		`[1,"a",true,{"x":{"9":0.5}}]`,
		`"plain"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := QuoteNumericKeys([]byte(s)) // never panics, whatever s is
		var v any
		if json.Unmarshal([]byte(s), &v) != nil {
			return
		}
		if !bytes.Equal(out, []byte(s)) {
			t.Fatalf("standard JSON changed:\nin  %s\nout %s", s, out)
		}
		fast := unquotedKeys(t, v)
		var back any
		if err := json.Unmarshal(QuoteNumericKeys(fast), &back); err != nil {
			t.Fatalf("fastjson form %s: %v", fast, err)
		}
		if !reflect.DeepEqual(back, v) {
			t.Fatalf("fastjson form %s: got %v, want %v", fast, back, v)
		}
	})
}

var integerKey = regexp.MustCompile(`^-?[0-9]+$`)

// unquotedKeys writes v as JSON with its integer keys unquoted, as fastjson
// writes a map with Long keys.
func unquotedKeys(t *testing.T, v any) []byte {
	var b bytes.Buffer
	var write func(v any)
	write = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			b.WriteByte('{')
			for i, k := range slices.Sorted(maps.Keys(v)) {
				if i > 0 {
					b.WriteByte(',')
				}
				if integerKey.MatchString(k) {
					b.WriteString(k)
				} else {
					writeJSON(&b, k)
				}
				b.WriteByte(':')
				write(v[k])
			}
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					b.WriteByte(',')
				}
				write(e)
			}
			b.WriteByte(']')
		default:
			out, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("marshal %v: %v", v, err)
			}
			b.Write(out)
		}
	}
	write(v)
	return b.Bytes()
}
