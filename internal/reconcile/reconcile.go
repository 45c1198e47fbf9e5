// Package reconcile compares a campaign's sales in Redis with its orders in
// MySQL and, for a finished campaign, repairs Redis from the order table.
//
// MySQL is the ledger. A success that Redis recorded but MySQL lacks was told
// to a shopper (guarantee 4), so repair first inserts it — unless that would
// exceed the stock — and then rebuilds Redis's counters from the orders.
package reconcile

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Redis is what reconciliation reads and writes in Redis.
type Redis interface {
	Snapshot(ctx context.Context, campaignID string) (model.Snapshot, error)
	Rebuild(ctx context.Context, campaignID string, stock int64, orders []model.Order) error
}

// Orders is what reconciliation reads and writes in MySQL.
type Orders interface {
	Campaign(ctx context.Context, id string) (model.Campaign, error)
	CampaignOrders(ctx context.Context, campaignID string) ([]model.Order, error)
	InsertOrders(ctx context.Context, orders []model.Order) error
}

// Difference is one disagreement between the two sides.
type Difference struct {
	Kind   string // see the Kind* constants
	Detail string
}

// Kinds of difference.
const (
	KindNotLoaded       = "not_loaded"        // Redis has no stock for the campaign
	KindMissingInDB     = "missing_in_db"     // a Redis success without an order row
	KindMissingInRedis  = "missing_in_redis"  // an order row without a Redis success
	KindOrderMismatch   = "order_mismatch"    // both have it, with different order ids or quantities
	KindSoldMismatch    = "sold_mismatch"     // Redis sold counter vs units in MySQL
	KindStockMismatch   = "stock_mismatch"    // remaining + sold != stock
	KindUserUnits       = "user_units"        // a user's Redis counter vs units in MySQL
	KindOverLimit       = "over_limit"        // a user holds more units than the limit
	KindOversold        = "oversold"          // more units sold than stock
	KindSoldOutFlag     = "sold_out_flag"     // flag disagrees with remaining
	KindStillQueued     = "still_queued"      // requests without a final result
	KindCampaignUnknown = "campaign_mismatch" // Redis stock/limit differ from the campaign row
)

// Report is the outcome of Check.
type Report struct {
	CampaignID  string
	Stock       int64
	RedisSold   int64
	DBUnits     int64 // units of active orders (pending payment or paid)
	DBOrders    int
	Differences []Difference
}

// Consistent reports whether the two sides agree.
func (r Report) Consistent() bool { return len(r.Differences) == 0 }

// Reconciler checks and repairs campaigns.
type Reconciler struct {
	redis  Redis
	orders Orders
	now    func() time.Time
}

// New returns a Reconciler.
func New(r Redis, o Orders) *Reconciler { return &Reconciler{redis: r, orders: o, now: time.Now} }

type state struct {
	campaign model.Campaign
	snap     model.Snapshot
	orders   []model.Order
}

func (rc *Reconciler) load(ctx context.Context, id string) (state, error) {
	c, err := rc.orders.Campaign(ctx, id)
	if err != nil {
		return state{}, err
	}
	snap, err := rc.redis.Snapshot(ctx, id)
	if err != nil {
		return state{}, err
	}
	orders, err := rc.orders.CampaignOrders(ctx, id)
	if err != nil {
		return state{}, err
	}
	return state{campaign: c, snap: snap, orders: orders}, nil
}

// Check compares Redis with MySQL for one campaign.
func (rc *Reconciler) Check(ctx context.Context, id string) (Report, error) {
	st, err := rc.load(ctx, id)
	if err != nil {
		return Report{}, err
	}
	return compare(st), nil
}

