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

// A transfer is two scripts on two slots, keyed by a transfer id: take.lua
// takes units from the donor and records them pending there; give.lua adds
// them to the recipient unless it already received that id; settle.lua then
// marks it done on the donor. A crash between the steps leaves the pending
// record, which the next scan of the campaign completes (recoverPending):
// the units are never lost, and never given twice. Each step is fenced by
// the campaign's epoch: a rebuild writes every bucket from the ledger and
// voids older transfers.

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
			rec, ok := parseTransferRecord(str, n)
			if !ok {
				return fmt.Errorf("pending transfer %s of %s: record %q malformed", xid, campaignID, str)
			}
			if err := s.completeTransfer(ctx, campaignID, n, from, rec.to, rec.epoch, xid, rec.units); err != nil {
				s.observeTransfer("failed", 0)
				return err
			}
			s.observeTransfer("recovered", rec.units)
		}
	}
	return nil
}

// transferRecord is a transfer in its donor's xfer hash,
// "state|units|to|epoch": take.lua writes it pending, settle.lua sets its
// state (done or void).
type transferRecord struct {
	state        string
	units, epoch int64
	to           int // the recipient bucket, of n
}

// parseTransferRecord reads a transfer record of a campaign of n buckets.
func parseTransferRecord(s string, n int) (transferRecord, bool) {
	f := strings.Split(s, "|")
	if len(f) != 4 {
		return transferRecord{}, false
	}
	units, err1 := strconv.ParseInt(f[1], 10, 64)
	to, err2 := strconv.Atoi(f[2])
	epoch, err3 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || to < 0 || to >= n {
		return transferRecord{}, false
	}
	return transferRecord{state: f[0], units: units, epoch: epoch, to: to}, true
}
