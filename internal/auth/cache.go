package auth

import (
	"sync"
	"time"
)

// verified remembers tokens whose signature already checked out, so a shopper
// who sends the same token again (every purchase, poll and retry of a sale)
// costs a map lookup instead of base64, JSON and HMAC work: on the sold-out
// path that work is most of the request. Only the exact token string hits,
// so a hit proves what a fresh verification would; the time claims are still
// checked on every use.
type verified struct {
	mu      sync.RWMutex
	entries map[string]verifiedToken
	max     int
}

type verifiedToken struct {
	subject   string
	notBefore time.Time // zero when the token has no nbf
	expiresAt time.Time
}

// defaultVerifiedEntries bounds the cache: about 40 MB of tokens at most.
const defaultVerifiedEntries = 200_000

func newVerified(max int) *verified {
	return &verified{entries: map[string]verifiedToken{}, max: max}
}

// lookup returns the subject of a cached token valid at now (with leeway).
// found is false when the token is unknown; a known token outside its time
// window is dropped and reported as unknown, so the caller's full check
// produces the usual error.
func (v *verified) lookup(token string, now time.Time, leeway time.Duration) (subject string, found bool) {
	v.mu.RLock()
	e, ok := v.entries[token]
	v.mu.RUnlock()
	if !ok {
		return "", false
	}
	if !now.Before(e.expiresAt.Add(leeway)) || (!e.notBefore.IsZero() && now.Add(leeway).Before(e.notBefore)) {
		v.mu.Lock()
		delete(v.entries, token)
		v.mu.Unlock()
		return "", false
	}
	return e.subject, true
}

// store remembers a verified token. When full it forgets arbitrary entries
// (map order) down to three quarters: those shoppers just verify once more.
func (v *verified) store(token string, e verifiedToken) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.entries) >= v.max {
		for k := range v.entries {
			if len(v.entries) <= v.max*3/4 {
				break
			}
			delete(v.entries, k)
		}
	}
	v.entries[token] = e
}
