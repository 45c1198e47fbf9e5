// Package notifier tells shoppers how their purchase requests ended: it pushes
// each final result over WebSocket and serves the poll endpoint. It reads
// results from the Redis store, and from MySQL (Ledger) what Redis cannot
// tell, and never writes orders.
//
// A sharded Redis subscription per campaign that a local shopper waits on
// (feeds.go) feeds a hub that fans results out to the local connections by
// request id. Redis pub/sub loses messages while it reconnects, so
// subscriptions also re-read the stored result: once when they are made
// (after registering in the hub and subscribing to the campaign, so nothing
// slips between the two), after the campaign's channel was subscribed again,
// and periodically while they wait. While Redis is unavailable, the results
// MySQL decided answer polls, subscriptions and the periodic re-read.
package notifier

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/requestid"
	"github.com/flashsale/flashsale/model"
)

// ResultSource is what the notifier reads: stored results and the stream of
// published final results. *store.Store implements it.
type ResultSource interface {
	// Result returns the stored result of a request, or an error wrapping
	// model.ErrNotFound.
	Result(ctx context.Context, requestID string) (model.Result, error)
	// Results returns the stored results of requestIDs, in their order, in
	// one round trip; an unknown or malformed id has the zero Result (empty
	// Status) at its place. An error means no result was read.
	Results(ctx context.Context, requestIDs []string) ([]model.Result, error)
	// SubscribeResults calls fn for every result published for tag (a
	// campaign id, or a bucket's tag: model.TagOfRequest) until ctx ends,
	// calling ready each time the subscription is confirmed (results
	// published before a confirmation are missed). It returns an error
	// when the subscription fails or the server ends it.
	SubscribeResults(ctx context.Context, tag string, ready func(), fn func(model.Result)) error
	// Progress returns the queue progress of each campaign, in order, in
	// one round trip.
	Progress(ctx context.Context, campaignIDs []string) ([]model.QueueProgress, error)
}

// Ledger is where the notifier reads what Redis cannot tell: the results
// MySQL holds as decided. Redis may have lost a success whose order is
// stored (wiped, failed over), and while Redis is down MySQL decides
// (issue 28); either way MySQL's decision stands. *sqlstore.DB implements
// it.
type Ledger interface {
	// Decided returns what MySQL holds as decided for requestIDs: a
	// success for each whose order is stored, or a refusal decided in
	// MySQL. Ids it knows nothing of are missing from the map.
	Decided(ctx context.Context, requestIDs []string) (map[string]model.Result, error)
}

// LostRequests finishes a request neither Redis nor the Ledger knows:
// Redis lost its state. *store.Store implements it (lost.lua).
type LostRequests interface {
	// Lost returns the result that stands for requestID: a final
	// rejected result (model.ReasonLost) of userID, stored now, once the
	// queue has passed the request (a request admitted grace after it was
	// decided, or the sale ended maxDelay ago); a queued result of userID,
	// with nothing stored, until then; or the result stored meanwhile. An
	// id its campaign (loaded in Redis) cannot have issued wraps
	// model.ErrNotFound.
	Lost(ctx context.Context, requestID, userID string, grace, maxDelay time.Duration) (model.Result, error)
}

// Restorer rebuilds a campaign Redis lost from MySQL
// (reconcile.Restorer).
type Restorer interface {
	// NeedsRestore reports whether Redis lost campaign id: it was loaded,
	// its sale is not over, and Redis lacks its current load. c is the
	// campaign as MySQL holds it, zero when MySQL has none.
	NeedsRestore(ctx context.Context, id string) (c model.Campaign, lost bool, err error)
	// RestoreInBackground rebuilds campaign id from MySQL without
	// waiting, at most one attempt per campaign at a time in this process.
	RestoreInBackground(ctx context.Context, id, trigger string, rebuilt func())
}

