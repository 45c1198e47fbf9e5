package remoting

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
)

// Message properties used by flashsale, the library and the double.
const (
	PropKeys              = "KEYS"
	PropShardingKey       = "SHARDING_KEY"
	PropDelayLevel        = "DELAY"
	PropRetryTopic        = "RETRY_TOPIC"
	PropOriginMessageID   = "ORIGIN_MESSAGE_ID"
	PropUniqueClientMsgID = "UNIQ_KEY"
	PropReconsumeTime     = "RECONSUME_TIME"
	PropRealTopic         = "REAL_TOPIC"
	PropRealQueueID       = "REAL_QID"
	PropMinOffset         = "MIN_OFFSET"
	PropMaxOffset         = "MAX_OFFSET"
)

// Property separators: key\x01value\x02 pairs.
const (
	nameValueSep = '\x01'
	propertySep  = '\x02'
)

// EncodeProperties returns props in the wire format, keys sorted so the
// output is stable. Like a broker (and unlike the Go library) it writes no
// separator after the last pair.
func EncodeProperties(props map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(props)) {
		if i > 0 {
			b.WriteByte(propertySep)
		}
		b.WriteString(k)
		b.WriteByte(nameValueSep)
		b.WriteString(props[k])
	}
	return b.String()
}

// DecodeProperties parses the wire format, with or without a separator
// after the last pair; malformed pairs are skipped, as the library does.
func DecodeProperties(s string) map[string]string {
	props := make(map[string]string)
	for item := range strings.SplitSeq(s, string(propertySep)) {
		k, v, ok := strings.Cut(item, string(nameValueSep))
		if ok && k != "" {
			props[k] = v
		}
	}
	return props
}

// Record is one message as a broker stores it and returns it in a pull
// response.
type Record struct {
	Topic           string
	QueueID         int32
	QueueOffset     int64
	CommitLogOffset int64
	Flag            int32
	SysFlag         int32 // bit 0: Body is zlib-compressed, as sent by the producer
	BornTimestamp   int64 // Unix ms
	BornHost        *net.TCPAddr
	StoreTimestamp  int64 // Unix ms
	StoreHost       *net.TCPAddr
	ReconsumeTimes  int32
	Body            []byte
	Properties      map[string]string
}

// Host flags of a record's sysFlag: IPv6 born and store hosts. The double
// always stores IPv4 addresses.
const (
	sysFlagBornHostV6  = 1 << 4
	sysFlagStoreHostV6 = 1 << 5
)

// recordMagic is the magic code of a stored message (MESSAGE_MAGIC_CODE).
const recordMagic uint32 = 0xDAA320A7 // -626843481 as an int32

// OffsetMsgID is the broker-assigned message id: store host IPv4, port and
// commit log offset, in upper-case hex.
func OffsetMsgID(store *net.TCPAddr, commitLogOffset int64) string {
	var b [16]byte
	copy(b[0:4], ip4(store))
	binary.BigEndian.PutUint32(b[4:], uint32(store.Port))
	binary.BigEndian.PutUint64(b[8:], uint64(commitLogOffset))
	return strings.ToUpper(fmt.Sprintf("%x", b[:]))
}

func ip4(a *net.TCPAddr) []byte {
	if a != nil {
		if v4 := a.IP.To4(); v4 != nil {
			return v4
		}
	}
	return []byte{127, 0, 0, 1}
}

func port(a *net.TCPAddr) int32 {
	if a == nil {
		return 0
	}
	return int32(a.Port)
}

// EncodeRecords appends the records in the pull-response layout: size,
// magic, body CRC, queue id, flag, queue offset, commit log offset, sysFlag,
// born timestamp, born host (4+4), store timestamp, store host (4+4),
// reconsume times, prepared transaction offset, body (i32 length), topic
// (one-byte length), properties (i16 length).
func EncodeRecords(dst []byte, recs ...Record) ([]byte, error) {
	for _, r := range recs {
		props := EncodeProperties(r.Properties)
		if len(r.Topic) > 255 || len(props) > 32767 {
			return nil, fmt.Errorf("remoting: record of %s: topic or properties too long", r.Topic)
		}
		sysFlag := r.SysFlag &^ (sysFlagBornHostV6 | sysFlagStoreHostV6)
		size := 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + len(r.Body) + 1 + len(r.Topic) + 2 + len(props)
		b := make([]byte, 0, size)
		b = binary.BigEndian.AppendUint32(b, uint32(size))
		b = binary.BigEndian.AppendUint32(b, recordMagic)
		b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(r.Body)&0x7FFFFFFF)
		b = binary.BigEndian.AppendUint32(b, uint32(r.QueueID))
		b = binary.BigEndian.AppendUint32(b, uint32(r.Flag))
		b = binary.BigEndian.AppendUint64(b, uint64(r.QueueOffset))
		b = binary.BigEndian.AppendUint64(b, uint64(r.CommitLogOffset))
		b = binary.BigEndian.AppendUint32(b, uint32(sysFlag))
		b = binary.BigEndian.AppendUint64(b, uint64(r.BornTimestamp))
		b = append(b, ip4(r.BornHost)...)
		b = binary.BigEndian.AppendUint32(b, uint32(port(r.BornHost)))
		b = binary.BigEndian.AppendUint64(b, uint64(r.StoreTimestamp))
		b = append(b, ip4(r.StoreHost)...)
		b = binary.BigEndian.AppendUint32(b, uint32(port(r.StoreHost)))
		b = binary.BigEndian.AppendUint32(b, uint32(r.ReconsumeTimes))
		b = binary.BigEndian.AppendUint64(b, 0) // prepared transaction offset
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.Body)))
		b = append(b, r.Body...)
		b = append(b, byte(len(r.Topic)))
		b = append(b, r.Topic...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(props)))
		b = append(b, props...)
		dst = append(dst, b...)
	}
	return dst, nil
}

