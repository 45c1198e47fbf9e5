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

// deductShort decides the short requests of a bucket's batch (see above).
func (s *Store) deductShort(ctx context.Context, tag string, batch []model.Deduction, out model.DeductReply, st shortState) (model.DeductReply, error) {
	campaignID, bucket, _ := model.SplitTag(tag)
	n := st.buckets
	for range maxShortRounds {
		// One read is enough to pick donors (take.lua checks what each
		// holds); only a conclusion that the others are empty needs a
		// steady scan.
		snap, err := s.readBuckets(ctx, campaignID, n)
		if err != nil {
			return model.DeductReply{}, err
		}
		others := otherUnits(snap, bucket)
		var returns string
		if others == 0 || hasPending(snap) {
			// Read before the scan: the flag may go up only if no unit
			// came back since (soldout.lua).
			if returns, err = s.returnsSeen(ctx, campaignID); err != nil {
				return model.DeductReply{}, err
			}
			if snap, err = s.scan(ctx, campaignID, n); err != nil {
				return model.DeductReply{}, err
			}
			others = otherUnits(snap, bucket)
		}
		if others == 0 {
			// Every other bucket was empty as scanned: what this one holds
			// is all there is, unless a transfer moved some of it since
			// (its moves counter, checked by deduct.lua). Sold out is said
			// only once the campaign's flag is up.
			soldOut := snap[bucket].remaining == 0
			if soldOut {
				s.hook("scanned")
				up, err := s.soldOutUnlessReturned(ctx, campaignID, returns)
				if err != nil {
					return model.DeductReply{}, err
				}
				if !up {
					continue // a unit came back since the scan: look again
				}
				s.hook("flagged")
			}
			out, st, err = s.deductOnce(ctx, tag, batch, strconv.FormatInt(snap[bucket].moves, 10))
			if err != nil {
				return model.DeductReply{}, err
			}
			switch {
			case soldOut:
				// A release may have landed between the scan and the
				// flag: look again, and take the flag down if so.
				if out.SoldOutNow, err = s.confirmSoldOut(ctx, campaignID, n); err != nil {
					return model.DeductReply{}, err
				}
			case st.buckets > 0 && st.shorts == 0:
				// This call emptied the bucket: all may be empty now.
				if out.SoldOutNow, err = s.markSoldOut(ctx, campaignID, n); err != nil {
					return model.DeductReply{}, err
				}
			}
		} else {
			if err := s.refill(ctx, campaignID, bucket, snap, shortUnits(batch, out)); err != nil {
				return model.DeductReply{}, err
			}
			out, st, err = s.deductOnce(ctx, tag, batch, "")
			if err != nil {
				return model.DeductReply{}, err
			}
			if st.buckets > 0 && st.shorts == 0 {
				if out.SoldOutNow, err = s.markSoldOut(ctx, campaignID, n); err != nil {
					return model.DeductReply{}, err
				}
			}
		}
		if st.shorts == 0 {
			return out, nil
		}
	}
	return model.DeductReply{}, fmt.Errorf("deduct %s: still short after %d transfers: %w", tag, maxShortRounds, model.ErrUnavailable)
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