// Options tunes the WebSocket side. Zero values take the defaults.
type Options struct {
	// Ledger, when set, answers for a request Redis has no result for
	// with what MySQL decided (unstored), and, while Redis is unavailable,
	// polls, subscriptions and the re-check with the results MySQL
	// decided. Nil: such a request is not found, and nothing is answered
	// while Redis is down.
	Ledger Ledger
	// Lost, when set with Ledger, answers for a request neither Redis nor
	// the Ledger knows (unstored): rejected (lost) once the queue has
	// passed it, queued until then, so a request id the server issued is
	// never unknown while its campaign is kept. Grace and MaxQueueDelay
	// are the worker's (worker.not_enqueued_grace, worker.max_queue_delay),
	// the rule's bounds.
	Lost          LostRequests
	Grace         time.Duration
	MaxQueueDelay time.Duration
	// Restorer, when set with Lost, rebuilds a campaign Redis lost that a
	// poll or subscribe finds missing; its requests read queued meanwhile,
	// not unknown. Nil: they are not found until a purchase or a worker
	// restores the campaign.
	Restorer Restorer
	// Issuer, when set, holds the gateways' request id key: the lost rule
	// answers only ids issued to the asking user, so a forged id is not
	// stored or counted as lost, nor another user's id claimed. Nil: the
	// lost rule answers any id its campaign may have issued.
	Issuer *requestid.Issuer

	// AllowedOrigins lists the Origin values a WebSocket upgrade may carry.
	// Empty allows only the request's own host; "*" allows any origin.
	// Requests without an Origin header (non-browser clients) are allowed.
	AllowedOrigins []string
	// MaxSubscriptionsPerConn caps the request ids one connection waits on
	// (default 256).
	MaxSubscriptionsPerConn int
	// SendBuffer is how many messages may queue for one connection before
	// the client counts as slow and is dropped (default 64).
	SendBuffer int
	// WriteTimeout bounds every write to a client (default 5s).
	WriteTimeout time.Duration
	// ReadTimeout bounds the reading of a client's frame once its first
	// bytes came (default 5s); a client that sends part of a frame and
	// stalls is disconnected.
	ReadTimeout time.Duration
	// PingInterval is the time between pings (default 20s); a client that
	// answers no ping for 2.5 intervals is disconnected.
	PingInterval time.Duration
	// ReadLimit is the largest frame a client may send (default 4096 bytes).
	ReadLimit int64
	// RecheckInterval is how often waiting subscriptions re-read their stored
	// result, to recover results whose publication was lost (default 1s).
	RecheckInterval time.Duration
	// ProgressInterval is how often waiting subscriptions get a progress
	// frame with their queue position (default 1s).
	ProgressInterval time.Duration

	// MaxConnsPerUser caps one user's open WebSockets (default 8) and
	// MaxConnsPerIP one client address's (default 256); an upgrade beyond
	// either is refused with 429 too_many_connections.
	MaxConnsPerUser int
	MaxConnsPerIP   int
	// MaxConns caps the process's open WebSockets (default 10,000), so they
	// cannot take the descriptors plain HTTP and /healthz need; an upgrade
	// beyond it is refused with 503 unavailable. cmd/flashsale derives it
	// from the descriptor limit.
	MaxConns int
	// PollRate and PollBurst limit each user's polls that read Redis, per
	// second (defaults 5 and 20); beyond them a poll is 429 rate_limited. A
	// final result polled within the last second is answered from memory
	// and not counted.
	PollRate  int
	PollBurst int
	// SubscribeRate and SubscribeBurst limit the request ids each user
	// subscribes to, across all its connections, per second (defaults 20 and
	// 256): each costs a Redis read. Ids beyond them are refused with
	// rate_limited.
	//
	// A client address gets the poll and subscribe budgets of as many users
	// as it may hold sockets of users at their cap (MaxConnsPerIP /
	// MaxConnsPerUser, 32 by default), shared by every user behind it: many
	// accounts on one address cannot read Redis at many times one user's
	// rate, and a NAT of shoppers keeps room.
	SubscribeRate  int
	SubscribeBurst int

	// now is the clock of the per-user budgets and the result cache
	// (default time.Now); tests stop it to count exactly.
	now func() time.Time
	// feedLinger is how long a campaign's results subscription outlives
	// its last waiter (default feedLinger); tests shorten it.
	feedLinger time.Duration
}

// ipShare is how many users' poll and subscribe budgets one address gets.
func (o Options) ipShare() int { return max(1, o.MaxConnsPerIP/o.MaxConnsPerUser) }

