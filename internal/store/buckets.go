package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// A campaign of several buckets (model.Campaign.Buckets) keeps a share of
// its stock under each bucket's tag, and each bucket's requests are decided
// by deduct.lua on that bucket alone. A bucket never says sold out on its
// own: a request it lacks the units for comes back short, and the worker's
// Deduct moves stock from the other buckets (a transfer) and asks again.
// Only when a consistent scan finds every bucket empty is the request
// decided as sold out, and the campaign's own sold-out flag (the one the
// gateways read) is set first, unless a unit came back to any bucket since
// the scan began (soldout.lua): then the request is decided again.
// Transfers: transfer.go; the sold-out decision: soldout.go.

// maxShortRounds bounds the transfers one Deduct call makes for a batch;
// past it the batch errs and comes back (two buckets taking from each
// other under a burst settle within a few rounds).
const maxShortRounds = 32

// deductShort decides the short requests of a bucket's batch (see above),
// a round at a time: scan the buckets, plan from what the scan saw, move
// stock here (or put the campaign's sold-out flag up), decide the batch
// again and confirm the campaign's sold-out flag.
func (s *Store) deductShort(ctx context.Context, tag string, batch []model.Deduction, out model.DeductReply, st shortState) (model.DeductReply, error) {
	campaignID, bucket, _ := model.SplitTag(tag)
	n := st.buckets
	for range maxShortRounds {
		sc, err := s.scanShort(ctx, campaignID, bucket, n)
		if err != nil {
			return model.DeductReply{}, err
		}
		p := planShort(sc, bucket, shortUnits(batch, out))
		if ok, err := s.moveShort(ctx, campaignID, bucket, sc, p); err != nil {
			return model.DeductReply{}, err
		} else if !ok {
			continue // a unit came back since the scan: look again
		}
		if out, st, err = s.deductOnce(ctx, tag, batch, p.final); err != nil {
			return model.DeductReply{}, err
		}
		if out.SoldOutNow, err = s.confirmShort(ctx, campaignID, n, p, out, st); err != nil {
			return model.DeductReply{}, err
		}
		if st.shorts == 0 {
			return out, nil
		}
	}
	return model.DeductReply{}, fmt.Errorf("deduct %s: still short after %d transfers: %w", tag, maxShortRounds, model.ErrUnavailable)
}

// shortScan is what a round of deductShort read of the buckets.
type shortScan struct {
	snap []bucketState
	// returns is the campaign's returns counter read before a steady scan
	// (returnsSeen); "" when one read was enough.
	returns string
}

// scanShort reads the buckets for a round of deductShort. One read is
// enough to pick donors (take.lua checks what each holds); only a
// conclusion that the others are empty needs a steady scan, and the
// returns counter read before it: the flag may go up only if no unit came
// back since (soldout.lua).
func (s *Store) scanShort(ctx context.Context, campaignID string, bucket, n int) (shortScan, error) {
	snap, err := s.readBuckets(ctx, campaignID, n)
	if err != nil {
		return shortScan{}, err
	}
	if otherUnits(snap, bucket) > 0 && !hasPending(snap) {
		return shortScan{snap: snap}, nil
	}
	returns, err := s.returnsSeen(ctx, campaignID)
	if err != nil {
		return shortScan{}, err
	}
	if snap, err = s.scan(ctx, campaignID, n); err != nil {
		return shortScan{}, err
	}
	return shortScan{snap: snap, returns: returns}, nil
}

// shortPlan is what a round of deductShort does before it decides the
// batch again.
type shortPlan struct {
	// refill is the units to move into the bucket from the others, which
	// hold some; 0 when they were scanned empty.
	refill int64
	// final is deduct.lua's last argument: when every other bucket was
	// scanned empty, the bucket's moves counter as scanned (a request it
	// cannot serve is then decided, unless a transfer moved its units since).
	final string
	// soldOut: every bucket was scanned empty, the bucket itself too. Sold
	// out is said only once the campaign's flag is up.
	soldOut bool
}

// planShort decides a round of deductShort from its scan; need is the
// units the short requests ask for.
func planShort(sc shortScan, bucket int, need int64) shortPlan {
	if otherUnits(sc.snap, bucket) > 0 {
		return shortPlan{refill: need}
	}
	// What this bucket holds is all there is.
	own := sc.snap[bucket]
	return shortPlan{final: strconv.FormatInt(own.moves, 10), soldOut: own.remaining == 0}
}

// moveShort does what p plans before the batch is decided again: move
// units into the bucket, or put the campaign's sold-out flag up. It
// reports false when the flag was refused because a unit came back since
// the scan.
func (s *Store) moveShort(ctx context.Context, campaignID string, bucket int, sc shortScan, p shortPlan) (bool, error) {
	switch {
	case p.refill > 0:
		return true, s.refill(ctx, campaignID, bucket, sc.snap, p.refill)
	case p.soldOut:
		s.hook("scanned")
		up, err := s.soldOutUnlessReturned(ctx, campaignID, sc.returns)
		if err != nil || !up {
			return false, err
		}
		s.hook("flagged")
	}
	return true, nil
}

