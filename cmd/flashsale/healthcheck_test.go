package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestHealthcheck: the containers' health check passes on a 2xx answer
// only, and shows the answer (which names the failing checks).
func TestHealthcheck(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ready":
			_, _ = io.WriteString(w, `{"queue":"ok"}`)
		case "/down":
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"queue":"down"}`)
		case "/stuck":
			<-release
		}
	}))
	t.Cleanup(func() {
		close(release)
		srv.Close()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	refused := "http://" + ln.Addr().String() + "/readyz"
	_ = ln.Close()

	tests := []struct {
		name    string
		args    []string
		wantErr bool
		want    string
	}{
		{name: "ready", args: []string{"--url", srv.URL + "/ready"}, want: `200 OK {"queue":"ok"}`},
		{name: "not ready", args: []string{"--url", srv.URL + "/down"}, wantErr: true, want: `503 Service Unavailable {"queue":"down"}`},
		{name: "nothing listening", args: []string{"--url", refused}, wantErr: true},
		{name: "no answer in time", args: []string{"--url", srv.URL + "/stuck", "--timeout", "200ms"}, wantErr: true},
		{name: "stray argument", args: []string{"now"}, wantErr: true, want: "Usage: flashsale healthcheck"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			start := time.Now()
			err := run(context.Background(), append([]string{"healthcheck"}, tc.args...), &out, map[string]string{}, logTo(io.Discard))
			if (err != nil) != tc.wantErr {
				t.Fatalf("got err %v, want error %v", err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("output %q lacks %q", out.String(), tc.want)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("took %v, want the timeout to bound it", took)
			}
		})
	}
}
