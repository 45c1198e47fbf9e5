package main

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/internal/config"
)

// handBackEvery is how often a gateway or worker in degraded mode looks
// for campaigns MySQL decides while it sees Redis answer.
const handBackEvery = time.Second

// handBack hands every campaign MySQL decides (degraded mode) back to
// Redis once this process sees Redis answer: the restore loads Redis from
// MySQL under a new epoch, which counts the units MySQL sold and makes
// Redis the decider again. Purchases and batches hand back the campaigns
// they touch themselves; this covers one nobody touches (sold out in MySQL:
// the gateways refuse from memory), so Redis agrees with MySQL again, and
// ends the outage for this process's gateway and worker, whose campaigns
// would otherwise count as decided in MySQL until a purchase or batch
// came.
func (s *system) handBack(ctx context.Context) error {
	if s.cfg.Degrade != config.DegradeMySQL || s.restorer == nil {
		return nil
	}
	t := time.NewTicker(handBackEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if s.redisGuard.Down() {
			continue
		}
		ids, err := s.db.CampaignsDecidedInMySQL(ctx)
		if err != nil {
			continue // MySQL is out too: the next tick tries again
		}
		for _, id := range ids {
			_, _ = s.restorer.Restore(ctx, id, "handback") // logs its failure, bounds its attempts
		}
		if s.gateway != nil {
			s.gateway.RedisAnswers()
		}
		if s.worker != nil {
			if len(ids) > 0 {
				if ids, err = s.db.CampaignsDecidedInMySQL(ctx); err != nil {
					continue
				}
			}
			s.worker.RedisAnswers(ids)
		}
	}
}
