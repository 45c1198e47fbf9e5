// Package lifecycle moves orders after the click: payment, cancellation,
// expiry and refund, and gives the units of an order that ends without a
// sale back to the shoppers still waiting. The gateway (shopper, admin and
// webhook routes) and the worker (expiry messages, the sweeper) both use
// it; it speaks model types only, through the small interfaces below.
//
// Every step runs in one order: the MySQL transition decides (a conditional
// UPDATE, so of two instances racing exactly one moves the order); the
// Redis release follows (idempotent per order id); the order is marked
// returned last. A crash between two steps leaves an order that Sweep
// finds and completes, so a unit is never returned twice and never stuck.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/model"
)

// Orders is the durable ledger: orders, their transitions and the
// sweeper's queries (sqlstore.DB).
type Orders interface {
	Order(ctx context.Context, orderID string) (model.Order, error)
	TransitionOrder(ctx context.Context, orderID string, from, to model.OrderStatus, now time.Time) (bool, error)
	DuePending(ctx context.Context, before time.Time, limit int) ([]model.Order, error)
	Unreturned(ctx context.Context, limit int) ([]model.Order, error)
	MarkReturned(ctx context.Context, orderID string) error
	// ReturnUnits gives a final order's units back to its campaign's
	// count in MySQL, once, while MySQL decides the campaign (degraded
	// mode), and marks the order returned; model.ErrLedgerMoved while
	// Redis decides it.
	ReturnUnits(ctx context.Context, orderID string) (returned bool, err error)
	UserOrders(ctx context.Context, userID, cursor string, limit int) ([]model.Order, string, error)
	CampaignOrderPage(ctx context.Context, campaignID string, status model.OrderStatus, cursor string, limit int) ([]model.Order, string, error)
}

// Payments records what providers report (sqlstore.DB). RecordPayment of
// a succeeded payment also pays its order, or stores the payment
// refund_required when the order is no longer pending.
type Payments interface {
	RecordPayment(ctx context.Context, p model.Payment) (stored model.Payment, created bool, err error)
	Payments(ctx context.Context, status model.PaymentStatus, cursor string, limit int) ([]model.Payment, string, error)
}

// Campaigns reads a campaign (sqlstore.DB): a refund gives units back only
// while its sale is open.
type Campaigns interface {
	Campaign(ctx context.Context, id string) (model.Campaign, error)
}

// Stock is the sale's projection in Redis (store.Store): Release gives an
// order's units back, once per order id, and StockReturned tells every
// gateway to drop its sold-out flag.
type Stock interface {
	Release(ctx context.Context, campaignID, orderID, userID string, units int64) (released bool, err error)
	StockReturned(ctx context.Context, campaignID string) error
}

// DB is what the service needs of the relational store.
type DB interface {
	Orders
	Payments
	Campaigns
}

// ProviderFake is the built-in payment provider: Pay completes the payment
// at once through the webhook path, so the whole lifecycle runs without a
// real provider (the embedded default, tests, load tests).
const ProviderFake = "fake"

