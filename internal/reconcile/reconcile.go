// Package reconcile keeps a campaign's sales in Redis a projection of its
// orders in MySQL: Load writes the orders into Redis under a new epoch
// (every preload, a rebuild after Redis lost the campaign), Check compares
// the two sides, and Repair, for a finished or paused campaign, makes Redis
// agree with MySQL.
//
// MySQL is the ledger. A success that Redis decided but MySQL lacks stands:
// a shopper may have been told it (guarantee 4), and one not shown yet
// (above its tag's durable mark) was decided once, as its worker would have
// stored it. So repair first inserts it — unless that would exceed the
// stock — and then loads Redis from the orders, which shows it.
package reconcile

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Ledger is the MySQL side of a load (sqlstore.DB). BumpEpoch starts a
// campaign's next epoch and returns the campaign and its orders read after
// the bump committed.
type Ledger interface {
	Campaign(ctx context.Context, id string) (model.Campaign, error)
	BumpEpoch(ctx context.Context, id string) (model.Campaign, []model.Order, error)
	CampaignOrders(ctx context.Context, campaignID string) ([]model.Order, error)
	// Refusals are the results of the requests MySQL refused while it
	// decided the campaign (the degraded mode): a load carries them into
	// Redis with the orders' successes.
	Refusals(ctx context.Context, campaignID string) ([]model.Result, error)
}

// Projection is the Redis side of a load (store.Store).
type Projection interface {
	Rebuild(ctx context.Context, c model.Campaign, orders []model.Order, refusals []model.Result) (loaded bool, err error)
	Release(ctx context.Context, campaignID, orderID, userID string, units int64) (released bool, err error)
	SetPaused(ctx context.Context, c model.Campaign) (written bool, err error)
	EndEarly(ctx context.Context, c model.Campaign) (written bool, err error)
}

// Redis is what reconciliation reads and writes in Redis.
type Redis interface {
	Projection
	Snapshot(ctx context.Context, campaignID string) (model.Snapshot, error)
	Remove(ctx context.Context, campaignID string, admitted int64) (removed int64, err error)
}

// Orders is what reconciliation reads and writes in MySQL.
type Orders interface {
	Ledger
	InsertOrders(ctx context.Context, orders []model.Order, epochs model.Epochs) error
}

// Load loads campaign id into Redis from its orders under a new epoch, and
// returns the campaign as loaded. The steps make it safe against everything
// that runs meanwhile:
//
//  1. BumpEpoch commits the new epoch in MySQL first. From then on MySQL
//     refuses every order decided under an older one, and the orders it
//     reads after the bump include every order stored under one.
//  2. Rebuild writes the campaign into Redis from those orders, in one
//     atomic step, unless a concurrent load got there with a later epoch
//     (it read the ledger later and does the rest).
//  3. An order that left the active states between the read and the write
//     had its release meet Redis before the write (or meet nothing), so
//     the write counted its units again: they are released now, once
//     (release.lua is idempotent per order id).
//  4. A pause or resume, or an early end, committed after the read has
//     its flag written.
//
// A failure after step 1 leaves Redis at an older epoch, where workers
// decide nothing that MySQL stores: loading again completes it.
func Load(ctx context.Context, ledger Ledger, proj Projection, id string) (model.Campaign, error) {
	c, _, err := load(ctx, ledger, proj, id)
	return c, err
}

