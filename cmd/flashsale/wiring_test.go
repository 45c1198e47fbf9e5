package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/config"
)

// TestRolesLogAsConfigured: the roles log through the newLogger run is given,
// at the loaded config's level and in its format. Each serve fails at its
// listener (an invalid port), after it has logged "starting".
func TestRolesLogAsConfigured(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want func(t *testing.T, logs string)
	}{
		{name: "default text at info", env: map[string]string{}, want: func(t *testing.T, logs string) {
			if !strings.Contains(logs, "level=INFO msg=starting") {
				t.Fatalf("got logs %q, want a text line level=INFO msg=starting", logs)
			}
		}},
		{name: "json", env: map[string]string{"FLASHSALE_LOG_FORMAT": "json"}, want: func(t *testing.T, logs string) {
			var line struct{ Level, Msg string }
			first, _, _ := strings.Cut(logs, "\n")
			if err := json.Unmarshal([]byte(first), &line); err != nil || line.Level != "INFO" || line.Msg != "starting" {
				t.Fatalf("got first line %q (%v), want JSON with level INFO and msg starting", first, err)
			}
		}},
		{name: "warn hides info", env: map[string]string{"FLASHSALE_LOG_LEVEL": "warn"}, want: func(t *testing.T, logs string) {
			if strings.Contains(logs, "starting") {
				t.Fatalf("got logs %q, want no info lines at level warn", logs)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			err := run(context.Background(), []string{"serve", "--addr", "127.0.0.1:-1"}, io.Discard, tc.env, logTo(&logs))
			if err == nil || !strings.Contains(err.Error(), "listen 127.0.0.1:-1") {
				t.Fatalf("got %v, want the listen error", err)
			}
			tc.want(t, logs.String())
		})
	}
}

// TestStartClosesListenerOnFailure: when the admin address cannot be bound,
// start fails and the main address bound before it is free again.
func TestStartClosesListenerOnFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	cfg := config.Default()
	cfg.HTTP.Addr, cfg.HTTP.AdminAddr = ln.Addr().String(), "127.0.0.1:-1"
	_ = ln.Close()
	if _, err := start(context.Background(), cfg, logTo(io.Discard)(cfg.Log), roleSet{gateway: true, worker: true, notifier: true}); err == nil || !strings.Contains(err.Error(), "listen 127.0.0.1:-1") {
		t.Fatalf("got %v, want the admin listen error", err)
	}
	ln, err = net.Listen("tcp", cfg.HTTP.Addr)
	if err != nil {
		t.Fatalf("main address after a failed start: got %v, want it free", err)
	}
	_ = ln.Close()
}