// Options configures the service. Zero fields take the defaults below.
type Options struct {
	// Provider names the payment provider; ProviderFake is the one built
	// in. With another, Pay only says what to pay and the provider's
	// webhook completes the payment.
	Provider string
	// WebhookSecret (config payment.webhook_secret) signs webhooks. Empty
	// refuses every webhook.
	WebhookSecret string
	// Tolerance is how far a webhook's timestamp may be from now: 5m.
	Tolerance time.Duration
	// Grace is how long past an order's expiry the sweeper leaves it to the
	// expiry message before expiring it itself: 30s.
	Grace time.Duration
	// SweepBatch is how many orders one sweeper query reads: 500.
	SweepBatch int
	// LatePayments, when set, counts the payments recorded refund_required
	// (once per payment, however often the provider repeats it).
	LatePayments prometheus.Counter
	// Now is the clock: time.Now.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.Tolerance <= 0 {
		o.Tolerance = 5 * time.Minute
	}
	if o.Grace <= 0 {
		o.Grace = 30 * time.Second
	}
	if o.SweepBatch <= 0 {
		o.SweepBatch = 500
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Service runs the order lifecycle.
type Service struct {
	db    DB
	stock Stock
	opts  Options
	log   *slog.Logger
}

// New returns a Service on db and stock.
func New(db DB, stock Stock, opts Options, log *slog.Logger) *Service {
	return &Service{db: db, stock: stock, opts: opts.withDefaults(), log: log}
}

// Listing limits: a page holds DefaultPage items unless asked for up to
// MaxPage.
const (
	DefaultPage = 20
	MaxPage     = 100
)

func pageLimit(limit int) (int, error) {
	switch {
	case limit == 0:
		return DefaultPage, nil
	case limit < 0 || limit > MaxPage:
		return 0, model.Invalid("limit", fmt.Sprintf("must be between 1 and %d", MaxPage))
	}
	return limit, nil
}

// Order returns a shopper's order; anyone else's, like an unknown one, is
// model.ErrNotFound.
func (s *Service) Order(ctx context.Context, userID, orderID string) (model.Order, error) {
	if !model.ValidOrderID(orderID) {
		return model.Order{}, fmt.Errorf("order %q: %w", orderID, model.ErrNotFound)
	}
	o, err := s.db.Order(ctx, orderID)
	if err != nil {
		return model.Order{}, err
	}
	if o.UserID != userID {
		return model.Order{}, fmt.Errorf("order %s: %w", orderID, model.ErrNotFound)
	}
	return o, nil
}

// UserOrders lists a shopper's orders newest first; cursor is "" or the
// next cursor of the page before, limit 0 means DefaultPage.
func (s *Service) UserOrders(ctx context.Context, userID, cursor string, limit int) ([]model.Order, string, error) {
	limit, err := pageLimit(limit)
	if err != nil {
		return nil, "", err
	}
	return s.db.UserOrders(ctx, userID, cursor, limit)
}

// CampaignOrders lists a campaign's orders newest first, those in status
// only unless it is "" (admin).
func (s *Service) CampaignOrders(ctx context.Context, campaignID string, status model.OrderStatus, cursor string, limit int) ([]model.Order, string, error) {
	if status != "" && !status.Valid() {
		return nil, "", model.Invalid("status", "unknown order status "+string(status))
	}
	limit, err := pageLimit(limit)
	if err != nil {
		return nil, "", err
	}
	if !model.ValidCampaignID(campaignID) {
		return nil, "", fmt.Errorf("campaign %q: %w", campaignID, model.ErrNotFound)
	}
	return s.db.CampaignOrderPage(ctx, campaignID, status, cursor, limit)
}

// Payments lists payments newest first, those in status only unless it is
// "" (admins list refund_required).
func (s *Service) Payments(ctx context.Context, status model.PaymentStatus, cursor string, limit int) ([]model.Payment, string, error) {
	if status != "" && !status.Valid() {
		return nil, "", model.Invalid("status", "unknown payment status "+string(status))
	}
	limit, err := pageLimit(limit)
	if err != nil {
		return nil, "", err
	}
	return s.db.Payments(ctx, status, cursor, limit)
}

// Cancel cancels a shopper's pending order and gives its units back.
// Another shopper's order is model.ErrNotFound; one no longer pending is
// model.ErrNotCancellable, except one already cancelled, which is
// returned as it is (a retried cancel succeeds).
func (s *Service) Cancel(ctx context.Context, userID, orderID string) (model.Order, error) {
	o, err := s.Order(ctx, userID, orderID)
	if err != nil {
		return model.Order{}, err
	}
	o, err = s.transition(ctx, o, model.OrderPendingPayment, model.OrderCancelled, s.opts.Now())
	if errors.Is(err, errLost) {
		return model.Order{}, fmt.Errorf("cancel order %s (%s): %w", orderID, o.Status, model.ErrNotCancellable)
	}
	return o, err
}

// Refund moves a paid order to refunded (admin). Its units go back on sale
// only while the campaign's sale is open. An order not paid is
// model.ErrNotRefundable, except one already refunded, which is returned
// as it is.
func (s *Service) Refund(ctx context.Context, orderID string) (model.Order, error) {
	if !model.ValidOrderID(orderID) {
		return model.Order{}, fmt.Errorf("order %q: %w", orderID, model.ErrNotFound)
	}
	o, err := s.db.Order(ctx, orderID)
	if err != nil {
		return model.Order{}, err
	}
	o, err = s.transition(ctx, o, model.OrderPaid, model.OrderRefunded, s.opts.Now())
	if errors.Is(err, errLost) {
		return model.Order{}, fmt.Errorf("refund order %s (%s): %w", orderID, o.Status, model.ErrNotRefundable)
	}
	return o, err
}

// Expire expires an order whose payment window has passed at now and gives
// its units back, and returns the order as it stands. It is what an expiry
// message runs, so it may come more than once, early or late: an order
// still pending but not due yet is returned unchanged (the caller schedules
// it again for its ExpiresAt); one paid or cancelled meanwhile is returned
// as it is; one already in a final state has any release it lacks
// completed (a redelivery after a crash). An order stored without an
// expiry (before payment windows existed) never expires. An unknown order
// is model.ErrNotFound.
func (s *Service) Expire(ctx context.Context, orderID string, now time.Time) (model.Order, error) {
	o, err := s.db.Order(ctx, orderID)
	if err != nil {
		return model.Order{}, err
	}
	if o.Status == model.OrderPendingPayment && (o.ExpiresAt.IsZero() || now.Before(o.ExpiresAt)) {
		return o, nil
	}
	o, err = s.transition(ctx, o, model.OrderPendingPayment, model.OrderExpired, now)
	if errors.Is(err, errLost) {
		return o, nil // paid or cancelled in time
	}
	return o, err
}

// errLost: the order is not in the state a transition starts from.
var errLost = errors.New("order not in the transition's state")

// transition moves o from one state to another and releases its units when
// it ends. When o is already in to (a retry, or another instance won), it
// completes any release the order lacks instead. When it is in neither, it
// returns o as it stands with errLost; whoever moved it releases it, or
// the sweeper does.
func (s *Service) transition(ctx context.Context, o model.Order, from, to model.OrderStatus, now time.Time) (model.Order, error) {
	if o.Status == from {
		moved, err := s.db.TransitionOrder(ctx, o.ID, from, to, now)
		if err != nil {
			return model.Order{}, err
		}
		if moved {
			o.Status, o.UpdatedAt = to, now
		} else if o, err = s.db.Order(ctx, o.ID); err != nil { // another instance moved it first
			return model.Order{}, err
		}
	}
	if o.Status != to {
		return o, errLost
	}
	if err := s.release(ctx, &o, now); err != nil {
		return model.Order{}, err
	}
	return o, nil
}

// release gives a final order's units back and marks it returned, unless
// it is marked already. A refund after the sale closed gives nothing back.
// A campaign whose stock is not in Redis has nothing to give back to: its
// state is rebuilt from MySQL, where this order no longer holds units. One
// that MySQL decides (degraded mode) gets them back in MySQL; Redis is
// rebuilt from MySQL before it decides the campaign again.
func (s *Service) release(ctx context.Context, o *model.Order, now time.Time) error {
	if o.Returned || !o.Status.Final() {
		return nil
	}
	back := true
	if o.Status == model.OrderRefunded {
		c, err := s.db.Campaign(ctx, o.CampaignID)
		if err != nil {
			return fmt.Errorf("release order %s: %w", o.ID, err)
		}
		back = now.Before(c.EndAt)
	}
	if back {
		switch _, err := s.db.ReturnUnits(ctx, o.ID); {
		case err == nil:
			o.Returned = true
			return nil
		case !errors.Is(err, model.ErrLedgerMoved):
			return err
		}
		released, err := s.stock.Release(ctx, o.CampaignID, o.ID, o.UserID, o.Quantity)
		switch {
		case errors.Is(err, model.ErrNotLoaded):
			s.log.Warn("release of an order whose campaign is not loaded", "campaign_id", o.CampaignID, "order_id", o.ID)
		case err != nil:
			return err
		case released:
			// Best effort: gateways also re-read the sold-out flag, which
			// Release cleared.
			if err := s.stock.StockReturned(ctx, o.CampaignID); err != nil {
				s.log.Warn("publish stock returned", "campaign_id", o.CampaignID, "err", err)
			}
		}
	}
	if err := s.db.MarkReturned(ctx, o.ID); err != nil {
		return err
	}
	o.Returned = true
	return nil
}

// Sweep expires the pending orders whose window closed more than the grace
// ago (their expiry message was lost, or its consumer is down), then
// completes every release a crash interrupted. It stops at the first error;
// what it did not reach, the next Sweep does.
func (s *Service) Sweep(ctx context.Context, now time.Time) (model.Swept, error) {
	var out model.Swept
	for {
		due, err := s.db.DuePending(ctx, now.Add(-s.opts.Grace), s.opts.SweepBatch)
		if err != nil {
			return out, err
		}
		for _, o := range due {
			_, err := s.transition(ctx, o, model.OrderPendingPayment, model.OrderExpired, now)
			switch {
			case err == nil:
				out.Expired++
			case !errors.Is(err, errLost): // errLost: paid or cancelled since the query
				return out, fmt.Errorf("sweep order %s: %w", o.ID, err)
			}
		}
		if len(due) < s.opts.SweepBatch || ctx.Err() != nil {
			break
		}
	}
	for {
		open, err := s.db.Unreturned(ctx, s.opts.SweepBatch)
		if err != nil {
			return out, err
		}
		for _, o := range open {
			if err := s.release(ctx, &o, now); err != nil {
				return out, fmt.Errorf("sweep order %s: %w", o.ID, err)
			}
			out.Released++
		}
		if len(open) < s.opts.SweepBatch || ctx.Err() != nil {
			break
		}
	}
	return out, ctx.Err()
}
