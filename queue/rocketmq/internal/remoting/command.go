// Package remoting is the small part of RocketMQ's remoting protocol that
// flashsale speaks itself, without the rocketmq-client-go library: frames,
// command headers, message records and a minimal client.
//
// The broker double (queue/rocketmq/rmqtest) serves the protocol with it, the
// driver uses the client for the few requests the library does not expose
// (readiness probes, queue unlocks), and the double's own tests use the
// client to talk to it. Keeping it free of the library keeps all three
// race-clean: the library's own data races stay in the library.
//
// Frame layout (big-endian): int32 length of what follows, int32 header
// word (top byte: serialization type, 0 = JSON; low 24 bits: header
// length), the JSON header, then the body.
package remoting

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Request codes used by flashsale, the library (v2.1.2) and the double.
const (
	SendMessage              int16 = 10
	PullMessage              int16 = 11
	QueryConsumerOffset      int16 = 14
	UpdateConsumerOffset     int16 = 15
	UpdateAndCreateTopic     int16 = 17
	SearchOffsetByTimestamp  int16 = 29
	GetMaxOffset             int16 = 30
	GetMinOffset             int16 = 31
	HeartBeat                int16 = 34
	UnregisterClient         int16 = 35
	ConsumerSendMsgBack      int16 = 36
	GetConsumerListByGroup   int16 = 38
	NotifyConsumerIdsChanged int16 = 40
	LockBatchMQ              int16 = 41
	UnlockBatchMQ            int16 = 42
	GetRouteInfoByTopic      int16 = 105
	SendBatchMessage         int16 = 320
)

// Response codes.
const (
	Success                  int16 = 0
	SystemError              int16 = 1
	SystemBusy               int16 = 2
	RequestCodeNotSupported  int16 = 3
	MessageIllegal           int16 = 13
	ServiceNotAvailable      int16 = 14
	NoPermission             int16 = 16
	TopicNotExist            int16 = 17
	PullNotFound             int16 = 19
	PullRetryImmediately     int16 = 20
	PullOffsetMoved          int16 = 21
	QueryNotFound            int16 = 22
	SubscriptionNotExist     int16 = 24
	SubscriptionGroupNotFind int16 = 26
)

// flagResponse marks a command as a response to the request with the same
// opaque.
const flagResponse = 1

// MaxFrame bounds a frame's length, so a corrupt length cannot make a reader
// allocate gigabytes. RocketMQ's own limit is 16 MiB.
const MaxFrame = 16 << 20

// Command is one request or response. ExtFields values are strings on the
// wire even when they hold numbers: the library decodes them as strings.
type Command struct {
	Code      int16             `json:"code"`
	Language  string            `json:"language"`
	Version   int16             `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int32             `json:"flag"`
	Remark    string            `json:"remark,omitempty"`
	ExtFields map[string]string `json:"extFields,omitempty"`
	Body      []byte            `json:"-"`
}

// IsResponse reports whether c answers a request.
func (c *Command) IsResponse() bool { return c.Flag&flagResponse != 0 }

// Ext returns the extension field key ("" if absent).
func (c *Command) Ext(key string) string { return c.ExtFields[key] }

// NewRequest returns a request with the given code, extension fields and body.
// The opaque is set by whoever sends it.
func NewRequest(code int16, ext map[string]string, body []byte) *Command {
	return &Command{Code: code, Language: "GO", Version: Version, ExtFields: ext, Body: body}
}

// NewResponse returns the response to req with the given code and remark.
func NewResponse(req *Command, code int16, remark string) *Command {
	return &Command{Code: code, Language: "JAVA", Version: Version, Opaque: req.Opaque, Flag: flagResponse,
		Remark: remark, ExtFields: map[string]string{}}
}

// Version is the protocol version flashsale's requests and the double's
// responses carry: MQVersion V4_9_4, ordinal 401. A name server answers a
// route query from this version on in standard JSON (see RouteRequest); the
// library stores a broker's version and only compares it with V4_1_0.
const Version int16 = 401

// ErrFrame reports a frame that cannot be decoded.
var ErrFrame = errors.New("remoting: bad frame")

// Encode returns c as one frame.
func Encode(c *Command) ([]byte, error) {
	header, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("remoting: encode header: %w", err)
	}
	n := 4 + len(header) + len(c.Body)
	if n > MaxFrame || len(header) > 1<<24-1 {
		return nil, fmt.Errorf("%w: %d bytes is too large", ErrFrame, n)
	}
	buf := make([]byte, 4+n)
	binary.BigEndian.PutUint32(buf[0:], uint32(n))
	binary.BigEndian.PutUint32(buf[4:], uint32(len(header))) // top byte 0: JSON
	copy(buf[8:], header)
	copy(buf[8+len(header):], c.Body)
	return buf, nil
}

// Read reads one frame from r.
func Read(r *bufio.Reader) (*Command, error) {
	var pre [8]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(pre[0:]))
	word := binary.BigEndian.Uint32(pre[4:])
	hlen := int(word & 0xFFFFFF)
	if kind := word >> 24; kind != 0 {
		return nil, fmt.Errorf("%w: serialization type %d, only JSON (0) is supported", ErrFrame, kind)
	}
	if n < 4 || n > MaxFrame || hlen > n-4 {
		return nil, fmt.Errorf("%w: length %d, header %d", ErrFrame, n, hlen)
	}
	rest := make([]byte, n-4)
	if _, err := io.ReadFull(r, rest); err != nil {
		return nil, err
	}
	c := &Command{}
	if err := json.Unmarshal(rest[:hlen], c); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrFrame, err)
	}
	if body := rest[hlen:]; len(body) > 0 {
		c.Body = body
	}
	return c, nil
}
