package notifier

import "github.com/gorilla/websocket"

// WebSocket frame header bits (RFC 6455, 5.2).
const (
	finBit     = 0x80
	rsvBits    = 0x70
	opcodeBits = 0x0f
	maskBit    = 0x80
	lenBits    = 0x7f
	// maskedControlHeader is a client control frame's header: two bytes and
	// the masking key.
	maskedControlHeader = 2 + 4
	maxControlPayload   = 125
)

// controlFrame reports whether hdr (a frame's first two bytes) starts a
// well-formed client ping or pong, with its opcode and whole size. Anything
// else, malformed control frames included, is left to gorilla, which closes
// the connection with the right code.
func controlFrame(hdr []byte) (op, size int, ok bool) {
	op = int(hdr[0] & opcodeBits)
	if op != websocket.PingMessage && op != websocket.PongMessage {
		return 0, 0, false
	}
	if hdr[0]&finBit == 0 || hdr[0]&rsvBits != 0 || hdr[1]&maskBit == 0 {
		return 0, 0, false
	}
	n := int(hdr[1] & lenBits)
	if n > maxControlPayload {
		return 0, 0, false
	}
	return op, maskedControlHeader + n, true
}

// unmaskedPayload returns a copy of the payload of a whole masked control
// frame.
func unmaskedPayload(frame []byte) []byte {
	key, masked := frame[2:maskedControlHeader], frame[maskedControlHeader:]
	payload := make([]byte, len(masked))
	for i, b := range masked {
		payload[i] = b ^ key[i%4]
	}
	return payload
}
