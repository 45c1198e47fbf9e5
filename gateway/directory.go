package gateway

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// directory is the set of every campaign id, read from MySQL in one query
// at most once per campaign cache TTL, so that an id naming no campaign is
// answered without a MySQL read of its own: anyone may send any id, at any
// rate, and distinct ids would pass the ring of unknown ones. Past
// CachedCampaigns campaigns it is off, and each unknown id is looked up
// as before. An event that a campaign changed (created, deleted) drops it,
// on every gateway.
type directory struct {
	mu   sync.Mutex // one read at a time
	snap atomic.Pointer[directorySnapshot]
}

type directorySnapshot struct {
	ids      map[string]struct{}
	complete bool // every campaign is in ids
	loadedAt time.Time
}

// drop makes the next question read the directory again.
func (d *directory) drop() { d.snap.Store(nil) }

// absent reports whether campaign id does not exist, by a directory read
// within the campaign cache TTL (reading it again when older). False when
// the directory cannot tell (off, or its last read failed): the caller
// looks the id up.
func (s *Service) absent(ctx context.Context, id string) bool {
	snap := s.dir.snap.Load()
	if snap == nil || s.opts.Now().Sub(snap.loadedAt) >= s.opts.CampaignCacheTTL {
		snap = s.readDirectory(ctx)
	}
	if snap == nil || !snap.complete {
		return false
	}
	_, ok := snap.ids[id]
	return !ok
}

// readDirectory reads the directory unless a concurrent caller just did.
func (s *Service) readDirectory(ctx context.Context) *directorySnapshot {
	s.dir.mu.Lock()
	defer s.dir.mu.Unlock()
	now := s.opts.Now()
	if snap := s.dir.snap.Load(); snap != nil && now.Sub(snap.loadedAt) < s.opts.CampaignCacheTTL {
		return snap
	}
	ids, err := s.campaigns.CampaignIDs(ctx, s.opts.CachedCampaigns)
	if err != nil {
		// Tried again a TTL later, not at every unknown id: one line per
		// TTL while MySQL fails, and ids are looked up one by one.
		s.log.Warn("read the campaign ids; unknown ids are looked up one by one meanwhile", "err", err)
		snap := &directorySnapshot{loadedAt: now}
		s.dir.snap.Store(snap)
		return snap
	}
	snap := &directorySnapshot{ids: make(map[string]struct{}, len(ids)), complete: len(ids) <= s.opts.CachedCampaigns, loadedAt: now}
	for _, id := range ids {
		snap.ids[id] = struct{}{}
	}
	s.dir.snap.Store(snap)
	return snap
}
