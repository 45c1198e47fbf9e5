package redisstream

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A partition lease makes one consumer, across all processes, the only reader
// of a partition: that is what keeps each key's messages in order and its
// batches serial. It is a plain key set with NX and a TTL; the holder renews
// it with a compare-and-set script and releases it with compare-and-delete,
// so a consumer that lost its lease can neither extend nor free the next
// holder's.

var (
	//go:embed lease_renew.lua
	leaseRenewSrc string
	//go:embed lease_release.lua
	leaseReleaseSrc string
)

// leaseScripts are the lease's Lua scripts, parsed once per Queue.
type leaseScripts struct {
	renew   *redis.Script
	release *redis.Script
}

func newLeaseScripts() leaseScripts {
	return leaseScripts{
		renew:   redis.NewScript(leaseRenewSrc),
		release: redis.NewScript(leaseReleaseSrc),
	}
}

// lease is a held partition lease. Its deadline is when the key expires at
// the latest, counted from before the command that set it was sent, so the
// holder stops believing in its lease no later than Redis forgets it.
type lease struct {
	key   string
	owner string
	ttl   time.Duration

	mu       sync.Mutex
	deadline time.Time
	lost     bool
}

// valid reports whether the lease is still held: not known lost and not past
// its deadline. Batches are handed to the handler only while it is valid.
func (l *lease) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lost && time.Now().Before(l.deadline)
}

func (l *lease) extend(deadline time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.lost && deadline.After(l.deadline) {
		l.deadline = deadline
	}
}

func (l *lease) markLost() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost = true
}

// acquireLease takes the lease at key for owner. It returns nil and no error
// when someone else holds it.
func acquireLease(ctx context.Context, rdb redis.UniversalClient, key, owner string, ttl time.Duration) (*lease, error) {
	start := time.Now()
	ok, err := rdb.SetNX(ctx, key, owner, ttl).Result()
	if err != nil {
		return nil, fmt.Errorf("acquire lease %s: %w", key, err)
	}
	if !ok {
		return nil, nil
	}
	return &lease{key: key, owner: owner, ttl: ttl, deadline: start.Add(ttl)}, nil
}

// renewLease extends l by its TTL. It reports false if l is no longer held.
func renewLease(ctx context.Context, rdb redis.UniversalClient, s leaseScripts, l *lease) (bool, error) {
	start := time.Now()
	held, err := leaseReply(s.renew.Run(ctx, rdb, []string{l.key}, l.owner, l.ttl.Milliseconds()).Result())
	if err != nil {
		return false, fmt.Errorf("renew lease %s: %w", l.key, err)
	}
	if held {
		l.extend(start.Add(l.ttl))
	}
	return held, nil
}

// releaseLease frees l if it is still held. It reports whether it was.
func releaseLease(ctx context.Context, rdb redis.UniversalClient, s leaseScripts, l *lease) (bool, error) {
	l.markLost()
	held, err := leaseReply(s.release.Run(ctx, rdb, []string{l.key}, l.owner).Result())
	if err != nil {
		return false, fmt.Errorf("release lease %s: %w", l.key, err)
	}
	return held, nil
}

// leaseReply parses the reply of both lease scripts: 1 means the caller held
// the lease, 0 that it did not.
func leaseReply(v any, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	switch v {
	case int64(1):
		return true, nil
	case int64(0):
		return false, nil
	}
	return false, fmt.Errorf("unexpected lease script reply %v (%T)", v, v)
}
