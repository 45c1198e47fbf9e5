package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

// An unpaid order expires twice over: a message scheduled when the order is
// stored comes back when its payment window ends (Options.Expiry, consumed
// by Expiry.Run), and the sweeper's expiry sweep expires from MySQL
// whatever is still pending a grace later (Expiry.SweepTask), so a lost,
// dead or never-scheduled message cannot hold stock. The lifecycle's
// transitions are conditional and its release idempotent per order, so both
// at once return the units once.

// expiryMessage is the expiry message of an order: its id is the order id
// (the idempotency key), its key the campaign.
func expiryMessage(o model.Order) queue.Message {
	return queue.Message{ID: o.ID, Key: o.CampaignID, Body: []byte(o.ID)}
}

// scheduleExpiry publishes the expiry message of each order, delayed until
// its ExpiresAt, one call per campaign (its orders share a window). A
// failure is logged, not returned: the orders are stored, and the sweeper
// expires what has no message.
func (w *Worker) scheduleExpiry(ctx context.Context, orders []model.Order, now time.Time) {
	dp, ok := w.opts.Expiry.(queue.DelayPublisher)
	if !ok {
		return
	}
	for start := 0; start < len(orders); {
		end := start + 1
		for end < len(orders) && orders[end].CampaignID == orders[start].CampaignID {
			end++
		}
		msgs := make([]queue.Message, end-start)
		for i, o := range orders[start:end] {
			msgs[i] = expiryMessage(o)
		}
		campaign := orders[start].CampaignID
		if err := dp.PublishDelayed(ctx, w.opts.ExpiryTopic, orders[start].ExpiresAt.Sub(now), msgs...); err != nil {
			w.log.Warn("schedule order expiry failed; the sweeper expires them", "campaign_id", campaign, "count", len(msgs), "err", err)
		}
		start = end
	}
}

// Lifecycle is what expiry needs of the order lifecycle (lifecycle.Service).
type Lifecycle interface {
	Expire(ctx context.Context, orderID string, now time.Time) (model.Order, error)
	Sweep(ctx context.Context, now time.Time) (model.Swept, error)
}

// ExpiryOptions tune Expiry.
type ExpiryOptions struct {
	// Topic is the expiry topic (config queue.expiry_topic).
	Topic string
	// Publisher re-delays a message that came before its order was due
	// (a delay the driver rounded down), when it is a queue.DelayPublisher.
	Publisher queue.Publisher
	// MaxAttempts is how many deliveries a message gets before it is
	// dropped, logged, and left to the sweeper. Default 10.
	MaxAttempts int
	// Now is the clock: time.Now.
	Now func() time.Time
}

// Expiry expires orders whose payment window has passed: it consumes the
// expiry topic and sweeps the ledger for what the messages missed.
type Expiry struct {
	log    *slog.Logger
	orders Lifecycle
	opts   ExpiryOptions
}

// NewExpiry returns an Expiry on orders.
func NewExpiry(log *slog.Logger, orders Lifecycle, opts ExpiryOptions) *Expiry {
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 10
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Expiry{log: log, orders: orders, opts: opts}
}

// Run consumes the expiry topic until ctx ends.
func (e *Expiry) Run(ctx context.Context, c queue.Consumer) error {
	if err := c.Consume(ctx, e.opts.Topic, e.Handle); err != nil {
		return fmt.Errorf("consume %s: %w", e.opts.Topic, err)
	}
	return nil
}

// Handle is the queue.Handler of the expiry topic. Each message expires its
// order if the order is still pending and due; one paid, cancelled or
// expired meanwhile, or unknown, is done with. One still pending but not
// due yet is published again, delayed for the rest of its window. An error
// has the batch redelivered: Expire is idempotent.
func (e *Expiry) Handle(ctx context.Context, msgs []queue.Message) error {
	now := e.opts.Now()
	for _, m := range msgs {
		o, err := e.orders.Expire(ctx, m.ID, now)
		switch {
		case errors.Is(err, model.ErrNotFound):
			continue
		case err != nil && m.Attempt >= e.opts.MaxAttempts:
			e.log.Error("expiry given up after repeated failures; the sweeper expires the order", "order_id", m.ID, "err", err)
			continue
		case err != nil:
			return fmt.Errorf("expire order %s: %w", m.ID, err)
		case o.Status != model.OrderPendingPayment || o.ExpiresAt.IsZero():
			continue
		}
		if err := e.delay(ctx, m, o.ExpiresAt.Sub(now)); err != nil {
			return err
		}
	}
	return nil
}

// delay publishes m again, due in d.
func (e *Expiry) delay(ctx context.Context, m queue.Message, d time.Duration) error {
	dp, ok := e.opts.Publisher.(queue.DelayPublisher)
	if !ok {
		e.log.Warn("expiry message came early and cannot be delayed; the sweeper expires the order", "order_id", m.ID)
		return nil
	}
	if err := dp.PublishDelayed(ctx, e.opts.Topic, d, m); err != nil {
		return fmt.Errorf("delay expiry of order %s: %w", m.ID, err)
	}
	return nil
}

// SweepTask returns the expiry sweep, the sweeper's task that runs the
// lifecycle's sweep every interval: it expires the orders still pending
// past their window and the grace, and completes releases a crash
// interrupted.
func (e *Expiry) SweepTask(interval time.Duration) Task {
	return Task{Name: "expiry sweep", First: interval, Every: interval, Run: func(ctx context.Context, log *slog.Logger) error {
		sw, err := e.orders.Sweep(ctx, e.opts.Now())
		if err == nil && sw != (model.Swept{}) {
			log.Info("swept orders", "expired", sw.Expired, "released", sw.Released)
		}
		return err
	}}
}
