package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// Withdraw takes back the admitted requests whose publish failed, in one
// pipelined round trip: their queued results, their count and their
// Idempotency-Keys go, so a retry is a new request. A result a worker already
// decided stands. It returns the errors of the requests it could not withdraw.
func (s *Store) Withdraw(ctx context.Context, batch []model.AdmitRequest) error {
	if len(batch) == 0 {
		return nil
	}
	// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT, and this is
	// the rare failure path where sending the source costs nothing that
	// matters.
	cmds, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, a := range batch {
			k := campaignKeys(a.KeyTag())
			s.withdraw.Eval(ctx, p, []string{k.results, k.idem, k.counters}, a.RequestID, idemField(a.UserID, a.IdempotencyKey))
		}
		return nil
	})
	if err == nil {
		return nil
	}
	var errs []error
	for i, c := range cmds {
		if c.Err() != nil {
			errs = append(errs, fmt.Errorf("withdraw %s: %w", batch[i].RequestID, c.Err()))
		}
	}
	if len(errs) == 0 {
		errs = append(errs, fmt.Errorf("withdraw %d requests: %w", len(batch), err))
	}
	return errors.Join(errs...)
}
