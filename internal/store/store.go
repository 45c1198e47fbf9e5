// Package store owns flashsale's Redis keyspace and its Lua scripts. Every key
// of a campaign carries the campaign's hash tag ({id}), so each script touches
// one slot and runs unchanged on Redis Cluster. No other package builds keys.
package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// EventsChannel carries campaign events to every gateway. It stays on plain
// pub/sub, which reaches every node of a cluster: events are few and every
// gateway needs all of them. Receivers also re-read stored state, so a missed
// message only delays, never loses, an update. Results travel on sharded,
// per-campaign channels instead (resultsChannel).
const EventsChannel = "fs:events"

// Store runs flashsale's Redis operations on a client, ring or cluster.
type Store struct {
	rdb         redis.UniversalClient
	deduct      *redis.Script
	withdraw    *redis.Script
	rebuild     *redis.Script
	paused      *redis.Script
	reject      *redis.Script
	admit       *redis.Script
	release     *redis.Script
	notEnqueued *redis.Script
	endEarly    *redis.Script
	remove      *redis.Script
	take        *redis.Script
	give        *redis.Script
	settle      *redis.Script
	soldOut     *redis.Script
	restore     *redis.Script
	durable     *redis.Script
	lost        *redis.Script

	// transferObserver, when set, is told every transfer between buckets
	// (WithTransferObserver).
	transferObserver func(outcome string, units int64)

	// retention is how long a campaign's keys outlive its sale (expireAt).
	retention time.Duration
	// replicaAck is how many replicas must have a deduction's writes
	// (replicas.go).
	replicaAck ReplicaAck
	// plainResults sends results by PUBLISH/SUBSCRIBE instead of their
	// sharded forms (WithPlainResults).
	plainResults bool

	// testHook, when set by a test, runs at the named points of a
	// bucketed campaign's sold-out decision (buckets.go), where a test
	// puts what races it.
	testHook func(point string)
}

// DefaultKeyRetention is how long a campaign's keys outlive its sale (its
// end and the payment window after it) unless WithKeyRetention says
// otherwise: a week to read results, reconcile and investigate.
const DefaultKeyRetention = 7 * 24 * time.Hour

// An Option configures a Store.
type Option func(*Store)

// WithKeyRetention sets how long a campaign's keys outlive its sale (see
// Rebuild); d must be positive.
func WithKeyRetention(d time.Duration) Option {
	return func(s *Store) { s.retention = d }
}

// WithPlainResults sends results with PUBLISH and SUBSCRIBE on the same
// per-campaign channels, for a server without sharded pub/sub (the embedded
// miniredis). Redis 7, single or cluster, takes the sharded path.
func WithPlainResults() Option {
	return func(s *Store) { s.plainResults = true }
}

// New returns a Store on rdb.
func New(rdb redis.UniversalClient, opts ...Option) *Store {
	s := &Store{
		rdb:         rdb,
		deduct:      script("deduct"),
		withdraw:    script("withdraw"),
		rebuild:     script("rebuild"),
		paused:      script("paused"),
		reject:      script("reject"),
		admit:       script("admit"),
		release:     script("release"),
		notEnqueued: script("notenqueued"),
		endEarly:    script("endearly"),
		remove:      script("remove"),
		take:        script("take"),
		give:        script("give"),
		settle:      script("settle"),
		soldOut:     script("soldout"),
		restore:     script("restore"),
		durable:     script("durable"),
		lost:        script("lost"),
	}
	s.retention = DefaultKeyRetention
	for _, o := range opts {
		o(s)
	}
	return s
}

// keys of one campaign, or of one bucket of a campaign of several; all
// share the hash tag {tag} (model.BucketTag).
type keys struct {
	meta, stock, soldout, counters, users, results, idem string
	released, admissions                                 string
	xfer, xpend, got                                     string
	campaignLimit, userLimits, ipLimits                  string
	restore                                              string
}