func compare(st state) Report {
	c, snap := st.campaign, st.snap
	rep := Report{CampaignID: c.ID, Stock: c.Stock, RedisSold: snap.Sold, DBOrders: len(st.orders)}
	add := func(kind, format string, args ...any) {
		rep.Differences = append(rep.Differences, Difference{Kind: kind, Detail: fmt.Sprintf(format, args...)})
	}
	dbUnits := map[string]int64{}
	byRequest := map[string]model.Order{}
	for _, o := range st.orders {
		byRequest[o.RequestID] = o
		// Only an active order holds its units: those of one cancelled,
		// expired or refunded are back on sale (release.lua).
		if o.Status.Active() {
			rep.DBUnits += o.Quantity
			dbUnits[o.UserID] += o.Quantity
		}
	}
	if rep.DBUnits > c.Stock {
		add(KindOversold, "MySQL holds %d units, stock is %d", rep.DBUnits, c.Stock)
	}
	for _, u := range sortedKeys(dbUnits) {
		if dbUnits[u] > c.PerUserLimit {
			add(KindOverLimit, "user %s holds %d units in MySQL, limit %d", u, dbUnits[u], c.PerUserLimit)
		}
	}
	if !snap.Loaded {
		add(KindNotLoaded, "Redis has no stock for %s", c.ID)
		return rep
	}
	if snap.Stock != c.Stock || snap.Limit != c.PerUserLimit {
		add(KindCampaignUnknown, "Redis stock/limit %d/%d, campaign row %d/%d", snap.Stock, snap.Limit, c.Stock, c.PerUserLimit)
	}
	if snap.Queued > 0 {
		add(KindStillQueued, "%d requests have no final result yet (differences may be in flight)", snap.Queued)
	}
	for _, rid := range sortedKeys(snap.Successes) {
		r := snap.Successes[rid]
		o, ok := byRequest[rid]
		switch {
		case !ok:
			add(KindMissingInDB, "request %s (user %s, order %s, %d units) succeeded in Redis, no order row", rid, r.UserID, r.OrderID, r.Quantity)
		case o.ID != r.OrderID || o.Quantity != r.Quantity || o.UserID != r.UserID:
			add(KindOrderMismatch, "request %s: Redis order %s/%d units/user %s, MySQL %s/%d/%s", rid, r.OrderID, r.Quantity, r.UserID, o.ID, o.Quantity, o.UserID)
		}
	}
	for _, rid := range sortedKeys(byRequest) {
		if _, ok := snap.Successes[rid]; !ok {
			o := byRequest[rid]
			add(KindMissingInRedis, "order %s (request %s, user %s) has no success result in Redis", o.ID, rid, o.UserID)
		}
	}
	if snap.Sold != rep.DBUnits {
		add(KindSoldMismatch, "Redis sold %d, MySQL units %d", snap.Sold, rep.DBUnits)
	}
	if snap.Remaining+snap.Sold != snap.Stock {
		add(KindStockMismatch, "Redis remaining %d + sold %d != stock %d", snap.Remaining, snap.Sold, snap.Stock)
	}
	users := map[string]bool{}
	for u := range snap.Units {
		users[u] = true
	}
	for u := range dbUnits {
		users[u] = true
	}
	for _, u := range sortedKeys(users) {
		if snap.Units[u] != dbUnits[u] {
			add(KindUserUnits, "user %s: Redis %d units, MySQL %d", u, snap.Units[u], dbUnits[u])
		}
	}
	if snap.SoldOut != (snap.Remaining <= 0) {
		add(KindSoldOutFlag, "sold-out flag %v with %d remaining", snap.SoldOut, snap.Remaining)
	}
	return rep
}

// Repair makes Redis agree with MySQL for a campaign whose sale has ended,
// after inserting successes shoppers were told about but MySQL lacks. It
// returns the report from before and after the repair.
func (rc *Reconciler) Repair(ctx context.Context, id string) (before, after Report, err error) {
	st, err := rc.load(ctx, id)
	if err != nil {
		return Report{}, Report{}, err
	}
	before = compare(st)
	if rc.now().Before(st.campaign.EndAt) {
		return before, Report{}, fmt.Errorf("repair %s: the sale ends at %s; repair only a finished sale, while no worker deducts: %w",
			id, st.campaign.EndAt.Format(time.RFC3339), model.ErrConflict)
	}
	if before.Consistent() {
		return before, before, nil
	}
	if !st.snap.Loaded {
		return before, Report{}, fmt.Errorf("repair %s: %w", id, model.ErrNotLoaded)
	}
	known := map[string]bool{}
	units := int64(0)
	for _, o := range st.orders {
		known[o.RequestID] = true
		units += o.Quantity
	}
	var missing []model.Order
	for _, rid := range sortedKeys(st.snap.Successes) {
		r := st.snap.Successes[rid]
		if known[rid] {
			continue
		}
		missing = append(missing, model.Order{ID: r.OrderID, RequestID: rid, CampaignID: id, UserID: r.UserID,
			Quantity: r.Quantity, Status: model.OrderPendingPayment})
		units += r.Quantity
	}
	if units > st.campaign.Stock {
		return before, Report{}, fmt.Errorf("repair %s: restoring %d missing orders would sell %d of %d units; resolve by hand: %w",
			id, len(missing), units, st.campaign.Stock, model.ErrConflict)
	}
	if err := rc.orders.InsertOrders(ctx, missing); err != nil {
		return before, Report{}, err
	}
	orders, err := rc.orders.CampaignOrders(ctx, id)
	if err != nil {
		return before, Report{}, err
	}
	if err := rc.redis.Rebuild(ctx, id, st.campaign.Stock, orders); err != nil {
		return before, Report{}, err
	}
	after, err = rc.Check(ctx, id)
	return before, after, err
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
