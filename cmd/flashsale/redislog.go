package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// go-redis writes its own lines (a failed dial, a broken pool connection)
// through one logger for the whole process, by default unstructured to
// stderr: with Redis down that is a line per command attempt, ~150 in six
// seconds, in the middle of a JSON log. routeRedisLog sends them through the
// command's slog logger instead, at most redisLogBurst lines per
// redisLogWindow; the first line of the next window says how many were
// left out.
const (
	redisLogWindow = 10 * time.Second
	redisLogBurst  = 5
)

// routeRedisLog installs the adapter. The library keeps the logger in a
// package variable, so the last command to start in a process decides where
// its lines go; each process runs one command.
func routeRedisLog(log *slog.Logger) {
	redis.SetLogger(&redisLog{log: log.With("library", "go-redis"), window: redisLogWindow, burst: redisLogBurst, now: time.Now})
}

// redisLog adapts slog to go-redis's logger, rate-limited.
type redisLog struct {
	log    *slog.Logger
	window time.Duration
	burst  int
	now    func() time.Time

	mu         sync.Mutex
	start      time.Time // of the current window
	written    int       // lines written in the current window
	suppressed int       // lines left out since the last one written
}

// Printf logs one of the library's lines at warn: it writes only about
// trouble (failed dials, connections it had to drop).
func (l *redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.mu.Lock()
	if now := l.now(); now.Sub(l.start) >= l.window {
		l.start, l.written = now, 0
	}
	if l.written >= l.burst {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.written++
	suppressed := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()

	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	if suppressed > 0 {
		l.log.WarnContext(ctx, msg, "suppressed", suppressed)
		return
	}
	l.log.WarnContext(ctx, msg)
}
