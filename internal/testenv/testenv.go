// Package testenv gives integration tests their real Redis and MariaDB, each
// isolated per test. Addresses come from FLASHSALE_TEST_REDIS_ADDR and
// FLASHSALE_TEST_MYSQL_DSN. When one is unset or unreachable a test is skipped
// with the reason on a laptop, and fails under CI=true: a CI run must never
// pass by skipping its integration tests.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// Env variables read by this package.
const (
	RedisAddrEnv = "FLASHSALE_TEST_REDIS_ADDR"
	MySQLDSNEnv  = "FLASHSALE_TEST_MYSQL_DSN"
	// SoakEnv scales the fault tests: FLASHSALE_SOAK=10 runs each sale ten
	// times as long, with ten times the faults. Unset or 1: the short CI
	// versions.
	SoakEnv = "FLASHSALE_SOAK"
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

// unavailable skips the test on a laptop and fails it in CI.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("CI=true and %s", msg)
	}
	t.Skip(msg)
}

// UniqueName returns prefix plus random hex, for keys and database names.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
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

// Topic returns a unique queue topic name for one test.
func Topic(t testing.TB) string {
	return UniqueName("t_" + strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())[:min(20, len(t.Name()))] + "_")
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
