package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

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
//
// A transfer is two scripts on two slots, keyed by a transfer id: take.lua
// takes units from the donor and records them pending there; give.lua adds
// them to the recipient unless it already received that id; settle.lua then
// marks it done on the donor. A crash between the steps leaves the pending
// record, which the next scan of the campaign completes (recoverPending):
// the units are never lost, and never given twice. Each step is fenced by
// the campaign's epoch: a rebuild writes every bucket from the ledger and
// voids older transfers.

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

func hasUnits(snap []bucketState) bool {
	return slices.ContainsFunc(snap, func(b bucketState) bool { return b.remaining > 0 })
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

// markSoldOut sets the campaign's sold-out flag when a steady scan finds
// every bucket empty, and takes it down otherwise; it reports whether the
// flag is up. Setting it is followed by a second scan: a release that
// landed meanwhile takes it down again (a release clears the flag after it
// adds its units, so one of the two sees the other).
func (s *Store) markSoldOut(ctx context.Context, campaignID string, n int) (bool, error) {
	// A bucket seen holding units in one read is enough to say no (the
	// usual answer while transfers even the buckets out).
	if snap, err := s.readBuckets(ctx, campaignID, n); err != nil {
		return false, err
	} else if hasUnits(snap) {
		return false, s.clearSoldOut(ctx, campaignID)
	}
	returns, err := s.returnsSeen(ctx, campaignID)
	if err != nil {
		return false, err
	}
	for pass := range 2 {
		snap, err := s.scan(ctx, campaignID, n)
		if err != nil {
			return false, err
		}
		if hasUnits(snap) {
			return false, s.clearSoldOut(ctx, campaignID)
		}
		if pass == 0 {
			if up, err := s.soldOutUnlessReturned(ctx, campaignID, returns); err != nil || !up {
				return false, err // refused: a unit came back since the first scan
			}
		}
	}
	return true, nil
}

// confirmSoldOut takes the campaign's sold-out flag, just put up, down
// again unless a steady scan still finds every bucket empty; it reports
// whether the flag stays.
func (s *Store) confirmSoldOut(ctx context.Context, campaignID string, n int) (bool, error) {
	snap, err := s.scan(ctx, campaignID, n)
	if err != nil {
		return false, err
	}
	if hasUnits(snap) {
		return false, s.clearSoldOut(ctx, campaignID)
	}
	return true, nil
}

// clearSoldOut takes a campaign's own sold-out flag down.
func (s *Store) clearSoldOut(ctx context.Context, campaignID string) error {
	if err := s.rdb.Del(ctx, campaignKeys(campaignID).soldout).Err(); err != nil {
		return fmt.Errorf("sold-out flag %s: %w", campaignID, unavailable(err))
	}
	return nil
}

// returnsSeen reads a campaign's returns counter (soldout.lua), "" before
// the first return.
func (s *Store) returnsSeen(ctx context.Context, campaignID string) (string, error) {
	v, err := s.rdb.HGet(ctx, campaignKeys(campaignID).meta, "returns").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("returns of %s: %w", campaignID, unavailable(err))
	}
	return v, nil
}

// soldOutUnlessReturned puts a campaign's own sold-out flag up (expiring
// with its other keys) unless its returns counter moved from returns, read
// before the scan that found every bucket empty; it reports whether the
// flag is up.
func (s *Store) soldOutUnlessReturned(ctx context.Context, campaignID, returns string) (bool, error) {
	k := campaignKeys(campaignID)
	up, err := s.soldOut.Run(ctx, s.rdb, []string{k.soldout, k.meta}, "up", returns).Int()
	if err != nil {
		return false, fmt.Errorf("sold-out flag %s: %w", campaignID, unavailable(err))
	}
	return up == 1, nil
}