func (o Options) withDefaults() Options {
	if o.MaxSubscriptionsPerConn <= 0 {
		o.MaxSubscriptionsPerConn = 256
	}
	if o.SendBuffer <= 0 {
		o.SendBuffer = 64
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 5 * time.Second
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = 5 * time.Second
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 20 * time.Second
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = 4096
	}
	if o.RecheckInterval <= 0 {
		o.RecheckInterval = time.Second
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = time.Second
	}
	if o.MaxConnsPerUser <= 0 {
		o.MaxConnsPerUser = 8
	}
	if o.MaxConnsPerIP <= 0 {
		o.MaxConnsPerIP = 256
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 10_000
	}
	if o.PollRate <= 0 {
		o.PollRate = 5
	}
	if o.PollBurst <= 0 {
		o.PollBurst = 20
	}
	if o.SubscribeRate <= 0 {
		o.SubscribeRate = 20
	}
	if o.SubscribeBurst <= 0 {
		o.SubscribeBurst = 256
	}
	if o.now == nil {
		o.now = time.Now
	}
	return o
}

const (
	// storeTimeout bounds one stored-result read.
	storeTimeout = 3 * time.Second
	// maxRecheckPerTick bounds the Redis reads of one re-check round; the
	// longest-unchecked request ids go first.
	maxRecheckPerTick = 256
	// maxInvalidFrames is the bad frame that closes a connection with a
	// policy violation: the ones before it are answered. The allowance is
	// the user's, not the connection's, so reconnecting does not renew it;
	// one frame of it comes back every invalidFrameRefill.
	maxInvalidFrames   = 20
	invalidFrameRefill = 30 * time.Second
	// resultCacheSize and resultCacheTTL bound the polled final results kept
	// in memory (see finalCache).
	resultCacheSize = 10_000
	resultCacheTTL  = time.Second
	// connRetryAfter is the Retry-After of a refused upgrade: a slot frees
	// only when a connection closes, which the server cannot predict.
	connRetryAfter = 5
	// closeGrace is how long a closing connection waits for the client's
	// close frame before dropping the TCP connection.
	closeGrace = time.Second
	// pingWriteTimeout bounds a ping written by the pinger, which serves
	// every connection in turn.
	pingWriteTimeout = time.Second
	// Resubscription backoff after the Redis subscription fails.
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// Notifier serves results to shoppers. Create it with New, mount it with
// Register, run Run for as long as it serves and call Shutdown at the end.
type Notifier struct {
	log      *slog.Logger
	src      ResultSource
	metrics  *metrics.Metrics
	opts     Options
	upgrader websocket.Upgrader
	hub      *hub
	progress progressCache
	// lastProgress is the progress loop's memory of its last round.
	lastProgress progressRound
	// progressRounds counts the progress loop's rounds (for tests).
	progressRounds atomic.Int64
	feeds          *feeds
	poller         *poller // nil: every connection reads in a goroutine of its own
	pings          *pinger
	// writersStarted counts writer goroutines started (for tests).
	writersStarted atomic.Int64
	// epoch is the origin of the connections' clocks (lastSeen, pinged).
	epoch time.Time
	// handshakeWriters lend the upgrade its buffer for the 101 response.
	handshakeWriters sync.Pool
	// life is the notifier's own context, cancelled at the end of
	// Shutdown: a WebSocket outlives its upgrade request, and the Redis
	// reads its frames cause must not end with that request's context.
	life    context.Context
	endLife context.CancelFunc
	// lookups reads the stored results subscribe frames ask for.
	lookups *lookups

	// Per-user budgets, shared by the user's connections and polls, and
	// per-address ones, shared by the users behind an address (ipShare).
	polls           *buckets
	subscribes      *buckets
	pollsPerIP      *buckets
	subscribesPerIP *buckets
	invalid         *buckets
	finals          *finalCache

	mu      sync.Mutex
	closing bool
	conns   map[*conn]struct{}
	// wg counts the open WebSockets (from enter to leave) and the
	// goroutines of their reads and writes.
	wg sync.WaitGroup
	// Open WebSockets (counted from before the upgrade) in total, per user
	// and per client IP; a count that drops to zero is deleted.
	open     int
	openUser map[string]int
	openIP   map[string]int
	// fullLogged is when the process's budget was last logged as exhausted.
	fullLogged time.Time
}

// New returns a Notifier reading from src.
func New(log *slog.Logger, src ResultSource, m *metrics.Metrics, opts Options) *Notifier {
	opts = opts.withDefaults()
	n := &Notifier{
		log:     log,
		src:     src,
		metrics: m,
		opts:    opts,
		hub:     newHub(),
		conns:   map[*conn]struct{}{},

		polls:           newBuckets(float64(opts.PollRate), opts.PollBurst),
		subscribes:      newBuckets(float64(opts.SubscribeRate), opts.SubscribeBurst),
		pollsPerIP:      newBuckets(float64(opts.PollRate*opts.ipShare()), opts.PollBurst*opts.ipShare()),
		subscribesPerIP: newBuckets(float64(opts.SubscribeRate*opts.ipShare()), opts.SubscribeBurst*opts.ipShare()),
		invalid:         newBuckets(1/invalidFrameRefill.Seconds(), maxInvalidFrames-1),
		finals:          newFinalCache(resultCacheSize, resultCacheTTL),
		openUser:        map[string]int{},
		openIP:          map[string]int{},
	}
	n.upgrader = websocket.Upgrader{
		CheckOrigin: originChecker(opts.AllowedOrigins),
		// No write buffer is held between writes.
		WriteBufferPool: &sync.Pool{},
		WriteBufferSize: writeBufferSize,
	}
	n.handshakeWriters.New = func() any { return bufio.NewWriterSize(nil, handshakeBufferSize) }
	n.hub.subscriptions = m.WebSocketSubscriptions
	n.feeds = newFeeds(n, opts.feedLinger)
	n.epoch = time.Now()
	n.life, n.endLife = context.WithCancel(context.Background())
	n.lookups = newLookups(n.life, src)
	n.pings = newPinger(opts.PingInterval/2, n.clock, n.visit)
	p, err := newPoller(n.readable)
	if err != nil {
		log.Warn("WebSocket readiness polling unavailable: one goroutine per connection", "err", err)
	}
	n.poller = p
	return n
}

// clock is the time since n.epoch, monotonic.
func (n *Notifier) clock() time.Duration { return time.Since(n.epoch) }

// visit is the pinger's call on c: a client silent for 2.5 ping intervals is
// dropped, the others are pinged once an interval. The ping is written here,
// in the pinger's goroutine, unless c's writer runs: a writer started per
// ping made every round a burst of goroutines (one per connection, their
// stacks kept by the runtime after the round). A waiting connection gets
// only pings, so its socket buffer has room and the write does not block;
// one that blocks for pingWriteTimeout is dropped as slow.
func (n *Notifier) visit(c *conn, now time.Duration) {
	if now-time.Duration(c.lastSeen.Load()) >= n.opts.PingInterval*5/2 {
		n.log.Debug("websocket silent", "user_id", c.userID)
		c.drop()
		return
	}
	c.mu.Lock()
	if c.stopped.Load() || now-c.pinged < n.opts.PingInterval-n.pings.period/4 {
		c.mu.Unlock()
		return
	}
	c.pinged = now
	if c.writing || c.dropped {
		c.pingDue = true
		n.startWriterLocked(c)
		c.mu.Unlock()
		return
	}
	c.writing = true // the pinger is c's writer for this frame
	c.mu.Unlock()
	err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(min(pingWriteTimeout, n.opts.WriteTimeout)))
	c.mu.Lock()
	c.writing = false
	if err == nil && (len(c.queue) > 0 || c.pingDue || (c.closeCode != 0 && !c.closeSent)) {
		n.startWriterLocked(c) // for what was queued meanwhile
	}
	c.mu.Unlock()
	if err != nil {
		n.log.Debug("websocket ping", "user_id", c.userID, "err", err)
		c.drop()
	}
}

