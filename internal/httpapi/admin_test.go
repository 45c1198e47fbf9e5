package httpapi

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

const testAdminToken = "the-admin-token"

// adminEngine serves GET /admin behind admin's middleware on a clock the
// test moves; it logs into logs.
func adminEngine(maxFailures int, now *time.Time, logs *bytes.Buffer) *gin.Engine {
	gin.SetMode(gin.TestMode)
	log := slog.New(slog.NewTextHandler(logs, nil))
	e := gin.New()
	e.GET("/admin", admin(log, testAdminToken, newAdminGuard(log, maxFailures, func() time.Time { return *now })),
		func(c *gin.Context) { c.Status(http.StatusOK) })
	return e
}

// call sends GET /admin from ip with token ("" = none) and returns the
// status, the error code and Retry-After.
func call(e *gin.Engine, ip, token string) (status int, code, retryAfter string) {
	req := httptest.NewRequest(http.MethodGet, "/admin", nil)
	req.RemoteAddr = ip + ":40000"
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	e.ServeHTTP(w, req)
	if _, rest, ok := strings.Cut(w.Body.String(), `"code":"`); ok {
		code, _, _ = strings.Cut(rest, `"`)
	}
	return w.Code, code, w.Header().Get("Retry-After")
}

// TestAdminThrottle: an address whose token was wrong maxFailures times in a
// minute is refused, the right token included, until the minute is over;
// other addresses are not.
func TestAdminThrottle(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	e := adminEngine(5, &now, &logs)
	const guesser, admin = "203.0.113.7", "198.51.100.1"
	for i := range 5 {
		if status, code, _ := call(e, guesser, fmt.Sprintf("guess-%d", i)); status != http.StatusForbidden || code != "forbidden" {
			t.Fatalf("guess %d: got %d %q, want 403 forbidden", i, status, code)
		}
		now = now.Add(time.Second)
	}
	if status, code, retry := call(e, guesser, testAdminToken); status != http.StatusTooManyRequests || code != "rate_limited" || retry != "55" {
		t.Fatalf("right token after 5 failures: got %d %q Retry-After %q, want 429 rate_limited 55", status, code, retry)
	}
	if status, code, _ := call(e, guesser, ""); status != http.StatusTooManyRequests || code != "rate_limited" {
		t.Fatalf("no token after 5 failures: got %d %q, want 429 rate_limited", status, code)
	}
	if status, _, _ := call(e, admin, testAdminToken); status != http.StatusOK {
		t.Fatalf("another address: got %d, want 200", status)
	}
	if status, _, _ := call(e, admin, ""); status != http.StatusUnauthorized {
		t.Fatalf("another address without a token: got %d, want 401", status)
	}
	now = now.Add(55 * time.Second) // the guesser's first failure was 60 s ago
	if status, _, _ := call(e, guesser, testAdminToken); status != http.StatusOK {
		t.Fatalf("a minute after the first failure: got %d, want 200", status)
	}
	// The first failure and the throttle were logged, nothing in between.
	if got := strings.Count(logs.String(), "admin authentication failed"); got != 1 {
		t.Errorf("got %d failure lines, want 1:\n%s", got, logs.String())
	}
	if got := strings.Count(logs.String(), "admin authentication throttled"); got != 1 {
		t.Errorf("got %d throttle lines, want 1:\n%s", got, logs.String())
	}
}

// TestAdminThrottleLogBounded: failures from many addresses log at most
// maxFailureLogs lines a minute.
func TestAdminThrottleLogBounded(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	e := adminEngine(3, &now, &logs)
	for i := range 500 {
		if status, _, _ := call(e, fmt.Sprintf("10.0.%d.%d", i/256, i%256), "wrong"); status != http.StatusForbidden {
			t.Fatalf("guess %d: got %d, want 403", i, status)
		}
	}
	if got := strings.Count(logs.String(), "\n"); got != maxFailureLogs {
		t.Fatalf("got %d log lines for 500 failures, want %d", got, maxFailureLogs)
	}
	now = now.Add(failureWindow)
	logs.Reset()
	call(e, "10.9.9.9", "wrong")
	if !strings.Contains(logs.String(), "failures_not_logged=480") {
		t.Fatalf("next window's first line: got %q, want the 480 failures not logged", logs.String())
	}
}

// TestAdminThrottleBounded: the addresses tracked are bounded; beyond the
// bound, new addresses share one count, so they are still throttled.
func TestAdminThrottleBounded(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	g := newAdminGuard(slog.New(slog.NewTextHandler(&logs, nil)), 2, func() time.Time { return now })
	for i := range maxFailingIPs + 100 {
		g.fail(fmt.Sprintf("ip-%d", i), "/admin")
	}
	if len(g.ips) > maxFailingIPs {
		t.Fatalf("tracking %d addresses, want at most %d", len(g.ips), maxFailingIPs)
	}
	if w := g.wait("ip-new"); w <= 0 {
		t.Fatalf("an untracked address beyond the bound after 100 shared failures: wait %v, want throttled", w)
	}
	now = now.Add(failureWindow)
	g.fail("ip-later", "/admin")
	if w := g.wait("ip-later"); w != 0 || len(g.ips) > 2 {
		t.Fatalf("a window later: wait %v with %d addresses tracked, want 0 with the expired ones dropped", w, len(g.ips))
	}
}

// TestAdminAuditSubject: an admin action's log line names what it acted
// on: the campaign a create names in its body, the campaign or order in
// the path, and no campaign_id at all for a route about none.
func TestAdminAuditSubject(t *testing.T) {
	gin.SetMode(gin.TestMode)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	e := gin.New()
	e.Use(Admin(log, testAdminToken, 10))
	ok := func(c *gin.Context) { c.Status(http.StatusOK) }
	e.POST("/admin/v1/campaigns", func(c *gin.Context) { AuditCampaign(c, "spring-sale"); c.Status(http.StatusCreated) })
	e.POST("/admin/v1/campaigns/:id/pause", ok)
	e.POST("/admin/v1/orders/:id/refund", ok)
	e.GET("/admin/v1/payments", ok)
	tests := []struct {
		path, want, wantNot string
	}{
		{path: "/admin/v1/campaigns", want: "campaign_id=spring-sale"},
		{path: "/admin/v1/campaigns/c1/pause", want: "campaign_id=c1"},
		{path: "/admin/v1/orders/o1/refund", want: "order_id=o1", wantNot: "campaign_id"},
		{path: "/admin/v1/payments", want: "route=/admin/v1/payments", wantNot: "campaign_id"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			logs.Reset()
			method := http.MethodPost
			if tt.path == "/admin/v1/payments" {
				method = http.MethodGet
			}
			req := httptest.NewRequest(method, tt.path, nil)
			req.Header.Set("Authorization", "Bearer "+testAdminToken)
			e.ServeHTTP(httptest.NewRecorder(), req)
			line := logs.String()
			if !strings.Contains(line, "admin action") || !strings.Contains(line, tt.want) ||
				(tt.wantNot != "" && strings.Contains(line, tt.wantNot)) {
				t.Errorf("got %q, want %q and no %q", line, tt.want, tt.wantNot)
			}
		})
	}
}
