// Package worker consumes purchase requests, decides them in batches with one
// atomic Lua call per campaign, persists successes to MySQL and publishes the
// results.
//
// The order of steps is what makes crashes safe: deduct (idempotent per
// request id) → insert orders (duplicates ignored: an order's id, its primary
// key, is derived from its request id) → raise the durable mark (a shopper
// sees a success only from then on) → publish results → acknowledge. A
// crash anywhere before the acknowledgement leads to redelivery, which
// replays the same stored results and inserts nothing twice.
//
// The deduction is the first step of a queue.PipelineHandler and the rest its
// Finish, so on a pipelining queue a partition's next batch is deducted in
// Redis while this one's orders go into MySQL. Deciding ahead is safe for the
// same reason: a batch is acknowledged only after its orders are stored, and
// a redelivered batch gets the results it was given the first time.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// Stock is what the worker needs from the Redis model.
type Stock interface {
	Deduct(ctx context.Context, campaignID string, batch []model.Deduction) (model.DeductReply, error)
	Reject(ctx context.Context, d model.Deduction, campaignID, reason string) (model.Result, error)
	// MarkDurable raises tag's durable mark to made, the highest decision
	// number of a batch decided under epoch, once its orders are stored:
	// shoppers see its successes from then on. Refused with a hold
	// (model.ErrHeld) when the tag was reloaded or lost since.
	MarkDurable(ctx context.Context, tag string, made int64, epoch model.Epoch) error
	PublishResults(ctx context.Context, results []model.Result) error
	PublishEvent(ctx context.Context, e model.Event) error
	// SweepNotEnqueued rejects the admitted requests whose message never
	// came: the not-enqueued sweep (sweeper.go).
	SweepNotEnqueued(ctx context.Context, tags []string, grace, maxDelay time.Duration) ([]model.Result, error)
	// RecoverTransfers completes stock transfers between a campaign's
	// buckets that a worker left half done.
	RecoverTransfers(ctx context.Context) error
}

// Orders is what the worker needs from the relational model: it stores
// orders, priced and timed by their campaign. InsertOrders stores orders only
// while each campaign's epoch in MySQL is the one given, model.ErrLedgerMoved
// otherwise.
type Orders interface {
	InsertOrders(ctx context.Context, orders []model.Order, epochs model.Epochs) error
	Campaigns
	// CampaignsEndingAfter lists the campaigns whose sale ends after t.
	CampaignsEndingAfter(ctx context.Context, t time.Time) ([]model.Campaign, error)
}

// Options tune the worker.
type Options struct {
	// MaxAttempts is how many deliveries a message gets before the worker
	// gives up on it and records a final rejected result. Default 10. A
	// delivery held because its campaign is not loaded or paused never
	// ends in a give-up: a request is rejected only for failing alone.
	MaxAttempts int
	// PersistAttempts and PersistBackoff bound the in-handler retries of an
	// order insert before the batch is handed back for redelivery.
	PersistAttempts int           // default 5
	PersistBackoff  time.Duration // first wait, doubled each time; default 50ms
	// AfterDeduct, when set, runs after the Lua call and before persistence.
	// Tests use it to crash the worker in the most delicate spot.
	AfterDeduct func(campaignID string, results []model.Result) error
	// Expiry schedules each stored order's expiry on ExpiryTopic (expiry.go)
	// when it is a queue.DelayPublisher; otherwise orders expire through
	// the lifecycle's sweeper.
	Expiry      queue.Publisher
	ExpiryTopic string
	// KeyRetention is how long after its sale Redis may hold a campaign
	// (redis.key_retention): the not-enqueued sweep looks at the campaigns
	// that ended less than this ago. Default 7 days.
	KeyRetention time.Duration
	// Restorer rebuilds a campaign Redis lost from MySQL (restore.go);
	// nil leaves it to an operator's preload.
	Restorer Restorer
	// Decider, when set, decides a campaign's batches in MySQL while
	// Redis does not answer (degraded.go; config degrade: mysql); nil
	// holds them until Redis is back.
	Decider Decider
	// RedisDown reports whether this process sees Redis out
	// (store.Guard.Down): with a Decider, a batch then goes to MySQL
	// without waiting for Redis's timeout first. RedisOutages counts the
	// outages this process saw begin (store.Guard.Outages): after one,
	// each campaign is checked against MySQL before Redis decides it.
	RedisDown    func() bool
	RedisOutages func() int64
}