// load is Load that also returns how many orders it loaded.
func load(ctx context.Context, ledger Ledger, proj Projection, id string) (model.Campaign, int, error) {
	c, orders, err := ledger.BumpEpoch(ctx, id)
	if err != nil {
		return model.Campaign{}, 0, fmt.Errorf("load %s: %w", id, err)
	}
	// Read after the bump, which handed the campaign back to Redis: MySQL
	// refuses nothing more.
	refusals, err := ledger.Refusals(ctx, id)
	if err != nil {
		return model.Campaign{}, 0, fmt.Errorf("load %s: %w", id, err)
	}
	loaded, err := proj.Rebuild(ctx, c, orders, refusals)
	if err != nil || !loaded {
		return c, len(orders), err
	}
	active := map[string]bool{}
	for _, o := range orders {
		if !o.Status.Final() {
			active[o.ID] = true
		}
	}
	now, err := ledger.CampaignOrders(ctx, id)
	if err != nil {
		return c, len(orders), fmt.Errorf("load %s: %w", id, err)
	}
	for _, o := range now {
		if o.Status.Final() && active[o.ID] {
			if _, err := proj.Release(ctx, id, o.ID, o.UserID, o.Quantity); err != nil {
				return c, len(orders), fmt.Errorf("load %s: %w", id, err)
			}
		}
	}
	cur, err := ledger.Campaign(ctx, id)
	if err != nil {
		return c, len(orders), fmt.Errorf("load %s: %w", id, err)
	}
	if cur.Paused != c.Paused {
		if _, err := proj.SetPaused(ctx, cur); err != nil {
			return c, len(orders), fmt.Errorf("load %s: %w", id, err)
		}
		c.Paused = cur.Paused
	}
	if cur.EndedEarly && !c.EndedEarly {
		if _, err := proj.EndEarly(ctx, cur); err != nil {
			return c, len(orders), fmt.Errorf("load %s: %w", id, err)
		}
		c.EndedEarly, c.EndAt = true, cur.EndAt
	}
	return c, len(orders), nil
}

// Difference is one disagreement between the two sides.
type Difference struct {
	Kind   string // see the Kind* constants
	Detail string
}

// Kinds of difference.
const (
	KindNotLoaded       = "not_loaded"        // Redis has no stock for the campaign
	KindEpochMismatch   = "epoch_mismatch"    // Redis holds another load than MySQL's epoch
	KindMissingInDB     = "missing_in_db"     // a Redis success without an order row
	KindMissingInRedis  = "missing_in_redis"  // an order row without a Redis success
	KindOrderMismatch   = "order_mismatch"    // both have it, with different order ids or quantities
	KindSoldMismatch    = "sold_mismatch"     // Redis sold counter vs units of active orders in MySQL
	KindStockMismatch   = "stock_mismatch"    // remaining + sold != stock
	KindUserUnits       = "user_units"        // a user's Redis counter vs units of their active orders
	KindOverLimit       = "over_limit"        // a user's active orders hold more units than the limit
	KindOversold        = "oversold"          // active orders hold more units than stock
	KindSoldOutFlag     = "sold_out_flag"     // flag disagrees with remaining
	KindStillQueued     = "still_queued"      // requests without a final result
	KindCampaignUnknown = "campaign_mismatch" // Redis stock/limit differ from the campaign row
)

// Kinds lists every kind of difference, so a report can say zero of each.
func Kinds() []string {
	return []string{KindNotLoaded, KindEpochMismatch, KindMissingInDB, KindMissingInRedis, KindOrderMismatch,
		KindSoldMismatch, KindStockMismatch, KindUserUnits, KindOverLimit, KindOversold, KindSoldOutFlag,
		KindStillQueued, KindCampaignUnknown}
}

