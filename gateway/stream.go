package gateway

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/model"
)

const (
	// maxStatsStreams bounds the admin stats streams one process serves at
	// once: each reads Redis and MySQL every second.
	maxStatsStreams = 16
	// maxStatsStreamsPerIP bounds those of one client address, so one
	// token holder (or a page left open in many tabs) cannot take them
	// all from the console elsewhere.
	maxStatsStreamsPerIP = 4
	// statsInterval is how often a stream sends the campaign's stats.
	statsInterval = time.Second
	// statsStreamLifetime ends a stream the client will open again, so a
	// forgotten tab does not hold a slot for ever.
	statsStreamLifetime = 10 * time.Minute
	// statsWriteWait replaces http.write_timeout, which would cut the
	// stream, for each event.
	statsWriteWait = 10 * time.Second
)

// StatsStream serves GET /admin/v1/campaigns/{id}/stream: the campaign's
// stats as server-sent events, one a second, so the admin console watches
// a sale over one request instead of polling.
type StatsStream struct {
	log      *slog.Logger
	svc      *Service
	slots    chan struct{}
	stopping func() bool

	mu   sync.Mutex
	byIP map[string]int // open streams per client address
}

// NewStatsStream returns the stream over svc; stopping reports the process
// is shutting down, which ends every stream within a second (the server's
// graceful shutdown would otherwise wait for them).
func NewStatsStream(log *slog.Logger, svc *Service, stopping func() bool) *StatsStream {
	return &StatsStream{log: log, svc: svc, slots: make(chan struct{}, maxStatsStreams), stopping: stopping, byIP: map[string]int{}}
}

// Register mounts the stream; admin is the admin-token middleware.
func (s *StatsStream) Register(r gin.IRouter, admin gin.HandlerFunc) {
	r.GET("/admin/v1/campaigns/:id/stream", admin, s.serve)
}

// statsEvent is one event: the stats route's answer and when it was read,
// from which the console derives rates.
type statsEvent struct {
	At time.Time `json:"at"`
	statsResponse
}

func (s *StatsStream) serve(c *gin.Context) {
	ip := c.ClientIP()
	if !s.enter(ip) {
		httpapi.Abort(c, s.log, model.ErrTooManyConns)
		return
	}
	defer s.leave(ip)
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		httpapi.Abort(c, s.log, model.ErrTooManyConns)
		return
	}
	ctx := c.Request.Context()
	id := c.Param("id")
	// The first read answers like the stats route: an unknown campaign is
	// a 404, not an empty stream.
	st, err := s.svc.Stats(ctx, id)
	if err != nil {
		httpapi.Abort(c, s.log, err)
		return
	}
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // a proxy must pass each event on
	c.Status(http.StatusOK)
	rc := http.NewResponseController(c.Writer)
	end := time.NewTimer(statsStreamLifetime)
	defer end.Stop()
	tick := time.NewTicker(statsInterval)
	defer tick.Stop()
	for {
		if err := s.send(c, rc, st, err); err != nil {
			return // the client went
		}
		select {
		case <-ctx.Done():
			return
		case <-end.C:
			return
		case <-tick.C:
		}
		if s.stopping() {
			return
		}
		st, err = s.svc.Stats(ctx, id)
	}
}

// enter counts a stream of ip in, unless ip holds maxStatsStreamsPerIP.
func (s *StatsStream) enter(ip string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byIP[ip] >= maxStatsStreamsPerIP {
		return false
	}
	s.byIP[ip]++
	return true
}

func (s *StatsStream) leave(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byIP[ip]--; s.byIP[ip] <= 0 {
		delete(s.byIP, ip)
	}
}

// send writes one event: the stats, or, when they could not be read
// (Redis down), an "error" event with the error's code; the stream goes on.
func (s *StatsStream) send(c *gin.Context, rc *http.ResponseController, st CampaignStats, readErr error) error {
	var body []byte
	event := ""
	if readErr != nil {
		if ctxErr := c.Request.Context().Err(); ctxErr != nil {
			return ctxErr
		}
		_, errBody := httpapi.Classify(readErr)
		if !errors.Is(readErr, model.ErrUnavailable) {
			s.log.Error("admin stats stream", "campaign_id", c.Param("id"), "err", readErr)
		}
		event = "event: error\n"
		body, _ = json.Marshal(gin.H{"code": errBody.Code})
	} else {
		body, _ = json.Marshal(statsEvent{At: time.Now().UTC(), statsResponse: toStatsResponse(st)})
	}
	_ = rc.SetWriteDeadline(time.Now().Add(statsWriteWait))
	if _, err := c.Writer.WriteString(event + "data: " + string(body) + "\n\n"); err != nil {
		return err
	}
	return rc.Flush()
}

func toStatsResponse(st CampaignStats) statsResponse {
	r := statsResponse{Stock: st.Store.Stock, Remaining: st.Store.Remaining, Sold: st.Store.Sold,
		SoldOut: st.Store.SoldOut, Preloaded: st.Store.Loaded, Admitted: st.Store.Admitted, Queued: st.Store.Queued(), Lost: st.Store.Lost,
		FinishedByStatus: st.Store.FinishedByStatus, OrdersInDB: st.OrdersInDB, UnitsInDB: st.UnitsInDB,
		DecidedIn: "redis"}
	if st.InMySQL {
		r.DecidedIn = "mysql"
	}
	return r
}
