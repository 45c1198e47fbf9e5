// Package store owns flashsale's Redis keyspace and its Lua scripts. Every key
// of a campaign carries the campaign's hash tag ({id}), so each script touches
// one slot and runs unchanged on Redis Cluster. No other package builds keys.
package store

import (
	"context"
	_ "embed"
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

var (
	//go:embed deduct.lua
	deductSource string
	//go:embed withdraw.lua
	withdrawSource string
	//go:embed rebuild.lua
	rebuildSource string
	//go:embed paused.lua
	pausedSource string
	//go:embed reject.lua
	rejectSource string
	//go:embed release.lua
	releaseSource string
	//go:embed notenqueued.lua
	notEnqueuedSource string
	//go:embed endearly.lua
	endEarlySource string
	//go:embed remove.lua
	removeSource string
	//go:embed take.lua
	takeSource string
	//go:embed give.lua
	giveSource string
	//go:embed settle.lua
	settleSource string
	//go:embed soldout.lua
	soldOutSource string
)

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
		deduct:      redis.NewScript(deductSource),
		withdraw:    redis.NewScript(withdrawSource),
		rebuild:     redis.NewScript(rebuildSource),
		paused:      redis.NewScript(pausedSource),
		reject:      redis.NewScript(rejectSource),
		admit:       redis.NewScript(admitSource),
		release:     redis.NewScript(releaseSource),
		notEnqueued: redis.NewScript(notEnqueuedSource),
		endEarly:    redis.NewScript(endEarlySource),
		remove:      redis.NewScript(removeSource),
		take:        redis.NewScript(takeSource),
		give:        redis.NewScript(giveSource),
		settle:      redis.NewScript(settleSource),
		soldOut:     redis.NewScript(soldOutSource),
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
		// Stock transfers between buckets (see buckets.go).
		xfer:  p + "xfer",
		xpend: p + "xpend",
		got:   p + "got",
		// Rate-limit state (see admit.lua).
		campaignLimit: p + "rl:all",
		userLimits:    p + "rl:users",
		ipLimits:      p + "rl:ips",
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
	for _, prefix := range []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY"} {
		if strings.HasPrefix(msg, prefix) {
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

// Deduct decides a batch of requests of one tag (a campaign, or one bucket
// of a campaign of several: model.TagOfRequest) in one atomic script call,
// under the epoch the reply names. It decides nothing when the
// campaign is not loaded (model.ErrNotLoaded) or paused (model.ErrPaused):
// the caller holds the batch until it is back.
// In a bucket of several, a request the bucket lacks the units for is
// decided only after stock moved from the others or every one was found
// empty (buckets.go).
func (s *Store) Deduct(ctx context.Context, tag string, batch []model.Deduction) (model.DeductReply, error) {
	if len(batch) == 0 {
		return model.DeductReply{}, nil
	}
	out, st, err := s.deductOnce(ctx, tag, batch, "")
	switch {
	case err != nil || st.buckets == 0:
		return out, err
	case st.shorts == 0:
		// This batch emptied its bucket: the campaign may be sold out.
		campaignID, _, _ := model.SplitTag(tag)
		out.SoldOutNow, err = s.markSoldOut(ctx, campaignID, st.buckets)
		return out, err
	}
	return s.deductShort(ctx, tag, batch, out, st)
}

// deductOnce runs deduct.lua once; final is ARGV[2+4n] (see there).
func (s *Store) deductOnce(ctx context.Context, tag string, batch []model.Deduction, final string) (model.DeductReply, shortState, error) {
	campaignID, _, ok := model.SplitTag(tag)
	if !ok {
		return model.DeductReply{}, shortState{}, fmt.Errorf("deduct %q: %w", tag, model.Invalid("campaign_id", "not a campaign or bucket"))
	}
	k := campaignKeys(tag)
	args := make([]any, 0, 2+4*len(batch))
	args = append(args, len(batch))
	for _, d := range batch {
		args = append(args, d.RequestID, d.UserID, d.Quantity, d.OrderID)
	}
	if final != "" {
		args = append(args, final)
	}
	reply, err := s.runAcked(ctx, s.deduct, []string{k.stock, k.users, k.results, k.soldout, k.counters, k.meta}, args...).Slice()
	if err != nil {
		return model.DeductReply{}, shortState{}, fmt.Errorf("deduct %s (%d requests): %w", tag, len(batch), err)
	}
	out, st, err := parseDeductReply(campaignID, batch, reply)
	if err != nil {
		return model.DeductReply{}, shortState{}, fmt.Errorf("deduct %s: %w", tag, err)
	}
	return out, st, nil
}

// shortState is what deduct.lua says of a bucket some requests were short
// in: how many, the campaign's bucket count, the bucket's moves counter.
type shortState struct {
	shorts  int
	buckets int
	moves   int64
}

// parseDeductReply is the one place that reads deduct.lua's reply. A short
// request's Result has the empty status.
func parseDeductReply(campaignID string, batch []model.Deduction, reply []any) (model.DeductReply, shortState, error) {
	var st shortState
	if len(reply) == 0 {
		return model.DeductReply{}, st, errors.New("empty reply")
	}
	flag, ok := reply[0].(int64)
	if !ok {
		return model.DeductReply{}, st, fmt.Errorf("reply[0] is %T, want integer", reply[0])
	}
	head := 2
	switch {
	case flag == -1 && len(reply) == 1:
		return model.DeductReply{}, st, model.ErrNotLoaded
	case flag == -2 && len(reply) == 1:
		return model.DeductReply{}, st, model.ErrPaused
	case flag == 2:
		head = 4
	case flag != 0 && flag != 1:
		return model.DeductReply{}, st, fmt.Errorf("reply[0] is %d, want 0, 1, 2, -1 or -2", flag)
	}
	if len(reply) != head+3*len(batch) {
		return model.DeductReply{}, st, fmt.Errorf("reply has %d elements, want %d", len(reply), head+3*len(batch))
	}
	epoch, ok := reply[1].(int64)
	if !ok || epoch < 0 {
		return model.DeductReply{}, st, fmt.Errorf("reply[1] is %v, want an epoch", reply[1])
	}
	if head == 4 {
		n, ok1 := reply[2].(int64)
		moves, ok2 := reply[3].(int64)
		if !ok1 || !ok2 || n < 2 || n > model.MaxBuckets || moves < 0 {
			return model.DeductReply{}, st, fmt.Errorf("reply[2:4] is %v, want buckets and moves", reply[2:4])
		}
		st.buckets, st.moves = int(n), moves
	}
	out := model.DeductReply{SoldOutNow: flag == 1, Epoch: model.Epoch(epoch), Results: make([]model.Result, len(batch))}
	for i, d := range batch {
		var f [3]string
		for j := range f {
			v, ok := reply[head+3*i+j].(string)
			if !ok {
				return model.DeductReply{}, st, fmt.Errorf("reply[%d] is %T, want string", head+3*i+j, reply[head+3*i+j])
			}
			f[j] = v
		}
		if f[0] == "short" && head == 4 {
			st.shorts++
			out.Results[i] = model.Result{RequestID: d.RequestID, CampaignID: campaignID, UserID: d.UserID, Quantity: d.Quantity}
			continue
		}
		st := model.Status(f[0])
		if !st.Final() {
			return model.DeductReply{}, shortState{}, fmt.Errorf("request %s: status %q is not final", d.RequestID, f[0])
		}
		out.Results[i] = model.Result{
			RequestID: d.RequestID, CampaignID: campaignID, UserID: d.UserID,
			Status: st, OrderID: f[1], Reason: f[2], Quantity: d.Quantity,
		}
	}
	return out, st, nil
}

// encodeStored is the compact form kept in the results hash; the Lua scripts
// read and write the same "status|qty|order_id|reason|user" layout. The user id
// goes last, read as the rest after the fourth '|', because it is the only
// field that may hold '|' (any JWT subject, model.CheckUserID) or grow.
func encodeStored(r model.Result) string {
	return string(r.Status) + "|" + strconv.FormatInt(r.Quantity, 10) + "|" + r.OrderID + "|" + r.Reason + "|" + r.UserID
}

func decodeStored(requestID, campaignID, v string) (model.Result, error) {
	f := strings.SplitN(v, "|", 5)
	if len(f) != 5 {
		return model.Result{}, fmt.Errorf("stored result %q malformed", v)
	}
	qty, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return model.Result{}, fmt.Errorf("stored result %q: quantity: %w", v, err)
	}
	st := model.Status(f[0])
	if !st.Valid() {
		return model.Result{}, fmt.Errorf("stored result %q: unknown status", v)
	}
	r := model.Result{RequestID: requestID, CampaignID: campaignID, Status: st, Quantity: qty,
		OrderID: f[2], Reason: f[3], UserID: f[4]}
	if st == model.StatusQueued {
		// A queued marker's reason field holds its admission sequence number
		// (admit.lua); empty in markers written before there was one.
		r.Reason = ""
		if f[3] != "" {
			if r.Seq, err = strconv.ParseInt(f[3], 10, 64); err != nil || r.Seq < 1 {
				return model.Result{}, fmt.Errorf("stored result %q: sequence number", v)
			}
		}
	}
	return r, nil
}

// Result returns the stored result of a request, or model.ErrNotFound.
func (s *Store) Result(ctx context.Context, requestID string) (model.Result, error) {
	tag, ok := model.TagOfRequest(requestID)
	if !ok {
		return model.Result{}, fmt.Errorf("result %q: %w", requestID, model.ErrNotFound)
	}
	c, _, _ := model.SplitTag(tag)
	v, err := s.rdb.HGet(ctx, campaignKeys(tag).results, requestID).Result()
	if errors.Is(err, redis.Nil) {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	if err != nil {
		return model.Result{}, fmt.Errorf("result %s: %w: %v", requestID, model.ErrUnavailable, err)
	}
	return decodeStored(requestID, c, v)
}

// Results returns the stored results of requestIDs, in their order, in one
// round trip: one HMGET per tag (campaign or bucket), pipelined when there are several (a
// cluster client splits the pipeline by slot; each HMGET stays within its
// campaign's slot). An unknown or malformed id has the zero Result (empty
// Status) at its place. An error means no result was read.
func (s *Store) Results(ctx context.Context, requestIDs []string) ([]model.Result, error) {
	out := make([]model.Result, len(requestIDs))
	type read struct {
		tag string
		at  []int // indexes into requestIDs
		cmd *redis.SliceCmd
	}
	var reads []*read
	byCampaign := map[string]*read{}
	for i, id := range requestIDs {
		c, ok := model.TagOfRequest(id)
		if !ok {
			continue
		}
		rd := byCampaign[c]
		if rd == nil {
			rd = &read{tag: c}
			byCampaign[c] = rd
			reads = append(reads, rd)
		}
		rd.at = append(rd.at, i)
	}
	if len(reads) == 0 {
		return out, nil
	}
	fields := func(rd *read) []string {
		f := make([]string, len(rd.at))
		for j, i := range rd.at {
			f[j] = requestIDs[i]
		}
		return f
	}
	var err error
	if len(reads) == 1 {
		// The usual case, one campaign: no pipeline to build.
		rd := reads[0]
		rd.cmd = s.rdb.HMGet(ctx, campaignKeys(rd.tag).results, fields(rd)...)
		err = rd.cmd.Err()
	} else {
		pipe := s.rdb.Pipeline()
		for _, rd := range reads {
			rd.cmd = pipe.HMGet(ctx, campaignKeys(rd.tag).results, fields(rd)...)
		}
		_, err = pipe.Exec(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("results of %d requests: %w", len(requestIDs), unavailable(err))
	}
	for _, rd := range reads {
		for j, v := range rd.cmd.Val() {
			stored, ok := v.(string)
			if !ok {
				continue // nil: not stored
			}
			id := requestIDs[rd.at[j]]
			c, _, _ := model.SplitTag(rd.tag)
			r, err := decodeStored(id, c, stored)
			if err != nil {
				return nil, fmt.Errorf("result %s: %w", id, err)
			}
			out[rd.at[j]] = r
		}
	}
	return out, nil
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
		case strings.HasPrefix(f, "fin:"):
			st.FinishedByStatus[model.Status(strings.TrimPrefix(f, "fin:"))] += n
		}
	}
	return nil
}

// Reject gives a request a final rejected result with reason, unless it
// already has a final result, and returns the result that stands. The
// request is no longer one the not-enqueued sweep may reject.
func (s *Store) Reject(ctx context.Context, d model.Deduction, campaignID, reason string) (model.Result, error) {
	// The request's result lives under its tag (its bucket's, if any).
	k := campaignKeys(campaignID)
	if tag, ok := model.TagOfRequest(d.RequestID); ok {
		k = campaignKeys(tag)
	}
	v := encodeStored(model.Result{Status: model.StatusRejected, Quantity: d.Quantity, Reason: reason, UserID: d.UserID})
	stored, err := s.reject.Run(ctx, s.rdb, []string{k.results, k.counters, k.meta}, d.RequestID, v).Text()
	if err != nil {
		return model.Result{}, fmt.Errorf("reject %s: %w", d.RequestID, err)
	}
	if c, _, ok := model.SplitTag(campaignID); ok {
		campaignID = c // the worker may name the bucket's tag
	}
	return decodeStored(d.RequestID, campaignID, stored)
}

// IdempotentRequest answers a's Idempotency-Key as Admit would, without
// admitting anything: ok is false when the key names no request; otherwise
// the reply is AdmitExisting with the earlier request's result as it
// stands, or AdmitKeyReused when a's body differs from that request's.
// A key that names a request costs a second round trip, one that names
// nothing one.
func (s *Store) IdempotentRequest(ctx context.Context, a model.AdmitRequest) (model.AdmitReply, bool, error) {
	v, err := s.rdb.HGet(ctx, campaignKeys(a.KeyTag()).idem, idemField(a.UserID, a.IdempotencyKey)).Result()
	if errors.Is(err, redis.Nil) {
		return model.AdmitReply{}, false, nil
	}
	if err != nil {
		return model.AdmitReply{}, false, fmt.Errorf("idempotency key of %s in %s: %w: %v", a.UserID, a.CampaignID, model.ErrUnavailable, err)
	}
	rid, fp, hasFP := parseIdemValue(v)
	r, err := s.Result(ctx, rid)
	if errors.Is(err, model.ErrNotFound) {
		return model.AdmitReply{}, false, nil // names nothing, as admit.lua treats it
	}
	if err != nil {
		return model.AdmitReply{}, false, fmt.Errorf("idempotency key of %s in %s: %w", a.UserID, a.CampaignID, err)
	}
	if hasFP && fp != fingerprint(a) {
		return model.AdmitReply{Code: model.AdmitKeyReused}, true, nil
	}
	return model.AdmitReply{Code: model.AdmitExisting, RequestID: rid, Result: r}, true, nil
}