// Report is the outcome of Check.
type Report struct {
	CampaignID string
	Stock      int64
	RedisSold  int64
	// DBUnits are the units of the active orders (pending payment, paid):
	// those that hold stock. DBOrders counts every order.
	DBUnits     int64
	DBOrders    int
	Differences []Difference
	// Lost are the requests that ended rejected (lost): admitted, then
	// their state died with Redis before a worker decided them. Not a
	// difference: each has its final result; operators count them.
	Lost []string
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
	rep := Report{CampaignID: c.ID, Stock: c.Stock, RedisSold: snap.Sold, DBOrders: len(st.orders), Lost: slices.Sorted(slices.Values(snap.Lost))}
	add := func(kind, format string, args ...any) {
		rep.Differences = append(rep.Differences, Difference{Kind: kind, Detail: fmt.Sprintf(format, args...)})
	}
	// Every order keeps its request's success; only active ones hold
	// units (a final one's went back on sale).
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
	if snap.Epoch != c.Epoch {
		add(KindEpochMismatch, "Redis holds epoch %d, MySQL is at %d", snap.Epoch, c.Epoch)
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

// Repair makes Redis agree with MySQL for a campaign whose sale has ended
// or is paused (so no worker decides meanwhile), after inserting the
// successes Redis decided but MySQL lacks; it loads Redis from
// the orders (Load). It returns the report from before and after the
// repair.
func (rc *Reconciler) Repair(ctx context.Context, id string) (before, after Report, err error) {
	st, err := rc.load(ctx, id)
	if err != nil {
		return Report{}, Report{}, err
	}
	before = compare(st)
	if rc.now().Before(st.campaign.EndAt) && !st.campaign.Paused {
		return before, Report{}, fmt.Errorf("repair %s: the sale ends at %s; repair a finished or paused sale only, while no worker decides: %w",
			id, st.campaign.EndAt.Format(time.RFC3339), model.ErrConflict)
	}
	if before.Consistent() {
		return before, before, nil
	}
	// Successes of another epoch than MySQL's were decided against a
	// projection since replaced: MySQL refuses their orders, and their
	// requests are decided again.
	if st.snap.Loaded && st.snap.Epoch == st.campaign.Epoch {
		if err := rc.restore(ctx, st); err != nil {
			return before, Report{}, err
		}
	}
	if _, err := Load(ctx, rc.orders, rc.redis, id); err != nil {
		return before, Report{}, err
	}
	after, err = rc.Check(ctx, id)
	return before, after, err
}

// restore inserts the successes Redis holds and MySQL lacks, unless the
// active orders would then hold more than the stock.
func (rc *Reconciler) restore(ctx context.Context, st state) error {
	id := st.campaign.ID
	known := map[string]bool{}
	units := int64(0)
	for _, o := range st.orders {
		known[o.RequestID] = true
		if !o.Status.Final() {
			units += o.Quantity
		}
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
		return fmt.Errorf("repair %s: restoring %d missing orders would sell %d of %d units; resolve by hand: %w",
			id, len(missing), units, st.campaign.Stock, model.ErrConflict)
	}
	return rc.orders.InsertOrders(ctx, missing, model.Epochs{id: st.snap.Epoch})
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Archive removes a campaign's keys from Redis once nothing can need them:
// its sale has ended, no order is pending payment (its expiry or payment
// would write Redis again), and Redis agrees with MySQL (Check), every
// admitted request decided included. Anything else is model.ErrConflict
// with nothing removed, and the report says why. A campaign Redis does
// not hold has its leftovers (rate-limit state) removed. MySQL keeps
// everything: a load rebuilds the campaign from its orders.
func (rc *Reconciler) Archive(ctx context.Context, id string) (rep Report, removed int64, err error) {
	st, err := rc.load(ctx, id)
	if err != nil {
		return Report{}, 0, err
	}
	rep = compare(st)
	if now := rc.now(); now.Before(st.campaign.EndAt) {
		return rep, 0, fmt.Errorf("archive %s: the sale ends at %s: %w", id, st.campaign.EndAt.Format(time.RFC3339), model.ErrConflict)
	}
	pending := 0
	for _, o := range st.orders {
		if o.Status == model.OrderPendingPayment {
			pending++
		}
	}
	if pending > 0 {
		return rep, 0, fmt.Errorf("archive %s: %d orders are pending payment; archive once their payment windows are over: %w", id, pending, model.ErrConflict)
	}
	if st.snap.Loaded && !rep.Consistent() {
		return rep, 0, fmt.Errorf("archive %s: Redis and MySQL disagree (%d differences); reconcile first: %w", id, len(rep.Differences), model.ErrConflict)
	}
	removed, err = rc.redis.Remove(ctx, id, st.snap.Admitted)
	return rep, removed, err
}
