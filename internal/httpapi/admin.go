package httpapi

import (
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/model"
)

// Admin checks the admin bearer token in constant time and logs the action.
// A client IP whose token was wrong maxFailures times within a minute is
// refused (429 rate_limited, Retry-After) until that minute is over, the
// right token included: guessing runs at maxFailures tries a minute per
// address. The failures are logged, rate-limited.
func Admin(log *slog.Logger, token string, maxFailures int) gin.HandlerFunc {
	return admin(log, token, newAdminGuard(log, maxFailures, time.Now))
}

func admin(log *slog.Logger, token string, g *adminGuard) gin.HandlerFunc {
	return func(c *gin.Context) {
		ip := c.ClientIP()
		if wait := g.wait(ip); wait > 0 {
			Abort(c, log, &model.RateLimitError{RetryAfterSeconds: int((wait + time.Second - 1) / time.Second)})
			return
		}
		got := bearer(c)
		if got == "" {
			Abort(c, log, model.ErrUnauthorized)
			return
		}
		if !auth.AdminTokenEqual(got, token) {
			g.fail(ip, c.FullPath())
			Abort(c, log, model.ErrForbidden)
			return
		}
		c.Next()
		attrs := []any{"method", c.Request.Method, "route", c.FullPath(), "status", c.Writer.Status()}
		log.Info("admin action", append(attrs, auditSubject(c)...)...)
	}
}

// auditCampaignKey holds the campaign an admin action named outside its
// path (a create names it in the body).
const auditCampaignKey = "flashsale.audit.campaign_id"

// AuditCampaign names the campaign an admin action acts on, for its audit
// line, where the route's path does not.
func AuditCampaign(c *gin.Context, campaignID string) { c.Set(auditCampaignKey, campaignID) }

// auditSubject is what an admin action acted on, as log attributes: the
// {id} of a campaign or order route, or the campaign a handler named;
// nothing for a route about neither (an empty campaign_id would read as a
// campaign whose id is "").
func auditSubject(c *gin.Context) []any {
	if id := c.GetString(auditCampaignKey); id != "" {
		return []any{"campaign_id", id}
	}
	id := c.Param("id")
	switch route := c.FullPath(); {
	case id == "":
		return nil
	case strings.HasPrefix(route, "/admin/v1/campaigns/:id"):
		return []any{"campaign_id", id}
	case strings.HasPrefix(route, "/admin/v1/orders/:id"):
		return []any{"order_id", id}
	}
	return []any{"id", id}
}

const (
	// failureWindow is the period admin failures are counted over.
	failureWindow = time.Minute
	// maxFailingIPs bounds the addresses tracked at once. Beyond it, the
	// failures of untracked addresses share one count: a guesser with more
	// addresses than that is throttled as one (and so, while it lasts, is
	// an admin at a new address).
	maxFailingIPs = 10_000
	// maxFailureLogs bounds the failure lines logged per window; the rest
	// are counted in the next line.
	maxFailureLogs = 20
)

// adminGuard counts failed admin authentications per client IP in fixed
// windows of a minute.
type adminGuard struct {
	log *slog.Logger
	max int
	now func() time.Time

	mu  sync.Mutex
	ips map[string]*failures
	// The log's own window: lines logged in it, and failures not logged
	// since the last line.
	logSince time.Time
	logged   int
	unlogged int
}

// failures are one address's failures in the window that began at since.
type failures struct {
	since time.Time
	n     int
}

func newAdminGuard(log *slog.Logger, max int, now func() time.Time) *adminGuard {
	return &adminGuard{log: log, max: max, now: now, ips: map[string]*failures{}}
}

// key is what ip's failures are counted under: ip itself, or "" (shared)
// when ip is not tracked and no room is left.
func (g *adminGuard) key(ip string) string {
	if _, ok := g.ips[ip]; ok || len(g.ips) < maxFailingIPs-1 { // one left for ""
		return ip
	}
	return ""
}

// wait returns how long ip is refused for, 0 when it may try.
func (g *adminGuard) wait(ip string) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.ips[g.key(ip)]
	if f == nil || f.n < g.max {
		return 0
	}
	return max(f.since.Add(failureWindow).Sub(g.now()), 0)
}

// fail counts a wrong token from ip on route.
func (g *adminGuard) fail(ip, route string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if len(g.ips) >= maxFailingIPs {
		for k, f := range g.ips {
			if now.Sub(f.since) >= failureWindow {
				delete(g.ips, k)
			}
		}
	}
	k := g.key(ip)
	f := g.ips[k]
	if f == nil || now.Sub(f.since) >= failureWindow {
		f = &failures{since: now}
		g.ips[k] = f
	}
	f.n++
	// One line when an address starts failing and one when it is
	// throttled, so a guesser cannot flood the log either.
	switch f.n {
	case g.max:
		g.logf(now, "admin authentication throttled", "client_ip", ip, "route", route, "failures", f.n, "window", failureWindow)
	case 1:
		g.logf(now, "admin authentication failed", "client_ip", ip, "route", route)
	default:
		g.unlogged++
	}
}

// logf logs a failure line unless maxFailureLogs lines were logged in the
// last window already.
func (g *adminGuard) logf(now time.Time, msg string, args ...any) {
	if now.Sub(g.logSince) >= failureWindow {
		g.logSince, g.logged = now, 0
	}
	if g.logged >= maxFailureLogs {
		g.unlogged++
		return
	}
	g.logged++
	g.log.Warn(msg, append(args, "failures_not_logged", g.unlogged)...)
	g.unlogged = 0
}