// unitsReturned takes a campaign's own sold-out flag down after a release
// put units back into one of its buckets, and counts the return, so that a
// worker whose scan missed those units cannot put the flag up afterwards.
func (s *Store) unitsReturned(ctx context.Context, campaignID string) error {
	k := campaignKeys(campaignID)
	if err := s.runAcked(ctx, s.soldOut, []string{k.soldout, k.meta}, "down").Err(); err != nil {
		return fmt.Errorf("sold-out flag %s: %w", campaignID, unavailable(err))
	}
	return nil
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

// refill moves at least need units into bucket to, if the others hold
// them, taking from the fullest first: half of a donor's units or need,
// whichever is more, so a bucket that keeps running short under a skewed
// crowd needs fewer transfers.
func (s *Store) refill(ctx context.Context, campaignID string, to int, snap []bucketState, need int64) error {
	donors := make([]int, 0, len(snap)-1)
	for b := range snap {
		if b != to && snap[b].remaining > 0 {
			donors = append(donors, b)
		}
	}
	slices.SortFunc(donors, func(a, b int) int { return int(snap[b].remaining - snap[a].remaining) })
	for _, d := range donors {
		if need <= 0 {
			break
		}
		want := max(need, (snap[d].remaining+1)/2)
		got, err := s.transfer(ctx, campaignID, len(snap), d, to, snap[to].epoch, want)
		if err != nil {
			return err
		}
		need -= got
	}
	return nil
}

// transfer moves up to want units from bucket from to bucket to under a
// fresh transfer id, and reports how many moved (0: the donor had none
// left, or the epoch moved on).
func (s *Store) transfer(ctx context.Context, campaignID string, n, from, to int, epoch, want int64) (int64, error) {
	// Indexed first, so RecoverTransfers finds a transfer this process
	// dies in the middle of even if no scan of the campaign comes again.
	if err := s.rdb.SAdd(ctx, transfersIndex, campaignID).Err(); err != nil {
		return 0, fmt.Errorf("transfer in %s: index: %w", campaignID, unavailable(err))
	}
	var id [12]byte
	_, _ = rand.Read(id[:])
	xid := strconv.FormatInt(epoch, 10) + "-" + hex.EncodeToString(id[:])
	units, err := s.takeUnits(ctx, campaignID, n, from, to, epoch, xid, want)
	if err != nil || units == 0 {
		s.observeTransfer(outcomeOf(err, "empty"), 0)
		return 0, err
	}
	err = s.completeTransfer(ctx, campaignID, n, from, to, epoch, xid, units)
	s.observeTransfer(outcomeOf(err, "moved"), units)
	return units, err
}

// Transfer outcomes, as TransferObserver is told them: moved (taken and
// given), empty (the donor had nothing left, or its epoch moved on),
// recovered (a pending transfer completed by RecoverTransfers or a scan),
// failed (a step failed: it stays pending until recovered).
func outcomeOf(err error, ok string) string {
	if err != nil {
		return "failed"
	}
	return ok
}

// WithTransferObserver has Store tell observe each stock transfer between
// a campaign's buckets: its outcome and the units it moved.
func WithTransferObserver(observe func(outcome string, units int64)) Option {
	return func(s *Store) { s.transferObserver = observe }
}

func (s *Store) observeTransfer(outcome string, units int64) {
	if s.transferObserver != nil {
		s.transferObserver(outcome, units)
	}
}

// takeUnits is a transfer's first step (take.lua); 0 units when the donor
// had none or is at another epoch.
func (s *Store) takeUnits(ctx context.Context, campaignID string, n, from, to int, epoch int64, xid string, want int64) (int64, error) {
	k := campaignKeys(model.BucketTag(campaignID, from, n))
	reply, err := s.runAcked(ctx, s.take, []string{k.stock, k.meta, k.xfer, k.xpend}, xid, want, epoch, to).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("transfer %s from bucket %d of %s: %w", xid, from, campaignID, err)
	}
	switch {
	case len(reply) == 2 && (reply[0] == 1 || reply[0] == 0) && reply[1] > 0:
		return reply[1], nil
	case len(reply) == 1 && (reply[0] == -1 || reply[0] == -2):
		return 0, nil
	}
	return 0, fmt.Errorf("transfer %s from bucket %d of %s: unexpected reply %v", xid, from, campaignID, reply)
}