// DecodeRecords parses a pull-response body.
func DecodeRecords(b []byte) ([]Record, error) {
	var out []Record
	for len(b) > 0 {
		d := decoder{b: b}
		size := int(d.u32())
		if size < 4 || size > len(b) {
			return nil, fmt.Errorf("remoting: record size %d with %d bytes left", size, len(b))
		}
		d.b = b[4:size]
		var r Record
		if magic := d.u32(); magic != recordMagic && d.err == nil {
			return nil, fmt.Errorf("remoting: record magic code %#x, want %#x", magic, recordMagic)
		}
		d.u32() // body CRC
		r.QueueID = int32(d.u32())
		r.Flag = int32(d.u32())
		r.QueueOffset = int64(d.u64())
		r.CommitLogOffset = int64(d.u64())
		r.SysFlag = int32(d.u32())
		r.BornTimestamp = int64(d.u64())
		r.BornHost = d.host()
		r.StoreTimestamp = int64(d.u64())
		r.StoreHost = d.host()
		r.ReconsumeTimes = int32(d.u32())
		d.u64() // prepared transaction offset
		r.Body = d.bytes(int(d.u32()))
		r.Topic = string(d.bytes(int(d.u8())))
		r.Properties = DecodeProperties(string(d.bytes(int(d.u16()))))
		if d.err != nil {
			return nil, d.err
		}
		out = append(out, r)
		b = b[size:]
	}
	return out, nil
}

// BatchMessage is one message inside a SEND_BATCH_MESSAGE body.
type BatchMessage struct {
	Flag       int32
	Body       []byte
	Properties map[string]string
}

// EncodeBatch returns a batch body in the library's layout (Message.Marshal):
// size, magic (0), body CRC (0), flag, body (i32 length), properties (i16
// length).
func EncodeBatch(msgs ...BatchMessage) []byte {
	var out []byte
	for _, m := range msgs {
		props := EncodeProperties(m.Properties)
		size := 4 + 4 + 4 + 4 + 4 + len(m.Body) + 2 + len(props)
		out = binary.BigEndian.AppendUint32(out, uint32(size))
		out = binary.BigEndian.AppendUint32(out, 0)
		out = binary.BigEndian.AppendUint32(out, 0)
		out = binary.BigEndian.AppendUint32(out, uint32(m.Flag))
		out = binary.BigEndian.AppendUint32(out, uint32(len(m.Body)))
		out = append(out, m.Body...)
		out = binary.BigEndian.AppendUint16(out, uint16(len(props)))
		out = append(out, props...)
	}
	return out
}

// DecodeBatch parses a SEND_BATCH_MESSAGE body.
func DecodeBatch(b []byte) ([]BatchMessage, error) {
	var out []BatchMessage
	for len(b) > 0 {
		d := decoder{b: b}
		size := int(d.u32())
		if size < 22 || size > len(b) {
			return nil, fmt.Errorf("remoting: batch entry size %d with %d bytes left", size, len(b))
		}
		d.b = b[4:size]
		var m BatchMessage
		d.u32() // magic
		d.u32() // body CRC
		m.Flag = int32(d.u32())
		m.Body = d.bytes(int(d.u32()))
		m.Properties = DecodeProperties(string(d.bytes(int(d.u16()))))
		if d.err != nil {
			return nil, d.err
		}
		out = append(out, m)
		b = b[size:]
	}
	return out, nil
}

// decoder reads big-endian fields, remembering the first short read.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = fmt.Errorf("remoting: field of %d bytes with %d left", n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if b := d.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.bytes(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.bytes(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.bytes(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) host() *net.TCPAddr {
	ip := d.bytes(4)
	p := d.u32()
	if d.err != nil {
		return nil
	}
	return &net.TCPAddr{IP: net.IPv4(ip[0], ip[1], ip[2], ip[3]), Port: int(p)}
}

// Itoa formats an integer extension field.
func Itoa[T ~int | ~int16 | ~int32 | ~int64](v T) string { return strconv.FormatInt(int64(v), 10) }
