package notifier

import (
	"crypto/tls"
	"net/http/httptest"
	"testing"
)

// TestSameOriginScheme: the default Origin check wants the request's own
// scheme as well as its host.
func TestSameOriginScheme(t *testing.T) {
	tests := []struct {
		name   string
		origin string
		tls    bool
		proto  string // X-Forwarded-Proto
		want   bool
	}{
		{name: "http page, http request", origin: "http://shop.example", want: true},
		{name: "https page, http request", origin: "https://shop.example"},
		{name: "http page, https request", origin: "http://shop.example", tls: true},
		{name: "https page, https request", origin: "https://shop.example", tls: true, want: true},
		{name: "https page behind a TLS proxy", origin: "https://shop.example", proto: "https", want: true},
		{name: "http page behind a TLS proxy", origin: "http://shop.example", proto: "https"},
		{name: "proxies listing https first", origin: "https://shop.example", proto: "https, http", want: true},
		{name: "other scheme", origin: "ftp://shop.example"},
		{name: "no scheme", origin: "shop.example"},
		{name: "null origin", origin: "null"},
		{name: "scheme in capitals", origin: "HTTP://SHOP.example", want: true},
		{name: "other host", origin: "http://evil.example"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "http://shop.example/api/v1/ws", nil)
			r.Header.Set("Origin", tc.origin)
			if tc.tls {
				r.TLS = &tls.ConnectionState{}
			}
			if tc.proto != "" {
				r.Header.Set("X-Forwarded-Proto", tc.proto)
			}
			if got := sameOrigin(r); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}