func campaignKeys(tag string) keys {
	p := "fs:{" + tag + "}:"
	return keys{
		meta:     p + "meta",
		stock:    p + "stock",
		soldout:  p + "soldout",
		counters: p + "counters",
		users:    p + "users",
		results:  p + "results",
		idem:     p + "idem",
		// Order ids whose units went back on sale (see release.lua).
		released: p + "released",
		// The admissions set, a member per admit.lua call (see notenqueued.go).
		admissions: p + "admissions",
		// Stock transfers between buckets (see transfer.go).
		xfer:  p + "xfer",
		xpend: p + "xpend",
		got:   p + "got",
		// Rate-limit state (see admit.lua).
		campaignLimit: p + "rl:all",
		userLimits:    p + "rl:users",
		ipLimits:      p + "rl:ips",
		// The restore lock, with its own TTL (see restore.go).
		restore: p + "restore",
	}
}

// unavailable marks an error that says Redis cannot answer now as
// model.ErrUnavailable (503, worth a retry): no reply at all (refused,
// reset, timed out, the caller's deadline) or a server that is loading,
// failing over or read-only. Any other reply error (a wrong type, a script
// bug) stays an internal error.
func unavailable(err error) error {
	var reply redis.Error
	if errors.As(err, &reply) && !transientReply(reply.Error()) {
		return err
	}
	return fmt.Errorf("%w: %w", model.ErrUnavailable, err)
}

// maybeNotEnqueued reports whether an admission that failed with err may
// have been stored all the same (model.ErrMaybeNotEnqueued), its call run
// on the server: not when Redis answered with an error (a script runs whole
// or not at all, unless it fails halfway, which is a bug), nor when no
// connection was made; any other failure came after the call was sent.
func maybeNotEnqueued(err error) bool {
	var reply redis.Error
	if errors.As(err, &reply) {
		return false
	}
	var op *net.OpError
	return !errors.As(err, &op) || op.Op != "dial"
}

// transientReply reports whether a Redis error reply says the server
// cannot serve the command for now.
func transientReply(msg string) bool {
	// The first word is the error's code: BUSYGROUP is not BUSY.
	code, _, _ := strings.Cut(msg, " ")
	for _, transient := range []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY"} {
		if code == transient {
			return true
		}
	}
	return false
}

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	return nil
}

// SoldOut reports whether the campaign's sold-out flag is set.
func (s *Store) SoldOut(ctx context.Context, campaignID string) (bool, error) {
	n, err := s.rdb.Exists(ctx, campaignKeys(campaignID).soldout).Result()
	if err != nil {
		return false, fmt.Errorf("sold-out flag %s: %w", campaignID, err)
	}
	return n == 1, nil
}

// Stats reads a campaign's counters in one round trip; a campaign of
// several buckets is their sum, in a second.
func (s *Store) Stats(ctx context.Context, campaignID string) (model.Stats, error) {
	k := campaignKeys(campaignID)
	pipe := s.rdb.Pipeline()
	meta := pipe.HMGet(ctx, k.meta, "stock", "buckets")
	rem := pipe.Get(ctx, k.stock)
	flag := pipe.Exists(ctx, k.soldout)
	counters := pipe.HGetAll(ctx, k.counters)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return model.Stats{}, fmt.Errorf("stats %s: %w", campaignID, unavailable(err))
	}
	st := model.Stats{FinishedByStatus: map[model.Status]int64{}}
	for _, s := range model.FinalStatuses {
		st.FinishedByStatus[s] = 0
	}
	if meta.Val()[0] == nil {
		return st, nil
	}
	stock, err := parseInt(meta.Val()[0])
	if err != nil {
		return model.Stats{}, fmt.Errorf("stats %s: stock: %w", campaignID, err)
	}
	st.Loaded, st.Stock = true, stock
	st.SoldOut = flag.Val() == 1
	var n int64 = 1
	if v := meta.Val()[1]; v != nil {
		if n, err = parseInt(v); err != nil {
			return model.Stats{}, fmt.Errorf("stats %s: buckets: %w", campaignID, err)
		}
	}
	if n <= 1 {
		if st.Remaining, err = rem.Int64(); err != nil {
			return model.Stats{}, fmt.Errorf("stats %s: remaining: %w", campaignID, err)
		}
		return st, addCounters(&st, campaignID, counters.Val())
	}
	// The buckets hold the units and the counters; the campaign's own tag
	// only its definition and the sold-out flag.
	pipe = s.rdb.Pipeline()
	tags := bucketTags(campaignID, int(n), false)
	rems := make([]*redis.StringCmd, len(tags))
	cs := make([]*redis.MapStringStringCmd, len(tags))
	for i, tag := range tags {
		bk := campaignKeys(tag)
		rems[i], cs[i] = pipe.Get(ctx, bk.stock), pipe.HGetAll(ctx, bk.counters)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return model.Stats{}, fmt.Errorf("stats %s: %w", campaignID, unavailable(err))
	}
	for i, tag := range tags {
		r, err := rems[i].Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return model.Stats{}, fmt.Errorf("stats %s: remaining: %w", tag, err)
		}
		st.Remaining += r
		if err := addCounters(&st, tag, cs[i].Val()); err != nil {
			return model.Stats{}, err
		}
	}
	return st, nil
}

