package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// switchProxy forwards connections to a Redis, or, while frozen, accepts
// them and never answers: what a client sees of a Redis stopped with
// SIGSTOP.
type switchProxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	frozen  bool
	conns   []net.Conn
}

func newSwitchProxy(t *testing.T, backend string) *switchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, backend: backend}
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	go p.serve()
	return p
}

func (p *switchProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		frozen := p.frozen
		p.mu.Unlock()
		if frozen {
			go func() { _, _ = io.Copy(io.Discard, c) }()
			continue
		}
		b, err := net.Dial("tcp", p.backend)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, b)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(b, c); _ = b.Close() }()
		go func() { _, _ = io.Copy(c, b); _ = c.Close() }()
	}
}

// freeze makes every connection, open or new, stop answering: the open
// ones are closed and the client's new ones go unanswered.
func (p *switchProxy) freeze(frozen bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = frozen
	for _, c := range p.conns {
		if frozen {
			// Writes still go out; nothing comes back.
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.CloseRead()
			}
			continue
		}
		_ = c.Close()
	}
	if !frozen {
		p.conns = nil
	}
}

// TestGuardBoundsFrozenRedis: with a Redis that stops answering, every call
// of a guarded client fails within about the timeout as
// model.ErrUnavailable (go-redis alone: 5 s per attempt, 4 attempts); the
// outage is logged once when it starts and once when Redis answers again;
// a WAIT keeps the wait its caller asked for.
func TestGuardBoundsFrozenRedis(t *testing.T) {
	testenv.Redis(t) // the backend must be up (fails under CI=true when not)
	p := newSwitchProxy(t, testenv.RedisAddr(t))
	var logs bytes.Buffer
	var mu sync.Mutex
	var observed []bool
	const timeout = 200 * time.Millisecond
	g := &Guard{Timeout: timeout, Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs}, nil)),
		Observe: func(up bool) { mu.Lock(); observed = append(observed, up); mu.Unlock() }}
	rdb := redis.NewClient(&redis.Options{Addr: p.ln.Addr().String(), ContextTimeoutEnabled: true,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout})
	rdb.AddHook(g)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	key := testenv.Name(t, "guard")
	if err := rdb.Set(ctx, key, "1", time.Minute).Err(); err != nil {
		t.Fatalf("before the freeze: %v", err)
	}

	p.freeze(true)
	var slowest time.Duration
	for i := range 6 {
		start := time.Now()
		var err error
		if i%2 == 0 {
			err = rdb.Get(ctx, key).Err()
		} else {
			_, err = rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Get(ctx, key)
				pipe.Incr(ctx, key)
				return nil
			})
		}
		slowest = max(slowest, time.Since(start))
		if !errors.Is(err, model.ErrUnavailable) {
			t.Fatalf("call %d with Redis frozen: got %v, want model.ErrUnavailable", i, err)
		}
	}
	// The bound is the property; the margin is for a loaded machine. Unguarded,
	// a call takes 20 s.
	if slowest > timeout+2*time.Second {
		t.Errorf("slowest call with Redis frozen: got %v, want about the timeout %v", slowest, timeout)
	}
	// A caller's own earlier deadline stays the bound.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := rdb.Get(short, key).Err()
	cancel()
	if !errors.Is(err, model.ErrUnavailable) {
		t.Errorf("call with a shorter deadline: got %v, want model.ErrUnavailable", err)
	}

	p.freeze(false)
	testenv.Eventually(t, 10*time.Second, "Redis answers through the proxy again", func() (bool, string) {
		err := rdb.Get(ctx, key).Err()
		return err == nil, errString(err)
	})
	// WAIT is bounded by its own timeout, not the guard's.
	start := time.Now()
	if n, err := rdb.Wait(ctx, 1, 3*timeout).Result(); err != nil || n != 0 {
		t.Errorf("WAIT for a replica that does not exist: got %d, %v; want 0 after its timeout", n, err)
	} else if waited := time.Since(start); waited < 3*timeout {
		t.Errorf("WAIT returned after %v, before its own timeout %v", waited, 3*timeout)
	}
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}

	text := logs.String()
	if n := strings.Count(text, "redis unavailable"); n != 1 {
		t.Errorf("outage start logged %d times, want once:\n%s", n, text)
	}
	if n := strings.Count(text, "redis available again"); n != 1 {
		t.Errorf("outage end logged %d times, want once:\n%s", n, text)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(observed) != 2 || observed[0] || !observed[1] {
		t.Errorf("observed %v, want [false true]", observed)
	}
}

// TestGuardLeavesAnswersAlone: Redis's own answers are not outages: a
// missing key is redis.Nil, a wrong type stays a reply error, and a caller
// that gives up is not Redis's failure.
func TestGuardLeavesAnswersAlone(t *testing.T) {
	var logs bytes.Buffer
	g := &Guard{Timeout: time.Second, Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs}, nil))}
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ContextTimeoutEnabled: true})
	rdb.AddHook(g)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	key := testenv.Name(t, "guard")
	if err := rdb.Get(ctx, key).Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("missing key: got %v, want redis.Nil", err)
	}
	if err := rdb.HSet(ctx, key, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.Redis(t).Del(context.Background(), key).Err() })
	if err := rdb.Get(ctx, key).Err(); err == nil || errors.Is(err, model.ErrUnavailable) {
		t.Errorf("wrong type: got %v, want a reply error that is not model.ErrUnavailable", err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := rdb.Get(gone, key).Err(); errors.Is(err, model.ErrUnavailable) {
		t.Errorf("canceled caller: got %v, want the cancellation alone", err)
	}
	if logs.Len() != 0 {
		t.Errorf("logged with Redis answering:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// TestGuardOneOutageWhileSomeCallsFail: on a cluster with one master out,
// calls to the others succeed between its failures. One guard (one
// client's) sees both: that is one outage, logged once when it starts and
// once when failures have stopped for a timeout, not a pair per call.
func TestGuardOneOutageWhileSomeCallsFail(t *testing.T) {
	testenv.Redis(t)
	frozen := newSwitchProxy(t, testenv.RedisAddr(t))
	frozen.freeze(true)
	var logs bytes.Buffer
	const timeout = 100 * time.Millisecond
	g := &Guard{Timeout: timeout, Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs}, nil))}
	opts := func(addr string) *redis.Options {
		return &redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout}
	}
	out, up := redis.NewClient(opts(frozen.ln.Addr().String())), redis.NewClient(opts(testenv.RedisAddr(t)))
	out.AddHook(g)
	up.AddHook(g)
	t.Cleanup(func() { _ = out.Close(); _ = up.Close() })
	ctx := t.Context()
	for i := range 5 {
		if err := out.Ping(ctx).Err(); !errors.Is(err, model.ErrUnavailable) {
			t.Fatalf("call %d to the master that is out: got %v, want model.ErrUnavailable", i, err)
		}
		if err := up.Ping(ctx).Err(); err != nil {
			t.Fatalf("call %d to a master that answers: %v", i, err)
		}
		if !g.Down() {
			t.Fatalf("call %d: the outage ended while calls still fail", i)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the outage over once failures stopped", func() (bool, string) {
		return up.Ping(ctx).Err() == nil && !g.Down(), "down"
	})
	text := logs.String()
	if a, b := strings.Count(text, "redis unavailable"), strings.Count(text, "redis available again"); a != 1 || b != 1 {
		t.Errorf("logged %d starts and %d ends, want one of each:\n%s", a, b, text)
	}
}
