// Package store owns flashsale's Redis keyspace and its Lua scripts. Every key
// of a campaign carries the campaign's hash tag ({id}), so each script touches
// one slot and runs unchanged on Redis Cluster. No other package builds keys.
package store

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
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
	//go:embed unknown.lua
	unknownSource string
	//go:embed sweep.lua
	sweepSource string
	//go:embed endearly.lua
	endEarlySource string
	//go:embed remove.lua
	removeSource string
)

// Store runs flashsale's Redis operations on a client, ring or cluster.
type Store struct {
	rdb      redis.UniversalClient
	deduct   *redis.Script
	withdraw *redis.Script
	rebuild  *redis.Script
	paused   *redis.Script
	reject   *redis.Script
	admit    *redis.Script
	release  *redis.Script
	unknown  *redis.Script
	sweep    *redis.Script
	endEarly *redis.Script
	remove   *redis.Script

	// retention is how long a campaign's keys outlive its sale (expireAt).
	retention time.Duration
	// replicaAck is how many replicas must have a deduction's writes
	// (replicas.go).
	replicaAck ReplicaAck
	// plainResults sends results by PUBLISH/SUBSCRIBE instead of their
	// sharded forms (WithPlainResults).
	plainResults bool
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
		rdb:      rdb,
		deduct:   redis.NewScript(deductSource),
		withdraw: redis.NewScript(withdrawSource),
		rebuild:  redis.NewScript(rebuildSource),
		paused:   redis.NewScript(pausedSource),
		reject:   redis.NewScript(rejectSource),
		admit:    redis.NewScript(admitSource),
		release:  redis.NewScript(releaseSource),
		unknown:  redis.NewScript(unknownSource),
		sweep:    redis.NewScript(sweepSource),
		endEarly: redis.NewScript(endEarlySource),
		remove:   redis.NewScript(removeSource),
	}
	s.retention = DefaultKeyRetention
	for _, o := range opts {
		o(s)
	}
	return s
}

// keys of one campaign; all share the hash tag {id}.
type keys struct {
	meta, stock, soldout, counters, users, results, idem string
	released, unknown                                    string
	campaignLimit, userLimits, ipLimits                  string
}