// addCounters adds one tag's counters hash to st.
func addCounters(st *model.Stats, tag string, counters map[string]string) error {
	for f, v := range counters {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("stats %s: counter %s: %w", tag, f, err)
		}
		switch {
		case f == "admitted":
			st.Admitted += n
		case f == "sold":
			st.Sold += n
		case f == "lost":
			st.Lost += n
		case strings.HasPrefix(f, "fin:"):
			st.FinishedByStatus[model.Status(strings.TrimPrefix(f, "fin:"))] += n
		}
	}
	return nil
}

// tagsOf returns the tags Redis holds campaign c under: its buckets' (when
// it has several), then its own.
func tagsOf(c model.Campaign) []string {
	return bucketTags(c.ID, c.Buckets, true)
}

// bucketTags returns the tags of a campaign's n buckets, followed by the
// campaign's own when withOwn (a campaign of one bucket has only its own).
func bucketTags(campaignID string, n int, withOwn bool) []string {
	if n <= 1 {
		return []string{campaignID}
	}
	tags := make([]string, 0, n+1)
	for b := range n {
		tags = append(tags, model.BucketTag(campaignID, b, n))
	}
	if withOwn {
		tags = append(tags, campaignID)
	}
	return tags
}

// Remaining reads the units left of each of campaignIDs in one round trip
// (a second for campaigns of several buckets: their sum); a campaign Redis
// does not hold is absent from the map.
func (s *Store) Remaining(ctx context.Context, campaignIDs []string) (map[string]int64, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(campaignIDs))
	metas := make([]*redis.StringCmd, len(campaignIDs))
	for i, id := range campaignIDs {
		cmds[i] = pipe.Get(ctx, campaignKeys(id).stock)
		metas[i] = pipe.HGet(ctx, campaignKeys(id).meta, "buckets")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("remaining of %d campaigns: %w", len(campaignIDs), err)
	}
	out := make(map[string]int64, len(campaignIDs))
	var bucketed []int
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("remaining of %s: %w", campaignIDs[i], err)
		}
		out[campaignIDs[i]] = n
		if b, _ := metas[i].Int(); b > 1 {
			bucketed = append(bucketed, i)
		}
	}
	if len(bucketed) == 0 {
		return out, nil
	}
	pipe = s.rdb.Pipeline()
	sums := make(map[string][]*redis.StringCmd, len(bucketed))
	for _, i := range bucketed {
		id := campaignIDs[i]
		b, _ := metas[i].Int()
		for _, tag := range bucketTags(id, b, false) {
			sums[id] = append(sums[id], pipe.Get(ctx, campaignKeys(tag).stock))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("remaining of %d campaigns: %w", len(bucketed), err)
	}
	for id, cs := range sums {
		var sum int64
		for _, c := range cs {
			n, _ := c.Int64()
			sum += n
		}
		out[id] = sum
	}
	return out, nil
}