// confirmShort settles the campaign's sold-out flag once the batch was
// decided again under p, and reports whether it is up.
func (s *Store) confirmShort(ctx context.Context, campaignID string, n int, p shortPlan, out model.DeductReply, st shortState) (bool, error) {
	switch {
	case p.soldOut:
		// A release may have landed between the scan and the flag: look
		// again, and take the flag down if so.
		return s.confirmSoldOut(ctx, campaignID, n)
	case st.buckets > 0 && st.shorts == 0:
		// This call emptied the bucket: all may be empty now.
		return s.markSoldOut(ctx, campaignID, n)
	}
	return out.SoldOutNow, nil
}

func (s *Store) hook(point string) {
	if s.testHook != nil {
		s.testHook(point)
	}
}

// otherUnits is what the buckets other than b hold in snap.
func otherUnits(snap []bucketState, b int) int64 {
	var n int64
	for i, bs := range snap {
		if i != b {
			n += bs.remaining
		}
	}
	return n
}

func hasPending(snap []bucketState) bool {
	return slices.ContainsFunc(snap, func(b bucketState) bool { return len(b.pending) > 0 })
}

// shortUnits is the units the short requests of a batch ask for, at least 1.
func shortUnits(batch []model.Deduction, out model.DeductReply) int64 {
	var n int64
	for i, r := range out.Results {
		if r.Status == "" {
			n += batch[i].Quantity
		}
	}
	return max(n, 1)
}

// bucketState is one bucket as a scan read it.
type bucketState struct {
	remaining, epoch, moves int64
	pending                 []string // transfer ids pending on it as donor
}

// scan reads every bucket of a campaign, completing the transfers it finds
// pending, until two reads in a row find the same remaining units, epochs
// and moves counters and nothing pending. The buckets live on different
// slots, so one read is not a moment's state; but every transfer and
// release bumps its bucket's moves counter and a deduction only lowers
// units, so two equal reads mean the state of the first held at the
// moment between them.
func (s *Store) scan(ctx context.Context, campaignID string, n int) ([]bucketState, error) {
	prev, err := s.readBuckets(ctx, campaignID, n)
	if err != nil {
		return nil, err
	}
	for range 64 {
		if hasPending(prev) {
			if err := s.recoverPending(ctx, campaignID, n, prev); err != nil {
				return nil, err
			}
		}
		cur, err := s.readBuckets(ctx, campaignID, n)
		if err != nil {
			return nil, err
		}
		if equalScans(prev, cur) {
			return cur, nil
		}
		prev = cur
	}
	return nil, fmt.Errorf("scan buckets of %s: never steady: %w", campaignID, model.ErrUnavailable)
}

func equalScans(a, b []bucketState) bool {
	for i := range a {
		if len(a[i].pending) > 0 || len(b[i].pending) > 0 ||
			a[i].remaining != b[i].remaining || a[i].epoch != b[i].epoch || a[i].moves != b[i].moves {
			return false
		}
	}
	return true
}

// readBuckets reads every bucket of a campaign in one pipeline (a cluster
// client splits it by slot).
func (s *Store) readBuckets(ctx context.Context, campaignID string, n int) ([]bucketState, error) {
	pipe := s.rdb.Pipeline()
	type reads struct {
		stock *redis.StringCmd
		meta  *redis.SliceCmd
		pend  *redis.StringSliceCmd
	}
	rs := make([]reads, n)
	for b := range n {
		k := campaignKeys(model.BucketTag(campaignID, b, n))
		rs[b] = reads{pipe.Get(ctx, k.stock), pipe.HMGet(ctx, k.meta, "epoch", "moves"), pipe.SMembers(ctx, k.xpend)}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("scan buckets of %s: %w", campaignID, unavailable(err))
	}
	out := make([]bucketState, n)
	for b, r := range rs {
		rem, err := r.stock.Int64()
		if errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("scan buckets of %s: bucket %d: %w", campaignID, b, model.ErrNotLoaded)
		}
		if err != nil {
			return nil, fmt.Errorf("scan buckets of %s: bucket %d: %w", campaignID, b, err)
		}
		out[b].remaining = rem
		for i, p := range []*int64{&out[b].epoch, &out[b].moves} {
			if v := r.meta.Val()[i]; v != nil {
				if *p, err = parseInt(v); err != nil {
					return nil, fmt.Errorf("scan buckets of %s: bucket %d: %w", campaignID, b, err)
				}
			}
		}
		out[b].pending = r.pend.Val()
	}
	return out, nil
}