func (o Options) withDefaults() Options {
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 10
	}
	if o.PersistAttempts <= 0 {
		o.PersistAttempts = 5
	}
	if o.PersistBackoff <= 0 {
		o.PersistBackoff = 50 * time.Millisecond
	}
	if o.KeyRetention <= 0 {
		o.KeyRetention = 7 * 24 * time.Hour
	}
	if o.RedisDown == nil {
		o.RedisDown = func() bool { return false }
	}
	if o.RedisOutages == nil {
		o.RedisOutages = func() int64 { return 0 }
	}
	return o
}

// Worker handles batches of purchase-request messages.
type Worker struct {
	log    *slog.Logger
	stock  Stock
	orders Orders
	m      *metrics.Metrics
	opts   Options
	terms  termsCache
	// degraded holds the campaigns this worker decided in MySQL.
	degraded degraded
}

// New returns a Worker.
func New(log *slog.Logger, stock Stock, orders Orders, m *metrics.Metrics, opts Options) *Worker {
	return &Worker{log: log, stock: stock, orders: orders, m: m, opts: opts.withDefaults()}
}

// Run consumes topic until ctx ends, pipelined where the consumer can.
func (w *Worker) Run(ctx context.Context, c queue.Consumer, topic string) error {
	if err := queue.ConsumePipelined(ctx, c, topic, w.Decide); err != nil {
		return fmt.Errorf("consume %s: %w", topic, err)
	}
	return nil
}

// campaignBatch is one campaign's share of a delivered batch, in arrival order.
type campaignBatch struct {
	campaignID string
	// tag is the requests' bucket's tag in a campaign of several (the
	// queue partition the gateway keyed them by), else campaignID.
	tag      string
	requests []model.PurchaseRequest
	attempts []int
	// made is the highest decision number of the successes decided
	// (model.DeductReply.Made).
	made int64
	// results are the batch's results; inMySQL says MySQL decided them
	// (degraded.go): their orders are stored already.
	results []model.Result
	inMySQL bool
}

// Decide is the queue.PipelineHandler: it decides the batch in Redis and
// returns the step that persists and publishes the results.
//
// A batch the store cannot decide now (model.ErrHeld: its campaign not in
// Redis or paused, its replicas behind) is held: nothing is decided and
// the batch comes back later. So is one whose decisions MySQL cannot take
// (Finish).
func (w *Worker) Decide(ctx context.Context, msgs []queue.Message) (queue.Finish, error) {
	batches := w.group(msgs)
	results := make([]model.Result, 0, len(msgs))
	epochs := make(model.Epochs, len(batches))
	for _, b := range batches {
		rs, err := w.decide(ctx, b, epochs)
		if err != nil {
			w.restore(ctx, err, b.campaignID)
			return nil, w.held(err)
		}
		b.results = rs
		results = append(results, rs...)
	}
	return func(ctx context.Context) error {
		err := w.finish(ctx, batches, results, epochs)
		if err != nil {
			w.restore(ctx, err, slices.Collect(maps.Keys(epochs))...)
		}
		return w.held(err)
	}, nil
}

// held marks an error of a hold (model.ErrHeld) as queue.ErrHeld, the
// queue's word for it, and counts the held batch.
func (w *Worker) held(err error) error {
	if !errors.Is(err, model.ErrHeld) {
		return err
	}
	w.m.HeldBatches.Inc()
	return fmt.Errorf("%w: %w", queue.ErrHeld, err)
}

// finish stores the successes of decided results, fenced by the epochs
// they were decided under, raises their tags' durable marks, publishes them
// all and schedules the new orders' expiry.
func (w *Worker) finish(ctx context.Context, batches []*campaignBatch, results []model.Result, epochs model.Epochs) error {
	// orders Redis decided, to store; those MySQL decided are stored.
	var orders, stored []model.Order
	inMySQL := false
	for _, b := range batches {
		if b.inMySQL {
			stored, inMySQL = append(stored, ordersOf(b.results)...), true
		} else {
			orders = append(orders, ordersOf(b.results)...)
		}
	}
	now := time.Now()
	// Both read or write MySQL, and any failure of theirs holds the batch:
	// the decisions are made and stored in Redis, so a MySQL that cannot
	// take them now holds it for as long as it takes (never given up: the
	// units are sold in Redis). A ledger that moved on (model.ErrLedgerMoved)
	// is decided again once Redis is rebuilt: by a load that runs, or by
	// the restore this starts (restore.go).
	if err := w.applyTerms(ctx, orders, now); err != nil {
		return fmt.Errorf("%w: %w", model.ErrHeld, err)
	}
	if err := w.applyTerms(ctx, stored, now); err != nil { // for their expiry only
		return fmt.Errorf("%w: %w", model.ErrHeld, err)
	}
	// Successes must be in MySQL before the batch is acknowledged: the
	// shopper may already have seen them through the poll endpoint.
	if err := w.persist(ctx, orders, epochs); err != nil {
		return fmt.Errorf("%w: %w", model.ErrHeld, err)
	}
	// Shoppers see the successes only now, and the batch is acknowledged
	// only after: a mark not raised holds it, and the redelivery raises it
	// (deduct.lua replays the same decision numbers).
	for _, b := range batches {
		if b.made == 0 {
			continue
		}
		if err := w.stock.MarkDurable(ctx, b.tag, b.made, epochs[b.campaignID]); err != nil {
			return fmt.Errorf("worker: %w: %w", model.ErrHeld, err)
		}
	}
	w.count(results)
	// Results MySQL decided while Redis is out have nowhere to go: the
	// notifiers read MySQL meanwhile.
	if !inMySQL || !w.opts.RedisDown() {
		if err := w.stock.PublishResults(ctx, results); err != nil {
			// Results are stored in Redis (or MySQL); notifiers re-read what they wait on.
			w.log.Warn("publish results", "count", len(results), "err", err)
		}
	}
	w.scheduleExpiry(ctx, append(orders, stored...), now)
	return nil
}

