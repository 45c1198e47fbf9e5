package store

import (
	"context"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/model"
)

// Redis is a projection of the ledger (the orders in MySQL): every load of
// a campaign writes it from the orders under a new epoch (rebuild.lua),
// deduct.lua reports the epoch it decided under, and MySQL stores the
// orders of that epoch only.

// Projection reads what Redis holds of a campaign's definition: the values
// and the epoch of its last load. Loaded is false when Redis has none.
func (s *Store) Projection(ctx context.Context, campaignID string) (model.Projection, error) {
	v, err := s.rdb.HMGet(ctx, campaignKeys(campaignID).meta, "stock", "limit", "start_ms", "end_ms", "epoch", "paused").Result()
	if err != nil {
		return model.Projection{}, fmt.Errorf("projection %s: %w", campaignID, err)
	}
	if v[0] == nil {
		return model.Projection{}, nil
	}
	var n [5]int64
	for i := range n {
		if v[i] == nil { // a campaign loaded before epochs existed has none
			continue
		}
		if n[i], err = parseInt(v[i]); err != nil {
			return model.Projection{}, fmt.Errorf("projection %s: meta field %d: %w", campaignID, i, err)
		}
	}
	return model.Projection{Loaded: true, Stock: n[0], Limit: n[1], StartAt: time.UnixMilli(n[2]).UTC(),
		EndAt: time.UnixMilli(n[3]).UTC(), Epoch: model.Epoch(n[4]), Paused: v[5] == "1"}, nil
}

// Rebuild loads campaign c into Redis from its orders, under c.Epoch, in
// one atomic step (rebuild.lua): its values and paused flag; remaining =
// stock - units of the active orders (pending payment, paid); the
// ended-early flag; each buyer's
// units from them; a success result for every order's request, and the
// result of every request MySQL refused (refusals: decided while MySQL
// decided the campaign, the degraded mode), so that neither is decided
// again nor reads otherwise than it did; the ids of
// the orders no longer active in the released hash, so a release of one
// still in flight changes nothing; the counters (sold = active units, every
// restored result admitted and finished by its status); the sold-out flag when nothing
// remains. Everything else Redis held of the campaign goes, the requests
// not enqueued included (their queued markers and the admissions set go).
// Every key of the campaign expires at expireAt.
//
// c must come from the ledger's BumpEpoch, and orders must be read after
// it. loaded is false, with nothing changed, when Redis holds c.Epoch or a
// later one: a concurrent load that read the ledger after this one. More
// active units than c.Stock is model.ErrConflict, with nothing changed.
func (s *Store) Rebuild(ctx context.Context, c model.Campaign, orders []model.Order, refusals []model.Result) (loaded bool, err error) {
	n := max(c.Buckets, 1)
	parts := make([]rebuildPart, n)
	var sold int64
	for _, r := range refusals {
		parts[bucketOfRequest(r.RequestID, r.UserID, n)].result(r.RequestID, storedResult{Status: r.Status, Quantity: r.Quantity, Reason: r.Reason, UserID: r.UserID})
	}
	for _, o := range orders {
		// The order's request id names the bucket its result and release
		// go to; the buyer's units go to their bucket, the same one.
		p := &parts[bucketOfRequest(o.RequestID, o.UserID, n)]
		p.result(o.RequestID, storedResult{Status: model.StatusSuccess, Quantity: o.Quantity, OrderID: o.ID, UserID: o.UserID})
		// An order in no final state holds its units, whatever it is.
		if o.Status.Final() {
			p.released = append(p.released, o.ID, o.Quantity)
			continue
		}
		sold += o.Quantity
		p.sold += o.Quantity
		if p.units == nil {
			p.units = map[string]int64{}
		}
		p.units[o.UserID] += o.Quantity
	}
	if sold > c.Stock {
		return false, fmt.Errorf("rebuild %s: active orders hold %d units, stock is %d: %w", c.ID, sold, c.Stock, model.ErrConflict)
	}
	if n == 1 {
		parts[0].remaining = c.Stock - sold
		return s.rebuildTag(ctx, c.ID, c, n, parts[0])
	}
	// Each bucket starts with an even share of what remains; transfers
	// (transfer.go) even out whatever the shoppers do not. The campaign's
	// own tag is written last: its meta is the Projection a preload
	// compares, so it says loaded only once every bucket is.
	rem := c.Stock - sold
	for b := range parts {
		parts[b].remaining = rem / int64(n)
		if int64(b) < rem%int64(n) {
			parts[b].remaining++
		}
		ok, err := s.rebuildTag(ctx, model.BucketTag(c.ID, b, n), c, n, parts[b])
		if err != nil || !ok {
			return false, err
		}
	}
	return s.rebuildTag(ctx, c.ID, c, n, rebuildPart{remaining: rem, sold: sold})
}

