package queue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	failed := errors.New("mysql: connection refused")
	tests := []struct {
		name string
		err  error
		want Outcome
	}{
		{"nil", nil, Ack},
		{"plain error", failed, Redeliver},
		{"context canceled", context.Canceled, Redeliver},
		{"ErrHeld", ErrHeld, Hold},
		{"wrapped hold", fmt.Errorf("worker: %w: %w", ErrHeld, failed), Hold},
		{"hold wrapped twice", fmt.Errorf("finish: %w", fmt.Errorf("campaign paused: %w", ErrHeld)), Hold},
		{"joined with a hold", errors.Join(failed, ErrHeld), Hold},
		{"the hold's text only", errors.New(ErrHeld.Error()), Redeliver},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.err); got != tc.want {
				t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestOutcomeCounts(t *testing.T) {
	for o, want := range map[Outcome]bool{Ack: true, Redeliver: true, Hold: false} {
		if got := o.Counts(); got != want {
			t.Errorf("%v.Counts() = %v, want %v", o, got, want)
		}
	}
}

func TestBackoff(t *testing.T) {
	const base = 100 * time.Millisecond
	tests := []struct {
		failures int
		want     time.Duration
	}{
		{0, base},
		{1, base},
		{2, 2 * base},
		{3, 4 * base},
		{7, 64 * base},
		{8, 64 * base},
		{1000, 64 * base},
	}
	for _, tc := range tests {
		if got := Backoff(base, tc.failures); got != tc.want {
			t.Errorf("Backoff(%v, %d) = %v, want %v", base, tc.failures, got, tc.want)
		}
	}
}

func TestSettle(t *testing.T) {
	msgs := []Message{{ID: "a", Attempt: 3}, {ID: "b", Attempt: 1}}
	held := fmt.Errorf("campaign paused: %w", ErrHeld)
	tests := []struct {
		name     string
		err      error
		failures int
		want     Outcome
		// line is the one log line wanted ("" for none): its level and
		// what it must hold.
		level string
		holds []string
	}{
		{"ack", nil, 0, Ack, "", nil},
		{"failure", errors.New("boom"), 1, Redeliver, "WARN", []string{"messages=2", "attempt=3", "err=boom", "queue=7"}},
		{"failure in a row", errors.New("boom"), 5, Redeliver, "WARN", []string{"messages=2", "attempt=3"}},
		{"hold starts", held, 1, Hold, "INFO", []string{"messages=2", "attempt=3", "batch held", "queue=7"}},
		{"hold goes on", held, 2, Hold, "DEBUG", []string{"messages=2", "in_a_row=2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
			if got := Settle(log, msgs, tc.err, tc.failures, "queue", 7); got != tc.want {
				t.Errorf("Settle = %v, want %v", got, tc.want)
			}
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if tc.level == "" {
				if buf.Len() != 0 {
					t.Errorf("logged %q, want nothing", buf.String())
				}
				return
			}
			if len(lines) != 1 {
				t.Fatalf("logged %d lines, want 1: %q", len(lines), buf.String())
			}
			if !strings.Contains(lines[0], "level="+tc.level) {
				t.Errorf("logged %q, want level %s", lines[0], tc.level)
			}
			for _, s := range tc.holds {
				if !strings.Contains(lines[0], s) {
					t.Errorf("logged %q, want it to hold %q", lines[0], s)
				}
			}
		})
	}
}
