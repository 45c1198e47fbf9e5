// Package requestid mints the request ids the gateway answers a purchase
// with and recognises them afterwards. An id is "<tag>.<32 hex digits>"
// (model.FormatRequestID), the hex digits a UUIDv7 whose last 6 bytes are a
// MAC over the tag, the UUID's first 10 bytes and the user the id was
// issued to. The notifier's lost rule, which stores and counts an answer
// for an id nothing else knows, answers only ids it recognises as issued to
// the asking user (docs/RELIABILITY.md, "Redis lost its data").
//
// It lives apart from model, which stays standard library only, because
// it draws the UUIDv7 from github.com/google/uuid, and because it holds a
// deployment's secret, like internal/challenge.
package requestid

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"sync"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/model"
)

// keyLabel separates the request id key from every other use of the
// secret it is derived from.
const keyLabel = "flashsale/request-id/v1"

const (
	// headLen is the UUIDv7's bytes the gateway makes as any UUIDv7: the
	// millisecond (48 bits), the version, a 12-bit sub-millisecond
	// sequence that keeps one gateway's ids increasing (model.OrderIDOf
	// relies on these 60 bits), the variant and 14 random bits.
	headLen = 10
	// macLen is the rest: the MAC truncated to 48 bits. Forging one id
	// for a user takes 2^47 tries on average, each a poll within the
	// user's poll budget.
	macLen = 16 - headLen
)

// Issuer mints request ids bound to a user and recognises them. Every
// gateway and notifier of a deployment must hold the same key. It is safe
// for concurrent use.
type Issuer struct {
	// macs pools keyed HMACs: hmac.New costs allocations and two key
	// schedules, a Reset of a used one neither.
	macs sync.Pool
}

// signer is one pooled HMAC with its message buffer.
type signer struct {
	mac hash.Hash
	msg []byte
	sum [sha256.Size]byte
}

// NewIssuer returns an Issuer keyed by HMAC-SHA256(secret, keyLabel), so
// the secret itself never signs an id.
func NewIssuer(secret []byte) *Issuer {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(keyLabel))
	key := m.Sum(nil)
	is := &Issuer{}
	is.macs.New = func() any {
		return &signer{mac: hmac.New(sha256.New, key), msg: make([]byte, 0, 128)}
	}
	return is
}

// New mints the id of a request of userID under tag (its bucket's tag, or
// its campaign's id): Sign of a fresh UUIDv7, so one gateway's ids
// increase.
func (is *Issuer) New(tag, userID string) string {
	return is.Sign(tag, userID, uuid.Must(uuid.NewV7()))
}

// Sign returns the id of a request of userID under tag whose UUID is id,
// its last 6 bytes replaced by the MAC. The version and variant bits are
// in the first 10, so the MAC of a UUIDv7 leaves a UUIDv7.
func (is *Issuer) Sign(tag, userID string, id [16]byte) string {
	is.mac(id[headLen:], tag, id[:headLen], userID)
	return model.FormatRequestID(tag, hex.EncodeToString(id[:]))
}

// Issued reports whether requestID is an id New minted for userID with
// this key: well formed, and its MAC that of its tag, its head and userID
// (compared in constant time).
func (is *Issuer) Issued(requestID, userID string) bool {
	tag, ok := model.TagOfRequest(requestID)
	if !ok {
		return false
	}
	var id [16]byte
	if _, err := hex.Decode(id[:], []byte(requestID[len(tag)+1:])); err != nil {
		return false
	}
	var want [macLen]byte
	is.mac(want[:], tag, id[:headLen], userID)
	return hmac.Equal(want[:], id[headLen:])
}

// mac writes into out the first len(out) bytes of the HMAC of tag, '.',
// head and userID: a tag holds no '.' and the head has a fixed length, so
// no two triples give the same message.
func (is *Issuer) mac(out []byte, tag string, head []byte, userID string) {
	s := is.macs.Get().(*signer)
	s.msg = append(s.msg[:0], tag...)
	s.msg = append(s.msg, '.')
	s.msg = append(s.msg, head...)
	s.msg = append(s.msg, userID...)
	s.mac.Reset()
	s.mac.Write(s.msg)
	copy(out, s.mac.Sum(s.sum[:0]))
	is.macs.Put(s)
}