// bucketOfRequest is the bucket of n a request's result goes to: the one
// its id names, else its user's.
func bucketOfRequest(requestID, userID string, n int) int {
	b := 0
	if tag, ok := model.TagOfRequest(requestID); ok && n > 1 {
		_, b, _ = model.SplitTag(tag)
	}
	if b >= n {
		b = model.BucketOf(userID, n)
	}
	return b
}

// rebuildPart is what one tag's rebuild.lua call writes.
type rebuildPart struct {
	remaining, sold   int64
	units             map[string]int64
	results, released []any
	// finished counts results by status (the counters' fin:<status>).
	finished map[model.Status]int64
}

func (p *rebuildPart) result(requestID string, r storedResult) {
	p.results = append(p.results, requestID, r.String())
	if p.finished == nil {
		p.finished = map[model.Status]int64{}
	}
	p.finished[r.Status]++
}

func (s *Store) rebuildTag(ctx context.Context, tag string, c model.Campaign, buckets int, p rebuildPart) (bool, error) {
	paused := "0"
	if c.Paused {
		paused = "1"
	}
	endedEarly := "0"
	if c.EndedEarly {
		endedEarly = "1"
	}
	args := make([]any, 0, 15+2*len(p.units)+len(p.results)+2*len(p.finished)+len(p.released))
	args = append(args, int64(c.Epoch), c.Stock, c.PerUserLimit, c.StartAt.UnixMilli(), c.EndAt.UnixMilli(), paused,
		p.remaining, p.sold, s.expireAt(c, time.Now()), endedEarly, buckets, len(p.units))
	for u, n := range p.units {
		args = append(args, u, n)
	}
	args = append(args, len(p.results)/2)
	args = append(args, p.results...)
	args = append(args, len(p.finished))
	for st, n := range p.finished {
		args = append(args, "fin:"+string(st), n)
	}
	args = append(args, p.released...)
	k := campaignKeys(tag)
	code, err := s.rebuild.Run(ctx, s.rdb,
		[]string{k.meta, k.stock, k.soldout, k.counters, k.users, k.results, k.idem, k.released, k.userLimits, k.ipLimits, k.admissions,
			k.xfer, k.xpend, k.got}, args...).Int()
	if err != nil {
		return false, fmt.Errorf("rebuild %s: %w", tag, err)
	}
	switch code {
	case 1:
		return true, nil
	case 0:
		return false, nil
	}
	return false, fmt.Errorf("rebuild %s: unexpected reply %d", tag, code)
}

// expireAt is when the keys of c expire, in unix seconds: the retention
// after the last moment its sale can need them, the end of the payment
// window of an order decided as the sale ends. Until then the gateways
// admit, the workers decide and orders are paid or released against them.
// A load after that moment (a rebuild of a sale long over, to decide what
// its queue still held) gives them the retention from the load.
func (s *Store) expireAt(c model.Campaign, now time.Time) int64 {
	last := c.EndAt
	if now.After(last) {
		last = now
	}
	at := last.Add(c.WithDefaults().PaymentWindow + s.retention)
	sec := at.Unix()
	if at.Nanosecond() > 0 { // round up: never earlier than promised
		sec++
	}
	return sec
}
