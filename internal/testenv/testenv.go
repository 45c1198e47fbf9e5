// Package testenv gives integration tests their real Redis and MariaDB, each
// isolated per test. Addresses come from FLASHSALE_TEST_REDIS_ADDR and
// FLASHSALE_TEST_MYSQL_DSN. When one is unset or unreachable a test is skipped
// with the reason on a laptop, and fails under CI=true: a CI run must never
// pass by skipping its integration tests.
//
// Tests clean up what they create: MySQLDSN drops its database, and every
// Redis key a test writes carries a name from Name (or Topic), whose keys
// are deleted when the test ends. Main, a package's TestMain, proves it:
// after the tests it fails the package if the test Redis still holds a key
// carrying any name this process handed out.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// Env variables read by this package. They all start with FLASHSALE_TEST_,
// which the config leaves alone (config.TestEnvPrefix): any other FLASHSALE_
// variable must name a config key, and child processes of the tests inherit
// these.
const (
	RedisAddrEnv = "FLASHSALE_TEST_REDIS_ADDR"
	MySQLDSNEnv  = "FLASHSALE_TEST_MYSQL_DSN"
	// SoakEnv scales the fault tests: FLASHSALE_TEST_SOAK=10 runs each sale
	// ten times as long, with ten times the faults. Unset or 1: the short CI
	// versions.
	SoakEnv = "FLASHSALE_TEST_SOAK"
)

// Soak returns the fault tests' scale factor (at least 1).
func Soak() int {
	n, err := strconv.Atoi(os.Getenv(SoakEnv))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// InCI reports whether missing services must fail tests instead of skipping.
func InCI() bool { v := os.Getenv("CI"); return v == "true" || v == "1" }

// SkipShort skips t under go test -short, the inner loop (README, "Test"),
// saying what it leaves out. The helpers that hand out what the slow tests
// need (a Redis Cluster, a browser, a RocketMQ broker double) call it, so
// those tests need no check of their own; .ci/run never passes -short.
func SkipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: %s", what)
	}
}

// unavailable skips the test on a laptop and fails it in CI.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("CI=true and %s", msg)
	}
	t.Skip(msg)
}

// issued is every name UniqueName handed out in this process, for Main's
// check. It is package state because it must span the package's tests.
var issued struct {
	sync.Mutex
	names []string
	// cleaned holds the names from Name: their tests delete their keys, so
	// a key of theirs found at the end was written after that cleanup, by a
	// system the test had not stopped yet (its stop was registered first,
	// so it ran last). Main deletes such keys without failing.
	cleaned map[string]bool
}

// UniqueName returns prefix plus random hex, for database names and other
// names that reach no Redis key; a name a Redis key will carry comes from
// Name, which deletes the keys. Main fails the package if any name from
// either is still in a key after the tests.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	issued.Lock()
	issued.names = append(issued.names, name)
	issued.Unlock()
	return name
}

// Name returns a UniqueName for a campaign id, a topic or anything else that
// ends up in Redis keys, and at t's cleanup deletes every key of the test
// Redis whose name contains it, in any case (a test may upper-case an id to
// make another one). Call it before starting what writes the
// keys (a system, a child process): cleanups run last-registered first, so
// the keys go after the writers have stopped.
func Name(t testing.TB, prefix string) string {
	t.Helper()
	name := UniqueName(prefix)
	issued.Lock()
	if issued.cleaned == nil {
		issued.cleaned = map[string]bool{}
	}
	issued.cleaned[strings.ToLower(name)] = true
	issued.Unlock()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := eachServer(ctx, func(c *redis.Client) error {
			keys, err := scan(ctx, c, "*"+globFold(name)+"*")
			if err == nil {
				err = del(ctx, c, keys)
			}
			return err
		})
		if err != nil {
			t.Errorf("delete the Redis keys of %s: %v", name, err)
		}
	})
	return name
}

// eachServer calls fn with a client of every server a test may have
// written to: the test Redis and each master of the shared test cluster.
// One that is not configured or does not answer is passed over: nothing
// was written there (its tests were skipped or failed on it).
func eachServer(ctx context.Context, fn func(c *redis.Client) error) error {
	var addrs []string
	if a := os.Getenv(RedisAddrEnv); a != "" {
		addrs = append(addrs, a)
	}
	if seeds := os.Getenv(ClusterAddrsEnv); seeds != "" {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(seeds, ","), MaxRetries: -1})
		defer cc.Close()
		var mu sync.Mutex
		_ = cc.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
			mu.Lock()
			addrs = append(addrs, m.Options().Addr)
			mu.Unlock()
			return nil
		})
	}
	var errs []error
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		if c.Ping(ctx).Err() == nil {
			if err := fn(c); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", a, err))
			}
		}
		_ = c.Close()
	}
	return errors.Join(errs...)
}

