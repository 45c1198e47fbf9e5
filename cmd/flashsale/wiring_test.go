package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
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
