package notifier

import (
	"math"
	"sync"
	"time"

	"github.com/flashsale/flashsale/model"
)

// buckets holds one token bucket per user, refilled at rate tokens a second
// up to burst. It lives in the notifier, not in a connection, so a user's
// connections share it and reconnecting does not refill it.
type buckets struct {
	rate  float64
	burst float64

	mu     sync.Mutex
	byUser map[string]*bucket
	swept  time.Time
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was last brought up to date
}

func newBuckets(rate float64, burst int) *buckets {
	return &buckets{rate: rate, burst: float64(burst), byUser: map[string]*bucket{}}
}

// full is how long an untouched bucket takes to fill up from empty; a
// bucket untouched that long is the same as a missing one.
func (b *buckets) full() time.Duration {
	return time.Duration(b.burst / b.rate * float64(time.Second))
}

// take removes up to n whole tokens from user's bucket at now and returns
// how many it got, and, when the bucket holds less than one token
// afterwards, how long until it holds one again (0 otherwise).
func (b *buckets) take(user string, n int, now time.Time) (got int, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweep(now)
	k := b.byUser[user]
	if k == nil {
		k = &bucket{tokens: b.burst, at: now}
		b.byUser[user] = k
	}
	if elapsed := now.Sub(k.at); elapsed > 0 {
		k.tokens = min(b.burst, k.tokens+elapsed.Seconds()*b.rate)
		k.at = now
	}
	got = min(n, int(k.tokens))
	k.tokens -= float64(got)
	if k.tokens < 1 {
		wait = time.Duration((1 - k.tokens) / b.rate * float64(time.Second))
	}
	return got, wait
}

// sweep forgets the buckets that have filled up again, so the map holds only
// users active within the last full() and cannot grow without bound.
func (b *buckets) sweep(now time.Time) {
	full := b.full()
	if now.Sub(b.swept) < full {
		return
	}
	b.swept = now
	for user, k := range b.byUser {
		if now.Sub(k.at) >= full {
			delete(b.byUser, user)
		}
	}
}

// retryAfterSeconds rounds a wait up to the whole seconds of a Retry-After.
func retryAfterSeconds(wait time.Duration) int {
	return max(1, int(math.Ceil(wait.Seconds())))
}

// finalCache keeps recently polled final results, so a shopper polling a
// result that is already final costs no Redis read. Final results change
// only when Redis loses them (they are then decided again or gone, see
// docs/RELIABILITY.md), so an entry lives for ttl only: a poll may answer
// what Redis held up to ttl ago, as a poll made just before the loss did.
type finalCache struct {
	size int
	ttl  time.Duration

	mu    sync.Mutex
	byID  map[string]cachedFinal
	order []string // insertion order, a ring of size entries: the oldest is evicted
	next  int
}

type cachedFinal struct {
	r  model.Result
	at time.Time
}

func newFinalCache(size int, ttl time.Duration) *finalCache {
	return &finalCache{size: size, ttl: ttl, byID: make(map[string]cachedFinal, size), order: make([]string, size)}
}

// get returns the cached final result of requestID unless it is older than
// ttl at now.
func (c *finalCache) get(requestID string, now time.Time) (model.Result, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byID[requestID]
	if !ok || now.Sub(e.at) >= c.ttl {
		return model.Result{}, false
	}
	return e.r, true
}

// put caches the final result r read at now, evicting the oldest entry when
// the cache is full.
func (c *finalCache) put(r model.Result, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byID[r.RequestID]; ok {
		c.byID[r.RequestID] = cachedFinal{r: r, at: now}
		return
	}
	if old := c.order[c.next]; old != "" {
		delete(c.byID, old)
	}
	c.order[c.next] = r.RequestID
	c.next = (c.next + 1) % c.size
	c.byID[r.RequestID] = cachedFinal{r: r, at: now}
}

// count returns the number of cached results (for tests).
func (c *finalCache) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID)
}
