// Command flashsale runs the flash-sale queue gateway: `serve` runs every role
// in one process, `gateway`, `worker` and `notifier` one role each.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/flashsale/flashsale/internal/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, environ(), logTo(os.Stderr))
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "flashsale:", err)
		os.Exit(1)
	}
}

// newLogger builds a command's logger at its config's level and in its
// format. main passes one to run rather than a logger because each command
// loads its own config.
type newLogger func(config.Log) *slog.Logger

// logTo is the newLogger that writes to w.
func logTo(w io.Writer) newLogger {
	return func(c config.Log) *slog.Logger {
		var level slog.Level
		_ = level.UnmarshalText([]byte(c.Level)) // validated by config
		opts := &slog.HandlerOptions{Level: level}
		if c.Format == "json" {
			return slog.New(slog.NewJSONHandler(w, opts))
		}
		return slog.New(slog.NewTextHandler(w, opts))
	}
}

func environ() map[string]string {
	m := map[string]string{}
	for _, kv := range os.Environ() {
		for i := 0; i < len(kv); i++ {
			if kv[i] == '=' {
				m[kv[:i]] = kv[i+1:]
				break
			}
		}
	}
	return m
}

const usage = `flashsale: a flash-sale queue gateway with async results.

Usage:
  flashsale <command> [flags]

Commands:
  serve        run gateway, worker and notifier in one process (embedded default: no services needed)
  gateway      run the HTTP gateway only (admin + admitting purchases)
  worker       run the queue worker only (Lua deduction + MySQL persistence)
  notifier     run the WebSocket/poll notifier only
  token        mint a shopper JWT for a user id, for trying the API
  loadtest     run a flash sale against a gateway (or an in-process serve) and check its guarantees
  reconcile    compare a campaign's Redis state with its MySQL orders (--repair after the sale)
  archive      remove a finished, reconciled campaign's keys from Redis
  admin        manage campaigns over a gateway's admin API: admin campaigns list|get|create|patch|preload|pause|resume|end|delete|stats
  healthcheck  GET a role's /readyz (or --url) and fail unless it answers 2xx: a container health check
  version      print the version

Run 'flashsale <command> --help' for the flags of a command.
`

// run dispatches a subcommand. Every command's output goes to stdout; a
// command that logs builds its logger with newLog once its config is loaded.
func run(ctx context.Context, args []string, stdout io.Writer, env map[string]string, newLog newLogger) error {
	if len(args) == 0 {
		fmt.Fprint(stdout, usage)
		return fmt.Errorf("no command given")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "version":
		fmt.Fprintln(stdout, "flashsale", version)
		return nil
	case "token":
		return runToken(rest, stdout, env)
	case "loadtest":
		return runLoadtest(ctx, rest, stdout, env, newLog)
	case "reconcile":
		return runReconcile(ctx, rest, stdout, env)
	case "archive":
		return runArchive(ctx, rest, stdout, env)
	case "admin":
		return runAdmin(ctx, rest, stdout, env)
	case "healthcheck":
		return runHealthcheck(ctx, rest, stdout)
	case "serve":
		return runRoles(ctx, cmd, rest, stdout, env, newLog, roleSet{gateway: true, worker: true, notifier: true})
	case "gateway":
		return runRoles(ctx, cmd, rest, stdout, env, newLog, roleSet{gateway: true})
	case "worker":
		return runRoles(ctx, cmd, rest, stdout, env, newLog, roleSet{worker: true})
	case "notifier":
		return runRoles(ctx, cmd, rest, stdout, env, newLog, roleSet{notifier: true})
	}
	fmt.Fprint(stdout, usage)
	return fmt.Errorf("unknown command %q", cmd)
}