// ordersOf returns the orders of the successful results, nil if none, in
// the results' order (a campaign's together), without their amount and
// expiry (applyTerms sets them).
func ordersOf(results []model.Result) []model.Order {
	n := 0
	for _, r := range results {
		if r.Status == model.StatusSuccess {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	orders := make([]model.Order, 0, n)
	for _, r := range results {
		if r.Status == model.StatusSuccess {
			orders = append(orders, model.Order{ID: r.OrderID, RequestID: r.RequestID, CampaignID: r.CampaignID,
				UserID: r.UserID, Quantity: r.Quantity, Status: model.OrderPendingPayment})
		}
	}
	return orders
}

// count adds the results to the deductions counter with one label lookup
// per status rather than one per result (there are four statuses).
func (w *Worker) count(results []model.Result) {
	type tally struct {
		status model.Status
		n      int
	}
	var tallies []tally
next:
	for _, r := range results {
		for i := range tallies {
			if tallies[i].status == r.Status {
				tallies[i].n++
				continue next
			}
		}
		tallies = append(tallies, tally{status: r.Status, n: 1})
	}
	for _, t := range tallies {
		w.m.Deductions.WithLabelValues(string(t.status)).Add(float64(t.n))
	}
}

// group splits a delivered batch by campaign, keeping arrival order. A message
// that cannot be decoded was never produced by a gateway; it is dropped (and
// counted) because redelivering it can never succeed.
func (w *Worker) group(msgs []queue.Message) []*campaignBatch {
	var order []*campaignBatch
	var byCampaign map[string]*campaignBatch // made when a second campaign shows up
	var last *campaignBatch
	for _, msg := range msgs {
		req, err := model.DecodePurchaseRequest(msg.Body)
		if err != nil {
			w.m.PoisonMessages.Inc()
			w.log.Error("undecodable message dropped", "request_id", msg.ID, "err", err)
			continue
		}
		// A partition is keyed by campaign, so a batch is nearly always one
		// campaign's: the map is only needed when that is not so.
		tag, ok := model.TagOfRequest(req.RequestID)
		if c, _, _ := model.SplitTag(tag); !ok || c != req.CampaignID {
			tag = req.CampaignID
		}
		b := last
		if b == nil || b.tag != tag {
			if byCampaign == nil && last != nil {
				byCampaign = map[string]*campaignBatch{last.tag: last}
			}
			b = byCampaign[tag]
			if b == nil {
				b = &campaignBatch{campaignID: req.CampaignID, tag: tag}
				if order == nil { // sized for the usual single-campaign batch
					b.requests, b.attempts = make([]model.PurchaseRequest, 0, len(msgs)), make([]int, 0, len(msgs))
				}
				if byCampaign != nil {
					byCampaign[tag] = b
				}
				order = append(order, b)
			}
			last = b
		}
		b.requests = append(b.requests, req)
		b.attempts = append(b.attempts, msg.Attempt)
	}
	return order
}

// decide decides one campaign's share of a batch, returns the results and
// adds the epoch they were decided under to epochs. A hold (model.ErrHeld)
// is never a failure: giving up on it would store a final rejected result
// that a rebuild wipes, decide a paused sale, or reject requests for a
// replica's delay.
func (w *Worker) decide(ctx context.Context, b *campaignBatch, epochs model.Epochs) ([]model.Result, error) {
	deductions := make([]model.Deduction, len(b.requests))
	exhausted := false
	for i, r := range b.requests {
		// Derived, not drawn: a request decided again (after a load moved
		// the epoch, or lost its stored result) keeps its order id.
		deductions[i] = model.Deduction{RequestID: r.RequestID, UserID: r.UserID, Quantity: r.Quantity, OrderID: model.OrderIDOf(r.RequestID)}
		exhausted = exhausted || b.attempts[i] > w.opts.MaxAttempts
	}
	w.m.WorkerBatchSize.Observe(float64(len(deductions)))
	if w.opts.Decider != nil {
		if w.opts.RedisDown() {
			return w.decideInMySQL(ctx, b, deductions)
		}
		if outages := w.opts.RedisOutages(); w.degraded.stale(b.campaignID, outages) {
			if err := w.handBack(ctx, b.campaignID); err != nil {
				return nil, err
			}
			w.degraded.checked(b.campaignID, outages)
		}
	}
	reply, err := w.stock.Deduct(ctx, b.tag, deductions)
	if err != nil && w.degrades(err) {
		return w.decideInMySQL(ctx, b, deductions)
	}
	if err != nil {
		if errors.Is(err, model.ErrHeld) || !exhausted {
			return nil, fmt.Errorf("worker: %w", err)
		}
		return w.giveUp(ctx, b, deductions, err, epochs)
	}
	if reply.SoldOutNow {
		// Best effort: gateways also re-check the flag periodically.
		if err := w.stock.PublishEvent(ctx, model.Event{Type: model.EventSoldOut, CampaignID: b.campaignID}); err != nil {
			w.log.Warn("publish sold-out event", "campaign_id", b.campaignID, "err", err)
		}
	}
	if w.opts.AfterDeduct != nil {
		if err := w.opts.AfterDeduct(b.campaignID, reply.Results); err != nil {
			return nil, err
		}
	}
	epochs.Add(b.campaignID, reply.Epoch)
	b.made = reply.Made
	return reply.Results, nil
}

// giveUp decides each request of a batch that keeps failing on its own, so
// one poison request cannot block its campaign: a request that still fails
// alone gets a final rejected result. A hold stops it: the batch comes
// back.
//
// Requests decided one by one may be decided on both sides of a load:
// epochs then has the campaign's EpochMixed, MySQL stores nothing, and the
// batch is decided again.
func (w *Worker) giveUp(ctx context.Context, b *campaignBatch, ds []model.Deduction, cause error, epochs model.Epochs) ([]model.Result, error) {
	out := make([]model.Result, 0, len(ds))
	for _, d := range ds {
		reply, err := w.stock.Deduct(ctx, b.tag, []model.Deduction{d})
		if err == nil {
			out = append(out, reply.Results...)
			epochs.Add(b.campaignID, reply.Epoch)
			b.made = max(b.made, reply.Made)
			continue
		}
		if errors.Is(err, model.ErrHeld) {
			return nil, fmt.Errorf("worker: %w", err)
		}
		r, rerr := w.stock.Reject(ctx, d, b.tag, model.ReasonPoison)
		if rerr != nil {
			return nil, fmt.Errorf("worker: give up on %s: %w", d.RequestID, errors.Join(cause, rerr))
		}
		w.m.PoisonMessages.Inc()
		w.log.Error("request given up after repeated failures", "request_id", d.RequestID, "campaign_id", b.campaignID, "err", err)
		out = append(out, r)
	}
	return out, nil
}

// persist stores orders, retrying an insert that failed, except when the
// ledger moved on: the batch must be decided again against the rebuilt
// Redis, which a retry cannot do.
func (w *Worker) persist(ctx context.Context, orders []model.Order, epochs model.Epochs) error {
	if len(orders) == 0 {
		return nil
	}
	wait := w.opts.PersistBackoff
	var err error
	for attempt := 1; attempt <= w.opts.PersistAttempts; attempt++ {
		start := time.Now()
		if err = w.orders.InsertOrders(ctx, orders, epochs); err == nil {
			metrics.Since(w.m.PersistLatency, start)
			return nil
		}
		if errors.Is(err, model.ErrLedgerMoved) {
			w.log.Warn("orders decided before the campaign was reloaded; deciding them again", "count", len(orders), "err", err)
			return fmt.Errorf("worker: persist %d orders: %w", len(orders), err)
		}
		w.log.Warn("persist orders failed, retrying", "count", len(orders), "attempt", attempt, "err", err)
		if attempt == w.opts.PersistAttempts {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("worker: persist: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
	return fmt.Errorf("worker: persist %d orders: %w", len(orders), err)
}