// completeTransfer runs a taken transfer's last two steps: give.lua on the
// recipient, settle.lua on the donor. Safe to run again.
func (s *Store) completeTransfer(ctx context.Context, campaignID string, n, from, to int, epoch int64, xid string, units int64) error {
	kt := campaignKeys(model.BucketTag(campaignID, to, n))
	code, err := s.runAcked(ctx, s.give, []string{kt.stock, kt.meta, kt.got}, xid, units, epoch).Int()
	if err != nil {
		return fmt.Errorf("transfer %s to bucket %d of %s: %w", xid, to, campaignID, err)
	}
	state := "done"
	switch code {
	case 1, 0:
	case -1:
		state = "void" // a rebuild wrote the recipient: the ledger decides its units
	default:
		return fmt.Errorf("transfer %s to bucket %d of %s: unexpected reply %d", xid, to, campaignID, code)
	}
	kf := campaignKeys(model.BucketTag(campaignID, from, n))
	if err := s.runAcked(ctx, s.settle, []string{kf.xfer, kf.xpend, kf.meta}, xid, state).Err(); err != nil {
		return fmt.Errorf("settle transfer %s of %s: %w", xid, campaignID, err)
	}
	return nil
}

// transfersIndex is the set of campaigns that made transfers some of which
// may still be pending. It has no hash tag: one key, on one node.
const transfersIndex = "fs:transfers"

// RecoverTransfers completes the transfers left pending in every campaign
// that made any (a worker that died between a transfer's steps): one read
// of its buckets each. A campaign leaves the index when Redis no longer
// holds it (its keys expired, or it was removed): before that, a transfer
// may start at any moment, and an index entry taken off between its
// indexing and its first step would hide it if it died there. Every worker
// process runs it periodically (the sweeper's "transfer recovery"); a scan
// of the campaign does the same sooner, when one of its buckets runs short.
func (s *Store) RecoverTransfers(ctx context.Context) error {
	campaigns, err := s.rdb.SMembers(ctx, transfersIndex).Result()
	if err != nil {
		return fmt.Errorf("recover transfers: %w", unavailable(err))
	}
	var errs []error
	for _, c := range campaigns {
		if err := s.recoverCampaign(ctx, c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Store) recoverCampaign(ctx context.Context, campaignID string) error {
	n, err := s.rdb.HGet(ctx, campaignKeys(campaignID).meta, "buckets").Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("recover transfers of %s: %w", campaignID, unavailable(err))
	}
	if n > 1 {
		snap, err := s.readBuckets(ctx, campaignID, n)
		switch {
		case errors.Is(err, model.ErrNotLoaded):
			return nil // a rebuild writes it again, voiding what was pending
		case err != nil:
			return err
		case hasPending(snap):
			return s.recoverPending(ctx, campaignID, n, snap)
		}
		return nil
	}
	if err := s.rdb.SRem(ctx, transfersIndex, campaignID).Err(); err != nil {
		return fmt.Errorf("recover transfers of %s: index: %w", campaignID, unavailable(err))
	}
	return nil
}

// recoverPending completes the transfers a scan found pending: taken from
// their donor, perhaps given, not settled (a crash, or another worker
// between its steps: completing it twice changes nothing).
func (s *Store) recoverPending(ctx context.Context, campaignID string, n int, snap []bucketState) error {
	for from, bs := range snap {
		if len(bs.pending) == 0 {
			continue
		}
		k := campaignKeys(model.BucketTag(campaignID, from, n))
		vals, err := s.rdb.HMGet(ctx, k.xfer, bs.pending...).Result()
		if err != nil {
			return fmt.Errorf("pending transfers of %s: %w", campaignID, unavailable(err))
		}
		for i, v := range vals {
			xid := bs.pending[i]
			str, _ := v.(string)
			f := strings.Split(str, "|")
			if len(f) != 4 {
				return fmt.Errorf("pending transfer %s of %s: record %q malformed", xid, campaignID, str)
			}
			units, err1 := strconv.ParseInt(f[1], 10, 64)
			to, err2 := strconv.Atoi(f[2])
			epoch, err3 := strconv.ParseInt(f[3], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil || to < 0 || to >= n {
				return fmt.Errorf("pending transfer %s of %s: record %q malformed", xid, campaignID, str)
			}
			if err := s.completeTransfer(ctx, campaignID, n, from, to, epoch, xid, units); err != nil {
				s.observeTransfer("failed", 0)
				return err
			}
			s.observeTransfer("recovered", units)
		}
	}
	return nil
}
