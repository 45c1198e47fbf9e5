package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// Guard is a go-redis hook that keeps a Redis that froze or died from
// holding anyone for long: every call that does not block by design gets
// a deadline of Timeout (the caller's, when that is sooner), its failure
// to get an answer is model.ErrUnavailable (a 503 with Retry-After, never a
// 500), and the outage's start and end are each logged once.
//
// go-redis alone would wait ReadTimeout (5 s) per attempt and retry three
// times: 10-25 s of a shopper's connection, past the HTTP write timeout, so
// the shopper got no answer at all. The client must have
// ContextTimeoutEnabled for the deadline to reach its sockets.
//
// Commands that block by design (WAIT, blocking stream and list reads) keep
// the client's own timeouts: their caller asked to wait.
type Guard struct {
	// Timeout bounds each call; 0 leaves calls unbounded.
	Timeout time.Duration
	// Log gets the outage's start (warn) and end (info).
	Log *slog.Logger
	// Observe, when set, is told each change: up false when an outage
	// starts, true when it ends.
	Observe func(up bool)

	down     atomic.Bool
	outages  atomic.Int64 // outages begun
	lastFail atomic.Int64 // unix ns of the last call without an answer
	mu       sync.Mutex
	since    time.Time // the outage's start
	failed   int64     // calls that failed during it
	cause    error     // the first failure
}

var _ redis.Hook = (*Guard)(nil)

// DialHook bounds nothing more: the client's DialTimeout does.
func (g *Guard) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook bounds one command.
func (g *Guard) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if g.Timeout > 0 && !blocking(cmd) {
			var cancel context.CancelFunc
			ctx, cancel = g.bound(ctx)
			defer cancel()
		}
		err := next(ctx, cmd)
		g.observe(ctx, cmd, err)
		if err != nil && cmd.Err() != nil {
			return cmd.Err()
		}
		return err
	}
}

// ProcessPipelineHook bounds a pipeline as one call, unless one of its
// commands blocks by design (a deduction's WAIT for replicas).
func (g *Guard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		bounded := g.Timeout > 0
		for _, cmd := range cmds {
			bounded = bounded && !blocking(cmd)
		}
		if bounded {
			var cancel context.CancelFunc
			ctx, cancel = g.bound(ctx)
			defer cancel()
		}
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			g.observe(ctx, cmd, cmd.Err())
		}
		if err != nil {
			for _, cmd := range cmds {
				if errors.Is(cmd.Err(), model.ErrUnavailable) {
					return cmd.Err()
				}
			}
		}
		return err
	}
}

// Down reports whether an outage is on: a call got no answer, and since
// then none has, or failures went on within the timeout.
func (g *Guard) Down() bool { return g.down.Load() }

// Outages is how many outages this guard saw begin: a caller that
// remembers it can tell whether Redis was out since (a campaign's state
// there may then be older than MySQL's, degraded mode).
func (g *Guard) Outages() int64 { return g.outages.Load() }

func (g *Guard) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= g.Timeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, g.Timeout)
}

// observe marks cmd's failure to get an answer as model.ErrUnavailable and
// follows the outage: any answer (an error reply included) ends it.
func (g *Guard) observe(ctx context.Context, cmd redis.Cmder, err error) {
	switch {
	case err == nil || errors.Is(err, redis.Nil) || isReply(err):
		// An outage ends once answers come and failures have stopped for
		// a timeout: on a cluster with one master out, the others answer
		// between its failures, which must not log an outage per call.
		if g.down.Load() && time.Since(time.Unix(0, g.lastFail.Load())) >= g.Timeout {
			g.up()
		}
	case errors.Is(err, model.ErrUnavailable): // marked already
	case errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled):
		// The caller left; that says nothing about Redis.
	case noAnswer(err):
		cmd.SetErr(fmt.Errorf("%w: redis: %w", model.ErrUnavailable, err))
		g.fail(err)
	}
}

func (g *Guard) fail(err error) {
	g.lastFail.Store(time.Now().UnixNano())
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.down.Load() {
		g.failed++
		return
	}
	g.down.Store(true)
	g.outages.Add(1)
	g.since, g.failed, g.cause = time.Now(), 1, err
	if g.Log != nil {
		g.Log.Warn("redis unavailable: calls that need it fail within the timeout, and requests that need it are answered 503",
			"timeout", g.Timeout, "err", err)
	}
	if g.Observe != nil {
		g.Observe(false)
	}
}

func (g *Guard) up() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.down.Load() || time.Since(time.Unix(0, g.lastFail.Load())) < g.Timeout {
		return
	}
	g.down.Store(false)
	if g.Log != nil {
		g.Log.Info("redis available again", "outage", time.Since(g.since).Round(time.Millisecond),
			"failed_calls", g.failed, "first_err", g.cause)
	}
	if g.Observe != nil {
		g.Observe(true)
	}
}

// isReply reports whether err is an error reply of Redis (it answered).
// LOADING, MASTERDOWN and their kind say it cannot serve now, which is
// not an answer.
func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && !transientReply(reply.Error())
}

// noAnswer reports whether err says Redis gave no answer: a timeout, a
// refused, reset or closed connection, a full pool, or a transient reply.
func noAnswer(err error) bool {
	var reply redis.Error
	if errors.As(err, &reply) {
		return transientReply(reply.Error())
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// blocking reports whether cmd waits by design: the caller chose how long.
func blocking(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "wait", "waitaof", "xread", "xreadgroup", "blpop", "brpop", "brpoplpush", "blmove", "blmpop",
		"bzpopmin", "bzpopmax", "bzmpop":
		return true
	}
	return false
}