// Ready reports whether Run runs and every campaign's results subscription
// could be made.
func (n *Notifier) Ready() bool { return n.feeds.healthy() }

// Run keeps the results subscriptions of the campaigns shoppers wait on
// (feeds.go) and re-checks waiting subscriptions. It returns nil when ctx
// ends.
func (n *Notifier) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { n.recheckLoop(ctx) })
	wg.Go(func() { n.memoryLoop(ctx) })
	wg.Go(func() { n.progressLoop(ctx) })
	n.feeds.run(ctx)
	wg.Wait()
	return nil
}

// published receives every result published for a subscribed campaign.
func (n *Notifier) published(r model.Result) {
	if !r.Status.Final() {
		return
	}
	n.deliver(r, n.hub.publish(r))
}

// deliver queues r for each subscription the hub handed over. It never
// blocks: a connection whose buffer is full is dropped.
func (n *Notifier) deliver(r model.Result, subs []*subscription) {
	if len(subs) == 0 {
		return
	}
	data := encodeFrame(resultFrame{Type: "result", Result: toResultBody(r)})
	for _, s := range subs {
		n.push(s.conn, outMsg{data: data, result: true}, 0)
	}
}

// Register mounts the poll endpoint behind shopper and the WebSocket
// endpoint behind wsShopper (which should accept ?access_token=).
func (n *Notifier) Register(r gin.IRouter, shopper, wsShopper func(httpapi.ShopperHandler) gin.HandlerFunc) {
	r.GET("/api/v1/purchases/:request_id", shopper(n.poll))
	r.GET("/api/v1/ws", wsShopper(n.serveWS))
}

