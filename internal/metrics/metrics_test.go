package metrics

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatalf("read counter: %v", err)
	}
	return m.GetCounter().GetValue()
}

// series counts what the registry exposes under name.
func series(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return len(f.GetMetric())
		}
	}
	return 0
}

// TestCounterVecKeepsChildren: the kept children are the registered ones, so
// what is counted through them is what /metrics exposes.
func TestCounterVecKeepsChildren(t *testing.T) {
	m := New()
	for range 3 {
		m.Refusals.WithLabelValues("sold_out").Inc()
	}
	m.Refusals.WithLabelValues("rate_user").Add(2)
	m.Requests.WithLabelValues("/a", "200").Inc()
	m.Requests.WithLabelValues("/a", "200").Inc()
	tests := []struct {
		name string
		got  float64
		want float64
	}{
		{"sold_out", value(t, m.Refusals.CounterVec.WithLabelValues("sold_out")), 3},
		{"rate_user", value(t, m.Refusals.CounterVec.WithLabelValues("rate_user")), 2},
		{"two labels", value(t, m.Requests.CounterVec.WithLabelValues("/a", "200")), 2},
		{"series", float64(series(t, m.Registry, "flashsale_admit_refusals_total")), 2},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// TestGinMiddlewareCounts: one series per route template and status code.
func TestGinMiddlewareCounts(t *testing.T) {
	gin.SetMode(gin.TestMode)
	m := New()
	e := gin.New()
	e.Use(m.GinMiddleware())
	e.GET("/items/:id", func(c *gin.Context) {
		if c.Param("id") == "gone" {
			c.Status(http.StatusGone)
			return
		}
		c.Status(http.StatusOK)
	})
	for _, path := range []string{"/items/1", "/items/2", "/items/gone", "/nowhere", "/items/3"} {
		e.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	tests := []struct {
		route, code string
		want        float64
	}{
		{"/items/:id", "200", 3},
		{"/items/:id", "410", 1},
		{"unmatched", "404", 1},
	}
	for _, tc := range tests {
		if got := value(t, m.Requests.CounterVec.WithLabelValues(tc.route, tc.code)); got != tc.want {
			t.Errorf("%s %s: got %v, want %v", tc.route, tc.code, got, tc.want)
		}
	}
}
