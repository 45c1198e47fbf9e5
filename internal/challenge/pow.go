// Package challenge is the proof-of-work gate in front of purchases: a
// stateless, HMAC-signed puzzle bound to a user, a campaign and a short
// expiry, which a browser solves by hashing and the gateway checks with one
// SHA-256 and one HMAC.
package challenge

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale/model"
)

// DefaultTTL is how long an issued challenge may be solved and spent.
const DefaultTTL = 60 * time.Second

// keyLabel separates the challenge key from every other use of the secret
// it is derived from.
const keyLabel = "flashsale/challenge/v1"

// MaxNonce bounds a solution's nonce: [A-Za-z0-9_-]{1,32}.
const MaxNonce = 32

// PoW issues and verifies proof-of-work challenges. A challenge is
// "<bits>.<expiry unix s>.<salt>.<mac>"; the MAC covers those and the user
// and campaign, which it does not carry. A solution is the challenge, ".",
// and a nonce such that SHA-256 of it has bits leading zero bits.
type PoW struct {
	key []byte
	ttl time.Duration
	now func() time.Time
}

// NewPoW returns a PoW keyed by HMAC-SHA256(secret, keyLabel), so the
// secret itself never signs a challenge. ttl <= 0 is DefaultTTL; now nil is
// time.Now.
func NewPoW(secret []byte, ttl time.Duration, now func() time.Time) *PoW {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if now == nil {
		now = time.Now
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(keyLabel))
	return &PoW{key: m.Sum(nil), ttl: ttl, now: now}
}

// Challenge issues a puzzle of c.ChallengeBits for userID.
func (p *PoW) Challenge(userID string, c model.Campaign) (model.Challenge, error) {
	var salt [12]byte
	if _, err := rand.Read(salt[:]); err != nil {
		return model.Challenge{}, fmt.Errorf("challenge salt: %w", err)
	}
	exp := p.now().Add(p.ttl).Truncate(time.Second)
	body := strconv.Itoa(c.ChallengeBits) + "." + strconv.FormatInt(exp.Unix(), 10) + "." +
		base64.RawURLEncoding.EncodeToString(salt[:])
	return model.Challenge{Token: body + "." + p.mac(body, userID, c.ID), Bits: c.ChallengeBits, ExpiresAt: exp.UTC()}, nil
}

// Verify checks solution for userID and c: signature, user, campaign,
// expiry, the work done, and at least c's current difficulty. Any failure
// is model.ErrChallengeFailed. The pass names the challenge, so a caller
// can let it buy once.
func (p *PoW) Verify(solution, userID string, c model.Campaign) (model.ChallengePass, error) {
	fail := func(why string) (model.ChallengePass, error) {
		return model.ChallengePass{}, fmt.Errorf("%w: %s", model.ErrChallengeFailed, why)
	}
	cut := strings.LastIndexByte(solution, '.')
	if cut < 0 || !validNonce(solution[cut+1:]) {
		return fail("malformed solution")
	}
	token := solution[:cut]
	parts := strings.Split(token, ".")
	if len(parts) != 4 {
		return fail("malformed challenge")
	}
	n, err := strconv.Atoi(parts[0])
	if err != nil || n < 0 || n > model.MaxChallengeBits {
		return fail("malformed difficulty")
	}
	expUnix, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return fail("malformed expiry")
	}
	body := token[:len(token)-len(parts[3])-1]
	if subtle.ConstantTimeCompare([]byte(parts[3]), []byte(p.mac(body, userID, c.ID))) != 1 {
		return fail("bad signature")
	}
	exp := time.Unix(expUnix, 0)
	if !p.now().Before(exp) {
		return fail("expired")
	}
	if n < c.ChallengeBits {
		return fail("easier than the campaign asks")
	}
	if sum := sha256.Sum256([]byte(solution)); LeadingZeroBits(sum[:]) < n {
		return fail("not enough work")
	}
	// The MAC is unique per challenge (salted): it names it.
	return model.ChallengePass{ID: parts[3], ExpiresAt: exp.UTC()}, nil
}

// mac signs body with the user and campaign; the lengths keep any two
// (user, campaign) pairs apart.
func (p *PoW) mac(body, userID, campaignID string) string {
	m := hmac.New(sha256.New, p.key)
	fmt.Fprintf(m, "%s\x00%d:%s\x00%d:%s", body, len(userID), userID, len(campaignID), campaignID)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Solve does a shopper's work for token, a challenge of bits: it returns
// the solution a purchase carries, the token, ".", and the first base-36
// counter whose SHA-256 has bits leading zero bits (web/pow.js searches the
// same way, in Web Workers). It is what `flashsale loadtest` sends; the
// search takes 2^bits hashes on average, so it gives up when ctx ends.
func Solve(ctx context.Context, token string, bits int) (string, error) {
	if bits < 0 || bits > model.MaxChallengeBits {
		return "", fmt.Errorf("solve: %d bits: want 0 to %d", bits, model.MaxChallengeBits)
	}
	buf := make([]byte, 0, len(token)+1+MaxNonce)
	buf = append(append(buf, token...), '.')
	for n := uint64(0); ; n++ {
		// A nonce is at most 13 base-36 digits here, within MaxNonce.
		s := strconv.AppendUint(buf, n, 36)
		if sum := sha256.Sum256(s); LeadingZeroBits(sum[:]) >= bits {
			return string(s), nil
		}
		if n%4096 == 4095 {
			if err := ctx.Err(); err != nil {
				return "", fmt.Errorf("solve %d bits: %w", bits, err)
			}
		}
	}
}

// LeadingZeroBits counts b's leading zero bits.
func LeadingZeroBits(b []byte) int {
	n := 0
	for _, x := range b {
		if x != 0 {
			return n + bits.LeadingZeros8(x)
		}
		n += 8
	}
	return n
}

func validNonce(s string) bool {
	if len(s) < 1 || len(s) > MaxNonce {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