// resultBody is a result as shoppers see it, on both channels.
type resultBody struct {
	RequestID  string       `json:"request_id"`
	CampaignID string       `json:"campaign_id"`
	Status     model.Status `json:"status"`
	Quantity   int64        `json:"quantity"`
	OrderID    string       `json:"order_id,omitempty"`
	Reason     string       `json:"reason,omitempty"`
	// Ahead and ETAMs are the queue position of a queued request in a poll
	// answer (progress.go).
	Ahead *int64 `json:"ahead,omitempty"`
	ETAMs *int64 `json:"eta_ms,omitempty"`
}

func toResultBody(r model.Result) resultBody {
	return resultBody{
		RequestID: r.RequestID, CampaignID: r.CampaignID, Status: r.Status,
		Quantity: r.Quantity, OrderID: r.OrderID, Reason: r.Reason,
	}
}

func (n *Notifier) poll(c *gin.Context, userID string) {
	r, err := n.pollResult(c.Request.Context(), userID, c.ClientIP(), c.Param("request_id"), n.opts.now())
	if err != nil {
		httpapi.Abort(c, n.log, err)
		return
	}
	if r.Status.Final() {
		n.metrics.ResultsDelivered.WithLabelValues("poll").Inc()
	}
	body := toResultBody(r)
	if ahead, eta, ok := n.position(c.Request.Context(), r); ok {
		etaMs := eta.Milliseconds()
		body.Ahead, body.ETAMs = &ahead, &etaMs
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, body)
}

// pollResult answers one poll: from the cache when the result is final and
// userID's, else from Redis within userID's poll budget and that of its
// address ip. Anyone else's id takes the same path as an unknown one.
func (n *Notifier) pollResult(ctx context.Context, userID, ip, requestID string, now time.Time) (model.Result, error) {
	if r, ok := n.finals.get(requestID, now); ok && r.UserID == userID {
		return r, nil
	}
	if got, wait := n.polls.take(userID, 1, now); got == 0 {
		return model.Result{}, &model.RateLimitError{RetryAfterSeconds: retryAfterSeconds(wait)}
	}
	if got, wait := n.pollsPerIP.take(ip, 1, now); got == 0 {
		return model.Result{}, &model.RateLimitError{RetryAfterSeconds: retryAfterSeconds(wait)}
	}
	r, err := n.lookup(ctx, userID, requestID)
	if err == nil && r.Status.Final() {
		n.finals.put(r, now)
	}
	return r, err
}