// scan returns the keys matching the glob pattern.
func scan(ctx context.Context, c *redis.Client, pattern string) ([]string, error) {
	var keys []string
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	return keys, iter.Err()
}

// del deletes keys one by one: on a cluster they live in different slots.
func del(ctx context.Context, c *redis.Client, keys []string) error {
	for _, k := range keys {
		if err := c.Del(ctx, k).Err(); err != nil {
			return fmt.Errorf("del %s: %w", k, err)
		}
	}
	return nil
}

// globFold is a SCAN MATCH pattern for s in any case: letters become a
// class of both cases, the characters MATCH treats as a pattern are quoted.
func globFold(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch lower, upper := unicode.ToLower(r), unicode.ToUpper(r); {
		case lower != upper:
			b.WriteString("[" + string(lower) + string(upper) + "]")
		case strings.ContainsRune(`\*?[]^`, r):
			b.WriteString(`\` + string(r))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Main runs a package's tests (call it from TestMain) and then checks that
// they left no Redis key behind: a key carrying a name from UniqueName means
// a test wrote under a name nothing deletes. Such keys are listed, deleted,
// and the package fails. Keys of a Name still there were written after its
// test's cleanup (see issued.cleaned): they are deleted quietly. Without a test Redis there is nothing to
// check.
func Main(m *testing.M) {
	code := m.Run()
	if err := checkLeftKeys(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

// checkLeftKeys is Main's check.
func checkLeftKeys() error {
	issued.Lock()
	names := slices.Clone(issued.names)
	cleaned := maps.Clone(issued.cleaned)
	issued.Unlock()
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, n := range names {
		names[i] = strings.ToLower(n)
	}
	var left []string
	err := eachServer(ctx, func(c *redis.Client) error {
		all, err := scan(ctx, c, "*")
		if err != nil {
			return fmt.Errorf("scan the test Redis for keys left behind: %w", err)
		}
		var late []string
		for _, k := range all {
			lower := strings.ToLower(k)
			i := slices.IndexFunc(names, func(n string) bool { return strings.Contains(lower, n) })
			switch {
			case i < 0:
			case cleaned[names[i]]:
				late = append(late, k)
			default:
				left = append(left, k)
				_ = c.Del(ctx, k).Err()
			}
		}
		if err := del(ctx, c, late); err != nil {
			return fmt.Errorf("delete keys written after their test's cleanup: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(left) == 0 {
		return nil
	}
	slices.Sort(left)
	return fmt.Errorf("the tests left %d Redis keys behind (now deleted); name what writes them with testenv.Name: %s",
		len(left), strings.Join(left[:min(len(left), 20)], " "))
}

// Redis returns a client for the test Redis. Tests share the server, so each
// must isolate itself with its own key names (UniqueName) — campaign ids and
// topics from UniqueName do that. The client is closed at cleanup.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	addr := os.Getenv(RedisAddrEnv)
	if addr == "" {
		unavailable(t, "%s is not set (e.g. 127.0.0.1:6379)", RedisAddrEnv)
	}
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		unavailable(t, "Redis at %s unreachable: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RedisAddr returns the test Redis address, checking that it answers.
func RedisAddr(t testing.TB) string {
	t.Helper()
	Redis(t)
	return os.Getenv(RedisAddrEnv)
}

// MySQLDSN creates a fresh database on the test MariaDB and returns a DSN for
// it (parseTime on). The database is dropped at cleanup.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(MySQLDSNEnv)
	if dsn == "" {
		unavailable(t, "%s is not set (e.g. root@tcp(127.0.0.1:3306)/test)", MySQLDSNEnv)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("parse %s: %v", MySQLDSNEnv, err)
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("open mysql: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		_ = admin.Close()
		unavailable(t, "MySQL at %s unreachable: %v", cfg.Addr, err)
	}
	name := UniqueName("fs_test_")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		_ = admin.Close()
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
		_ = admin.Close()
	})
	cfg.DBName = name
	cfg.ParseTime = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	return cfg.FormatDSN()
}

// Topic returns a unique queue topic name for one test, a Name: its keys
// are deleted when the test ends.
func Topic(t testing.TB) string {
	return Name(t, "t_"+strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())[:min(20, len(t.Name()))]+"_")
}

// Eventually polls cond until it reports done, failing the test after
// timeout; progress describes the state for the failure message. It waits
// for an event, not for an amount of time, so a slow machine only makes it
// poll longer.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (done bool, progress string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, progress := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, progress)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
