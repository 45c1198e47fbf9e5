package metrics

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ScriptHook is a go-redis hook that observes every Lua script call (EVALSHA,
// EVAL and their read-only forms) on ScriptDuration, labelled with the
// script's name from names (SHA1 in hex → name; others are "other"). A
// call refused with NOSCRIPT, which go-redis follows with an EVAL, is not
// observed. A pipelined call is observed with its pipeline's round trip.
func (m *Metrics) ScriptHook(names map[string]string) redis.Hook {
	return scriptHook{m: m, names: names}
}

type scriptHook struct {
	m     *Metrics
	names map[string]string
}

var _ redis.Hook = scriptHook{}

func (h scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name, ok := h.script(cmd)
		if !ok {
			return next(ctx, cmd)
		}
		start := time.Now()
		err := next(ctx, cmd)
		if err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
			Since(h.m.ScriptDuration.WithLabelValues(name), start)
		}
		return err
	}
}

func (h scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var scripts []string
		for _, c := range cmds {
			if name, ok := h.script(c); ok {
				scripts = append(scripts, name)
			}
		}
		if len(scripts) == 0 {
			return next(ctx, cmds)
		}
		start := time.Now()
		err := next(ctx, cmds)
		d := time.Since(start).Seconds()
		for _, name := range scripts {
			h.m.ScriptDuration.WithLabelValues(name).Observe(d)
		}
		return err
	}
}

// script names the script cmd runs, if it runs one.
func (h scriptHook) script(cmd redis.Cmder) (string, bool) {
	var sha string
	switch cmd.Name() {
	case "evalsha", "evalsha_ro":
		sha, _ = argString(cmd, 1)
	case "eval", "eval_ro":
		src, _ := argString(cmd, 1)
		sum := sha1.Sum([]byte(src))
		sha = hex.EncodeToString(sum[:])
	default:
		return "", false
	}
	if name, ok := h.names[sha]; ok {
		return name, true
	}
	return "other", true
}

func argString(cmd redis.Cmder, i int) (string, bool) {
	args := cmd.Args()
	if len(args) <= i {
		return "", false
	}
	s, ok := args[i].(string)
	return s, ok
}
