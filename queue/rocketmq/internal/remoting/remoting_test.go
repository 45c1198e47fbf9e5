package remoting

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"net"
	"reflect"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		cmd  *Command
	}{
		{"request with body", NewRequest(SendMessage, map[string]string{"topic": "t", "queueId": "3"}, []byte("body"))},
		{"request without body", NewRequest(HeartBeat, nil, nil)},
		{"response", NewResponse(&Command{Opaque: 42}, PullNotFound, "no message")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			frame, err := Encode(tc.cmd)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if got := int(binary.BigEndian.Uint32(frame)); got != len(frame)-4 {
				t.Errorf("length prefix: got %d, want %d", got, len(frame)-4)
			}
			got, err := Read(bufio.NewReader(bytes.NewReader(frame)))
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if got.Code != tc.cmd.Code || got.Opaque != tc.cmd.Opaque || got.IsResponse() != tc.cmd.IsResponse() ||
				got.Remark != tc.cmd.Remark || !bytes.Equal(got.Body, tc.cmd.Body) || !maps.Equal(got.ExtFields, tc.cmd.ExtFields) {
				t.Errorf("got %+v, want %+v", got, tc.cmd)
			}
		})
	}
}

func TestReadRejectsBadFrames(t *testing.T) {
	frame := func(n uint32, word uint32, rest []byte) []byte {
		b := binary.BigEndian.AppendUint32(nil, n)
		b = binary.BigEndian.AppendUint32(b, word)
		return append(b, rest...)
	}
	tests := []struct {
		name string
		in   []byte
	}{
		{"binary serialization", frame(6, 1<<24|2, []byte("{}"))},
		{"header longer than frame", frame(6, 50, []byte("{}"))},
		{"length above limit", frame(MaxFrame+1, 2, nil)},
		{"header not JSON", frame(6, 2, []byte("no"))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Read(bufio.NewReader(bytes.NewReader(tc.in))); !errors.Is(err, ErrFrame) {
				t.Errorf("got %v, want an error wrapping ErrFrame", err)
			}
		})
	}
}

func TestProperties(t *testing.T) {
	props := map[string]string{"KEYS": "r1", "SHARDING_KEY": "camp", "EMPTY": ""}
	enc := EncodeProperties(props)
	if want := "EMPTY\x01\x02KEYS\x01r1\x02SHARDING_KEY\x01camp"; enc != want {
		t.Errorf("encode: got %q, want %q (no separator after the last pair, as a broker writes)", enc, want)
	}
	for _, in := range []string{enc, enc + "\x02", enc + "\x02garbage"} {
		if got := DecodeProperties(in); !maps.Equal(got, props) {
			t.Errorf("decode %q: got %v, want %v", in, got, props)
		}
	}
	if got := EncodeProperties(nil); got != "" {
		t.Errorf("encode nothing: got %q, want empty", got)
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	host := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 10911}
	recs := []Record{
		{Topic: "t", QueueID: 2, QueueOffset: 7, CommitLogOffset: 99, Flag: 1, SysFlag: 0, BornTimestamp: 1000,
			BornHost: host, StoreTimestamp: 2000, StoreHost: host, ReconsumeTimes: 3, Body: []byte("hello"),
			Properties: map[string]string{"KEYS": "r1"}},
		{Topic: "%RETRY%g", QueueID: 0, Body: []byte{}, Properties: map[string]string{}, BornHost: host, StoreHost: host},
	}
	b, err := EncodeRecords(nil, recs...)
	if err != nil {
		t.Fatalf("EncodeRecords: %v", err)
	}
	got, err := DecodeRecords(b)
	if err != nil {
		t.Fatalf("DecodeRecords: %v", err)
	}
	if len(got) != len(recs) {
		t.Fatalf("got %d records, want %d", len(got), len(recs))
	}
	for i := range recs {
		w, g := recs[i], got[i]
		if g.Topic != w.Topic || g.QueueID != w.QueueID || g.QueueOffset != w.QueueOffset || g.CommitLogOffset != w.CommitLogOffset ||
			g.ReconsumeTimes != w.ReconsumeTimes || !bytes.Equal(g.Body, w.Body) || !maps.Equal(g.Properties, w.Properties) ||
			g.StoreHost.String() != w.StoreHost.String() || g.BornTimestamp != w.BornTimestamp {
			t.Errorf("record %d: got %+v, want %+v", i, g, w)
		}
	}
	if _, err := DecodeRecords(b[:len(b)-3]); err == nil {
		t.Errorf("truncated records: got nil error")
	}
}

func TestBatchRoundTrip(t *testing.T) {
	msgs := []BatchMessage{
		{Flag: 0, Body: []byte("a"), Properties: map[string]string{"KEYS": "1"}},
		{Flag: 5, Body: []byte("bb"), Properties: map[string]string{}},
	}
	got, err := DecodeBatch(EncodeBatch(msgs...))
	if err != nil {
		t.Fatalf("DecodeBatch: %v", err)
	}
	if !reflect.DeepEqual(got, msgs) {
		t.Errorf("got %+v, want %+v", got, msgs)
	}
}

func TestOffsetMsgID(t *testing.T) {
	got := OffsetMsgID(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 10911}, 255)
	if want := "7F00000100002A9F00000000000000FF"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
