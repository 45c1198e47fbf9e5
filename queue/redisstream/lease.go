package redisstream

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A partition lease makes one consumer, across all processes, the only reader
// of a partition: that is what keeps each key's messages in order and its
// batches serial. It is a key with a TTL that the holder keeps renewing,
// holding the holder's id and a fencing token that is new for every tenure
// (lease_acquire.lua). The holder renews it with compare-and-set and
// releases it with compare-and-delete, and every command that reads, claims
// or acknowledges the partition's entries runs in a transaction that
// executes only while the lease holds this tenure's value (fence.go); so a
// consumer that lost its lease can neither extend nor free the next holder's,
// nor touch the partition's entries.

var (
	//go:embed lease_acquire.lua
	leaseAcquireSrc string
	//go:embed lease_renew.lua
	leaseRenewSrc string
	//go:embed lease_release.lua
	leaseReleaseSrc string
)

// scripts are the lease's Lua scripts, parsed once per Queue.
type leaseScripts struct {
	acquire *redis.Script
	renew   *redis.Script
	release *redis.Script
}

func newLeaseScripts() leaseScripts {
	return leaseScripts{
		acquire: redis.NewScript(leaseAcquireSrc),
		renew:   redis.NewScript(leaseRenewSrc),
		release: redis.NewScript(leaseReleaseSrc),
	}
}

// errLeaseLost is returned by the fenced commands when the lease no longer
// holds the caller's value: another consumer may own the partition now.
var errLeaseLost = errors.New("partition lease lost")

// lease is a held partition lease. Its deadline is when the key expires at
// the latest, counted from before the command that set it was sent, so the
// holder stops believing in its lease no later than Redis forgets it.
type lease struct {
	key      string
	value    string // "<owner>#<token>", this tenure's
	ttl      time.Duration
	acquired time.Time

	mu       sync.Mutex
	deadline time.Time
	lost     bool
}

// valid reports whether the lease is still held as far as this process
// knows: not known lost and not past its deadline. It saves Redis calls; the
// fence is what guarantees that a lost lease changes nothing.
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

// acquireLease takes partition p's lease for owner. It returns nil and no
// error when someone else holds it.
func acquireLease(ctx context.Context, rdb redis.UniversalClient, s leaseScripts, topic string, p int, owner string, ttl time.Duration) (*lease, error) {
	key := leaseKey(topic, p)
	start := time.Now()
	v, err := s.acquire.Run(ctx, rdb, []string{key, fenceKey(topic, p)}, owner, ttl.Milliseconds()).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("acquire lease %s: %w", key, err)
	}
	value, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("acquire lease %s: unexpected reply %v (%T)", key, v, v)
	}
	return &lease{key: key, value: value, ttl: ttl, acquired: start, deadline: start.Add(ttl)}, nil
}

// renewLease extends l by its TTL. It reports false if l is no longer held.
func renewLease(ctx context.Context, rdb redis.UniversalClient, s leaseScripts, l *lease) (bool, error) {
	start := time.Now()
	held, err := leaseReply(s.renew.Run(ctx, rdb, []string{l.key}, l.value, l.ttl.Milliseconds()).Result())
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
	held, err := leaseReply(s.release.Run(ctx, rdb, []string{l.key}, l.value).Result())
	if err != nil {
		return false, fmt.Errorf("release lease %s: %w", l.key, err)
	}
	return held, nil
}

// leaseReply parses the reply of the renew and release scripts: 1 means the
// caller held the lease, 0 that it did not.
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