// lookup returns the stored result of requestID if userID owns it. Unknown,
// malformed and other users' ids all yield model.ErrNotFound, so ids cannot
// be probed.
func (n *Notifier) lookup(ctx context.Context, userID, requestID string) (model.Result, error) {
	if _, ok := model.CampaignOfRequest(requestID); !ok {
		return model.Result{}, fmt.Errorf("result: malformed request id: %w", model.ErrNotFound)
	}
	r, err := n.src.Result(ctx, requestID)
	switch {
	case errors.Is(err, model.ErrNotFound):
		r, err = n.unstored(ctx, userID, requestID)
	case errors.Is(err, model.ErrUnavailable) && n.opts.Ledger != nil:
		r, err = n.decidedWhileDown(ctx, requestID, err)
	}
	if err != nil {
		return model.Result{}, err
	}
	if r.UserID != userID {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	return r, nil
}

// decidedWhileDown answers for requestID when Redis could not (redisErr):
// the result MySQL decided, else redisErr, since the request may still be
// decided, in MySQL or in Redis.
func (n *Notifier) decidedWhileDown(ctx context.Context, requestID string, redisErr error) (model.Result, error) {
	found, err := n.decided(ctx, []string{requestID})
	if err != nil {
		return model.Result{}, fmt.Errorf("%w; %w", redisErr, err)
	}
	if r, ok := found[requestID]; ok {
		return r, nil
	}
	return model.Result{}, redisErr
}

// unstored answers for requestID, asked by userID, when Redis has no
// result for it: what MySQL decided (Ledger), else the lost rule's answer
// (lostRule), else model.ErrNotFound. The lost rule is asked only after
// the ledger, since a request Redis lost may have been decided.
func (n *Notifier) unstored(ctx context.Context, userID, requestID string) (model.Result, error) {
	if n.opts.Ledger == nil {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	found, err := n.decided(ctx, []string{requestID})
	if err != nil {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, err)
	}
	if r, ok := found[requestID]; ok {
		return r, nil
	}
	return n.lostRule(ctx, userID, requestID)
}

// lostRule answers for requestID, asked by userID, which neither Redis
// nor the Ledger knows (Options.Lost): rejected (lost) once the queue has
// passed it, queued until then, else model.ErrNotFound. An id not issued
// to userID (Options.Issuer) is not found before anything is read.
func (n *Notifier) lostRule(ctx context.Context, userID, requestID string) (model.Result, error) {
	if n.opts.Lost == nil || (n.opts.Issuer != nil && !n.opts.Issuer.Issued(requestID, userID)) {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	r, err := n.opts.Lost.Lost(ctx, requestID, userID, n.opts.Grace, n.opts.MaxQueueDelay)
	if errors.Is(err, model.ErrNotLoaded) {
		r, err = n.restoreLost(ctx, userID, requestID)
	}
	if err != nil && !errors.Is(err, model.ErrNotFound) {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, err)
	}
	if err == nil && r.Status == model.StatusRejected && r.Reason == model.ReasonLost && r.UserID == userID {
		// One line per request at debug: reconcile counts and lists them.
		n.log.Debug("request lost with Redis, rejected", "request_id", requestID, "campaign_id", r.CampaignID, "user_id", userID)
	}
	return r, err
}

// restoreLost answers for requestID, asked by userID, when Redis does not
// hold its campaign: if Redis lost it (Options.Restorer), a restore starts
// in the background and the request reads queued until the lost rule can
// tell; if its sale is over, what afterSale says; else (never loaded) the
// id is model.ErrNotFound. A sold-out campaign nobody buys from is noticed
// here first.
func (n *Notifier) restoreLost(ctx context.Context, userID, requestID string) (model.Result, error) {
	campaignID, _ := model.CampaignOfRequest(requestID)
	if n.opts.Restorer == nil {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	c, lost, err := n.opts.Restorer.NeedsRestore(ctx, campaignID)
	if err != nil {
		return model.Result{}, fmt.Errorf("result %s: campaign %s: %w: %w", requestID, campaignID, model.ErrUnavailable, err)
	}
	if !lost {
		return n.afterSale(c, userID, requestID)
	}
	// The Restorer logs a failure and bounds the attempts; the next poll
	// tries again.
	n.opts.Restorer.RestoreInBackground(n.life, campaignID, "poll", nil)
	return model.Result{RequestID: requestID, CampaignID: campaignID, UserID: userID, Status: model.StatusQueued}, nil
}

// afterSale answers for requestID, asked by userID, of campaign c, which
// Redis does not hold and no restore rebuilds since its sale is over
// (Redis lost it after the end, or an operator archived it), and which
// neither Redis nor MySQL decided. It reads queued until the sale ended
// MaxQueueDelay ago, when a message stored at all has come, then rejected
// (lost): what lost.lua's ended rule stores for a campaign Redis holds.
// Nothing is stored or counted here, since Redis does not hold the
// campaign; a later load of it lets lost.lua store the same. An id c
// cannot have issued to userID (never loaded, a bucket not the user's,
// admitted outside the sale) is model.ErrNotFound.
func (n *Notifier) afterSale(c model.Campaign, userID, requestID string) (model.Result, error) {
	tag, _ := model.TagOfRequest(requestID)
	at, _ := model.AdmittedAt(requestID)
	now := n.opts.now()
	if c.Epoch == 0 || now.Before(c.EndAt) || n.opts.MaxQueueDelay <= 0 || model.UserTag(c, userID) != tag ||
		at.Before(c.StartAt.Add(-model.AdmissionSkew)) || at.After(c.EndAt.Add(model.AdmissionSkew)) {
		return model.Result{}, fmt.Errorf("result %s: %w", requestID, model.ErrNotFound)
	}
	r := model.Result{RequestID: requestID, CampaignID: c.ID, UserID: userID, Status: model.StatusQueued}
	if !now.Before(c.EndAt.Add(n.opts.MaxQueueDelay)) {
		r.Status, r.Reason = model.StatusRejected, model.ReasonLost
	}
	return r, nil
}

// decided returns the final results MySQL holds for ids (Ledger.Decided).
// A MySQL that cannot answer is model.ErrUnavailable: a request may have
// been decided there, so the shopper is told to ask again rather than that
// it is unknown.
func (n *Notifier) decided(ctx context.Context, ids []string) (map[string]model.Result, error) {
	found, err := n.opts.Ledger.Decided(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("read the results of %d requests from the ledger: %w: %w", len(ids), model.ErrUnavailable, err)
	}
	for id, r := range found {
		// Only a final result is served and cached as one.
		if !r.Status.Final() {
			delete(found, id)
		}
	}
	return found, nil
}

// Shutdown refuses new WebSocket connections, closes the open ones with a
// going-away close frame and waits for them until ctx ends, when the
// remaining connections are dropped.
func (n *Notifier) Shutdown(ctx context.Context) {
	defer n.endLife()
	n.mu.Lock()
	n.closing = true
	conns := make([]*conn, 0, len(n.conns))
	for c := range n.conns {
		conns = append(conns, c)
	}
	n.mu.Unlock()
	for _, c := range conns {
		c.stop(websocket.CloseGoingAway, "server shutting down")
	}
	done := make(chan struct{})
	go func() {
		n.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		n.mu.Lock()
		conns = conns[:0]
		for c := range n.conns {
			conns = append(conns, c)
		}
		n.mu.Unlock()
		for _, c := range conns {
			c.drop()
		}
	}
	n.pings.stop()
	n.poller.close()
}

// originChecker returns the upgrader's Origin check for an allow-list.
func originChecker(allowed []string) func(*http.Request) bool {
	set := map[string]bool{}
	for _, o := range allowed {
		o = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(o), "/"))
		if o == "*" {
			return func(*http.Request) bool { return true }
		}
		if o != "" {
			set[o] = true
		}
	}
	if len(set) == 0 {
		return sameOrigin
	}
	return func(r *http.Request) bool {
		origin := r.Header["Origin"]
		return len(origin) == 0 || set[strings.ToLower(origin[0])]
	}
}

// sameOrigin is gorilla's default check, scheme included: no Origin, or an
// Origin whose host is the request's Host and whose scheme is the one the
// request came in with (https over TLS or when a proxy says so in
// X-Forwarded-Proto, else http), so a page served over plain http cannot
// open the socket of an https site. X-Forwarded-Proto needs no trusted
// proxy here: a browser's page cannot set it, and a client that is not a
// browser can send any Origin anyway.
func sameOrigin(r *http.Request) bool {
	origin := r.Header["Origin"]
	if len(origin) == 0 {
		return true
	}
	u, err := url.Parse(origin[0])
	if err != nil {
		return false
	}
	scheme := "http"
	if proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ","); r.TLS != nil || strings.EqualFold(strings.TrimSpace(proto), "https") {
		scheme = "https"
	}
	return strings.EqualFold(u.Scheme, scheme) && strings.EqualFold(u.Host, r.Host)
}