func campaignKeys(id string) keys {
	p := "fs:{" + id + "}:"
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
		// Requests whose publish outcome was unknown (see unknown.go).
		unknown: p + "unknown",
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

// Deduct decides a batch of one campaign's requests in one atomic script
// call, under the epoch the reply names. It decides nothing when the
// campaign is not loaded (model.ErrNotLoaded) or paused (model.ErrPaused):
// the caller holds the batch until it is back. Either way, unless the
// campaign is not loaded, the batch's requests are no longer ones the sweep
// of unknown publishes may reject (SweepUnknown): a worker has seen them.
func (s *Store) Deduct(ctx context.Context, campaignID string, batch []model.Deduction) (model.DeductReply, error) {
	if len(batch) == 0 {
		return model.DeductReply{}, nil
	}
	k := campaignKeys(campaignID)
	args := make([]any, 0, 1+4*len(batch))
	args = append(args, len(batch))
	for _, d := range batch {
		args = append(args, d.RequestID, d.UserID, d.Quantity, d.OrderID)
	}
	reply, err := s.runDeduct(ctx, []string{k.stock, k.users, k.results, k.soldout, k.counters, k.meta, k.unknown}, args)
	if err != nil {
		return model.DeductReply{}, fmt.Errorf("deduct %s (%d requests): %w", campaignID, len(batch), err)
	}
	out, err := parseDeductReply(campaignID, batch, reply)
	if err != nil {
		return model.DeductReply{}, fmt.Errorf("deduct %s: %w", campaignID, err)
	}
	return out, nil
}

// parseDeductReply is the one place that reads deduct.lua's reply.
func parseDeductReply(campaignID string, batch []model.Deduction, reply []any) (model.DeductReply, error) {
	if len(reply) == 0 {
		return model.DeductReply{}, errors.New("empty reply")
	}
	flag, ok := reply[0].(int64)
	if !ok {
		return model.DeductReply{}, fmt.Errorf("reply[0] is %T, want integer", reply[0])
	}
	switch {
	case flag == -1 && len(reply) == 1:
		return model.DeductReply{}, model.ErrNotLoaded
	case flag == -2 && len(reply) == 1:
		return model.DeductReply{}, model.ErrPaused
	case flag != 0 && flag != 1:
		return model.DeductReply{}, fmt.Errorf("reply[0] is %d, want 0, 1, -1 or -2", flag)
	case len(reply) != 2+3*len(batch):
		return model.DeductReply{}, fmt.Errorf("reply has %d elements, want %d", len(reply), 2+3*len(batch))
	}
	epoch, ok := reply[1].(int64)
	if !ok || epoch < 0 {
		return model.DeductReply{}, fmt.Errorf("reply[1] is %v, want an epoch", reply[1])
	}
	out := model.DeductReply{SoldOutNow: flag == 1, Epoch: epoch, Results: make([]model.Result, len(batch))}
	for i, d := range batch {
		var f [3]string
		for j := range f {
			v, ok := reply[2+3*i+j].(string)
			if !ok {
				return model.DeductReply{}, fmt.Errorf("reply[%d] is %T, want string", 2+3*i+j, reply[2+3*i+j])
			}
			f[j] = v
		}
		st := model.Status(f[0])
		if !st.Final() {
			return model.DeductReply{}, fmt.Errorf("request %s: status %q is not final", d.RequestID, f[0])
		}
		out.Results[i] = model.Result{
			RequestID: d.RequestID, CampaignID: campaignID, UserID: d.UserID,
			Status: st, OrderID: f[1], Reason: f[2], Quantity: d.Quantity,
		}
	}
	return out, nil
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
	c, ok := model.CampaignOfRequest(requestID)
	if !ok {
		return model.Result{}, fmt.Errorf("result %q: %w", requestID, model.ErrNotFound)
	}
	v, err := s.rdb.HGet(ctx, campaignKeys(c).results, requestID).Result()
	if errors.Is(err, redis.Nil) {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	if err != nil {
		return model.Result{}, fmt.Errorf("result %s: %w: %v", requestID, model.ErrUnavailable, err)
	}
	return decodeStored(requestID, c, v)
}

// Results returns the stored results of requestIDs, in their order, in one
// round trip: one HMGET per campaign, pipelined when there are several (a
// cluster client splits the pipeline by slot; each HMGET stays within its
// campaign's slot). An unknown or malformed id has the zero Result (empty
// Status) at its place. An error means no result was read.
func (s *Store) Results(ctx context.Context, requestIDs []string) ([]model.Result, error) {
	out := make([]model.Result, len(requestIDs))
	type read struct {
		campaignID string
		at         []int // indexes into requestIDs
		cmd        *redis.SliceCmd
	}
	var reads []*read
	byCampaign := map[string]*read{}
	for i, id := range requestIDs {
		c, ok := model.CampaignOfRequest(id)
		if !ok {
			continue
		}
		rd := byCampaign[c]
		if rd == nil {
			rd = &read{campaignID: c}
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
		rd.cmd = s.rdb.HMGet(ctx, campaignKeys(rd.campaignID).results, fields(rd)...)
		err = rd.cmd.Err()
	} else {
		pipe := s.rdb.Pipeline()
		for _, rd := range reads {
			rd.cmd = pipe.HMGet(ctx, campaignKeys(rd.campaignID).results, fields(rd)...)
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
			r, err := decodeStored(id, rd.campaignID, stored)
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

// Stats reads a campaign's counters in one round trip.
func (s *Store) Stats(ctx context.Context, campaignID string) (model.Stats, error) {
	k := campaignKeys(campaignID)
	pipe := s.rdb.Pipeline()
	meta := pipe.HGet(ctx, k.meta, "stock")
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
	stock, err := meta.Int64()
	if errors.Is(err, redis.Nil) {
		return st, nil
	}
	if err != nil {
		return model.Stats{}, fmt.Errorf("stats %s: stock: %w", campaignID, err)
	}
	st.Loaded, st.Stock = true, stock
	if st.Remaining, err = rem.Int64(); err != nil {
		return model.Stats{}, fmt.Errorf("stats %s: remaining: %w", campaignID, err)
	}
	st.SoldOut = flag.Val() == 1
	for f, v := range counters.Val() {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return model.Stats{}, fmt.Errorf("stats %s: counter %s: %w", campaignID, f, err)
		}
		switch {
		case f == "admitted":
			st.Admitted = n
		case f == "sold":
			st.Sold = n
		case strings.HasPrefix(f, "fin:"):
			st.FinishedByStatus[model.Status(strings.TrimPrefix(f, "fin:"))] = n
		}
	}
	return st, nil
}

// Reject gives a request a final rejected result with reason, unless it
// already has a final result, and returns the result that stands. The
// request is no longer one the sweep of unknown publishes may reject.
func (s *Store) Reject(ctx context.Context, d model.Deduction, campaignID, reason string) (model.Result, error) {
	k := campaignKeys(campaignID)
	v := encodeStored(model.Result{Status: model.StatusRejected, Quantity: d.Quantity, Reason: reason, UserID: d.UserID})
	stored, err := s.reject.Run(ctx, s.rdb, []string{k.results, k.counters, k.meta, k.unknown}, d.RequestID, v).Text()
	if err != nil {
		return model.Result{}, fmt.Errorf("reject %s: %w", d.RequestID, err)
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
	v, err := s.rdb.HGet(ctx, campaignKeys(a.CampaignID).idem, idemField(a.UserID, a.IdempotencyKey)).Result()
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
