package store

import (
	"context"
	"fmt"

	"github.com/flashsale/flashsale/model"
)

// MarkDurable raises tag's durable mark to made, the highest decision
// number of a batch decided under epoch (model.DeductReply), once the
// batch's orders are stored in MySQL: the batch's successes are then shown
// to shoppers (storedResult.shown). It refuses with model.ErrLedgerMoved
// when a load put the tag under another epoch since, and with
// model.ErrNotLoaded when Redis lost it; both are holds, and the batch
// decided again needs no mark (a load restores its successes durable).
//
// The mark stands for every success numbered up to it because a tag's
// batches are decided and finished in order: a tag is one queue partition's
// key, a partition hands out one batch at a time, and a pipelining
// consumer runs a batch's Finish only after the one before it succeeded,
// redelivering every later batch when one fails (queue.PipelineHandler).
// So when a batch raises the mark, every batch decided before it was
// stored first.
func (s *Store) MarkDurable(ctx context.Context, tag string, made int64, epoch model.Epoch) error {
	k := campaignKeys(tag)
	code, err := s.durable.Run(ctx, s.rdb, []string{k.counters, k.meta}, made, int64(epoch)).Int64()
	if err != nil {
		return fmt.Errorf("durable mark %s: %w", tag, unavailable(err))
	}
	switch code {
	case 1:
		return nil
	case 0:
		return fmt.Errorf("durable mark %s at %d: %w", tag, made, model.ErrLedgerMoved)
	case -1:
		return fmt.Errorf("durable mark %s: %w", tag, model.ErrNotLoaded)
	}
	return fmt.Errorf("durable mark %s: reply %d, want 1, 0 or -1", tag, code)
}
