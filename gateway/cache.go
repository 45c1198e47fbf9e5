package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/model"
)

// The gateway's copy of the campaigns it is asked about. Anyone may ask
// about any id (GET /api/v1/campaigns/{id} needs no token), so the copy is
// bounded twice over: campaigns that exist are few and only admins create
// them; ids that name nothing are unbounded, so they get a fixed-size ring
// whose oldest entry makes room, and their answer (not found) is trusted
// for the campaign cache TTL only. No insert scans the cache. Such an id
// costs no MySQL read of its own either: the directory of every campaign
// id answers (directory.go).

// fresh reports whether snap may still be used at now.
func (s *Service) fresh(snap *campaignSnapshot, now time.Time) bool {
	return snap != nil && now.Sub(snap.loadedAt) < s.opts.CampaignCacheTTL
}

// campaign returns the cached campaign, loading it when missing or stale.
// The fast path takes a read lock and an atomic load only.
func (s *Service) campaign(ctx context.Context, id string) (*cachedCampaign, model.Campaign, error) {
	cc := s.cache.getOrAdd(id)
	if snap := cc.snap.Load(); s.fresh(snap, s.opts.Now()) {
		return cc, snap.campaign, snap.err
	}

	cc.refreshMu.Lock()
	defer cc.refreshMu.Unlock()
	old := cc.snap.Load()
	if s.fresh(old, s.opts.Now()) { // another request reloaded it meanwhile
		return cc, old.campaign, old.err
	}
	var c model.Campaign
	var err error
	if (old == nil || old.err != nil) && s.absent(ctx, id) {
		// Never found: the directory answers for MySQL (directory.go).
		err = model.ErrNotFound
	} else {
		c, err = s.lookup(ctx, id)
	}
	next := &campaignSnapshot{loadedAt: s.opts.Now()}
	switch {
	case errors.Is(err, model.ErrNotFound):
		next.err = model.ErrNotFound
	case err != nil:
		// Serve the last good copy rather than refuse purchases on a DB blip.
		if old != nil && old.err == nil {
			return cc, old.campaign, nil
		}
		return nil, model.Campaign{}, fmt.Errorf("load campaign %s: %w: %v", id, model.ErrUnavailable, err)
	default:
		next.campaign = c
		switch {
		case !s.opts.RedisDown():
			if flag, ferr := s.stock.SoldOut(ctx, id); ferr == nil {
				cc.soldOut.Store(flag)
			}
		case c.DecidedInMySQL:
			// MySQL's count is the flag while it decides (degraded.go): a
			// unit given back lowers it.
			cc.soldOut.Store(c.UnitsHeld >= c.Stock)
		} // else the flag stays as last known
	}
	cc.snap.Store(next)
	if next.err == nil {
		s.cache.promote(cc)
	}
	return cc, next.campaign, next.err
}

// lookup reads campaign id from the relational store. Ids are exact
// strings: a campaign stored under another spelling (a store comparing
// without case, as MySQL's default collations do) is not this one, or B1
// would be served b1's sale under B1's Redis keys.
func (s *Service) lookup(ctx context.Context, id string) (model.Campaign, error) {
	c, err := s.campaigns.Campaign(ctx, id)
	if err == nil && c.ID != id {
		return model.Campaign{}, fmt.Errorf("campaign %s: stored as %s: %w", id, c.ID, model.ErrNotFound)
	}
	return c, err
}

// cachedCampaign keeps what admitting needs of a campaign in memory, so the
// hot path touches neither MySQL nor (once sold out) Redis. Readers take an
// immutable snapshot without locking: every purchase reads it.
type cachedCampaign struct {
	id        string
	snap      atomic.Pointer[campaignSnapshot] // nil until first loaded
	soldOut   atomic.Bool
	refreshMu sync.Mutex // one reload at a time
	// remaining is the approximate units left the public view shows (-1:
	// not loaded), read at remainingAt (unix ns) by one caller at a time.
	remaining   atomic.Int64
	remainingAt atomic.Int64
	remainingMu sync.Mutex
}

type campaignSnapshot struct {
	campaign model.Campaign
	err      error // model.ErrNotFound is cached too, against bots probing ids
	loadedAt time.Time
}

// campaignCache holds the cached campaigns: known ones (a load found them)
// and unknown ones (not found, or not loaded yet).
type campaignCache struct {
	mu      sync.RWMutex
	known   map[string]*cachedCampaign
	unknown map[string]*cachedCampaign
	// ring is unknown's entries in the order they came: the next insert
	// overwrites ring[next], the oldest, and drops it from unknown unless
	// it left for known meanwhile.
	ring     []*cachedCampaign
	next     int
	maxKnown int
	size     *prometheus.GaugeVec // kind: known, unknown
}

func newCampaignCache(maxKnown, maxUnknown int, size *prometheus.GaugeVec) *campaignCache {
	return &campaignCache{known: map[string]*cachedCampaign{}, unknown: map[string]*cachedCampaign{},
		ring: make([]*cachedCampaign, maxUnknown), maxKnown: maxKnown, size: size}
}

// get returns id's entry, or nil.
func (c *campaignCache) get(id string) *cachedCampaign {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if cc := c.known[id]; cc != nil {
		return cc
	}
	return c.unknown[id]
}

// getOrAdd returns id's entry, adding an unknown one when there is none:
// concurrent first requests for an id share it, and its refreshMu, so they
// load the campaign once.
func (c *campaignCache) getOrAdd(id string) *cachedCampaign {
	if cc := c.get(id); cc != nil {
		return cc
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.known[id]; cc != nil {
		return cc
	}
	if cc := c.unknown[id]; cc != nil {
		return cc
	}
	if old := c.ring[c.next]; old != nil && c.unknown[old.id] == old {
		delete(c.unknown, old.id)
	}
	cc := &cachedCampaign{id: id}
	c.ring[c.next] = cc
	c.next = (c.next + 1) % len(c.ring)
	c.unknown[id] = cc
	c.updateSize()
	return cc
}

// promote moves cc to the known campaigns once a load found it. Past
// maxKnown an arbitrary known entry makes room: only admins create
// campaigns, so that is a deployment with more live campaigns than the
// cache, and the one dropped is merely loaded again when next asked for.
func (c *campaignCache) promote(cc *cachedCampaign) {
	c.mu.RLock()
	done := c.known[cc.id] == cc
	c.mu.RUnlock()
	if done { // every reload of a known campaign comes here
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unknown[cc.id] == cc {
		delete(c.unknown, cc.id)
	}
	if c.known[cc.id] == nil {
		for id := range c.known {
			if len(c.known) < c.maxKnown {
				break
			}
			delete(c.known, id)
		}
		c.known[cc.id] = cc
	}
	c.updateSize()
}

// updateSize publishes the entry counts; c.mu must be held for writing.
func (c *campaignCache) updateSize() {
	c.size.WithLabelValues("known").Set(float64(len(c.known)))
	c.size.WithLabelValues("unknown").Set(float64(len(c.unknown)))
}

// len returns the counts of known and unknown entries.
func (c *campaignCache) len() (known, unknown int) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.known), len(c.unknown)
}

// selling returns the known campaigns whose sale is open at now: the only
// ones whose sold-out flag decides anything.
func (c *campaignCache) selling(now time.Time) []*cachedCampaign {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []*cachedCampaign
	for _, cc := range c.known {
		if snap := cc.snap.Load(); snap != nil && snap.err == nil && snap.campaign.Window(now) == nil {
			out = append(out, cc)
		}
	}
	return out
}
