package notifier

import (
	"context"
	"sync"
	"time"

	"github.com/flashsale/flashsale/model"
)

// The queue position of a waiting request: the poll answer carries "ahead"
// and "eta_ms" while it is queued, and every ProgressInterval each waiting
// subscription gets
//
//	server: {"type":"progress","request_id":"<id>","ahead":<n>,"eta_ms":<ms>}
//
// until its result frame, never after it. ahead counts the requests of its
// campaign admitted before it and not decided yet (model.QueueProgress) and
// never goes up for a subscription; eta_ms is ahead at the campaign's
// measured decision rate, 0 while none was measured.

type progressFrame struct {
	Type      string `json:"type"`
	RequestID string `json:"request_id"`
	Ahead     int64  `json:"ahead"`
	ETAMs     int64  `json:"eta_ms"`
}

// progressCacheTTL is how long a campaign's progress read answers polls: a
// crowd polling one campaign costs a read per TTL, not one per poll.
const (
	progressCacheTTL  = 500 * time.Millisecond
	progressCacheSize = 1000
)

// progressCache keeps each campaign's last read progress. The watermark
// only goes up, so an older read never replaces a newer one.
type progressCache struct {
	mu sync.Mutex
	m  map[string]progressRead
}

type progressRead struct {
	p  model.QueueProgress
	at time.Time
}

func (c *progressCache) get(campaignID string, now time.Time) (model.QueueProgress, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.m[campaignID]
	if !ok || now.Sub(r.at) > progressCacheTTL {
		return model.QueueProgress{}, false
	}
	return r.p, true
}

func (c *progressCache) put(campaignID string, p model.QueueProgress, now time.Time) model.QueueProgress {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= progressCacheSize {
		c.m = map[string]progressRead{}
	}
	if old, ok := c.m[campaignID]; ok && old.p.Decided > p.Decided {
		p.Decided = old.p.Decided
	}
	c.m[campaignID] = progressRead{p: p, at: now}
	return p
}

// position returns the queue position of a queued result r (ok false when
// r is final, has no sequence number, or its campaign's progress cannot be
// read now: the answer then goes without it).
func (n *Notifier) position(ctx context.Context, r model.Result) (ahead int64, eta time.Duration, ok bool) {
	if r.Status != model.StatusQueued || r.Seq < 1 {
		return 0, 0, false
	}
	now := time.Now()
	// Sequence numbers are per bucket in a campaign of several.
	tag, tagged := model.TagOfRequest(r.RequestID)
	if !tagged {
		tag = r.CampaignID
	}
	p, ok := n.progress.get(tag, now)
	if !ok {
		rctx, cancel := context.WithTimeout(ctx, storeTimeout)
		ps, err := n.src.Progress(rctx, []string{tag})
		cancel()
		if err != nil {
			n.log.Warn("read queue progress", "campaign_id", r.CampaignID, "err", err)
			return 0, 0, false
		}
		p = n.progress.put(tag, ps[0], now)
	}
	ahead = p.Ahead(r.Seq)
	return ahead, p.ETA(ahead), true
}

// progressLoop sends the waiting subscriptions their progress frames.
func (n *Notifier) progressLoop(ctx context.Context) {
	every(ctx, n.opts.ProgressInterval, func() { n.sendProgress(ctx) })
}

// waiting is one request id with active subscriptions and a sequence
// number, as the hub held it at the start of a tick.
type waiting struct {
	e     *entry
	seq   int64
	fresh bool
	subs  []*subscription
}

// waiting returns the request ids that wait with a known sequence number:
// the hub's check order holds exactly the entries with active
// subscriptions, so this costs what waits.
func (h *hub) waiting() []waiting {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []waiting
	for e := h.oldest; e != nil; e = e.next {
		if e.seq < 1 {
			continue
		}
		w := waiting{e: e, seq: e.seq, fresh: e.fresh}
		e.fresh = false
		for s := range e.subs {
			if s.state == subActive {
				w.subs = append(w.subs, s)
			}
		}
		out = append(out, w)
	}
	return out
}

// progressRound is what the last round of progress frames saw; only the
// progress loop touches it.
type progressRound struct {
	activations uint64
	campaigns   []string
	decided     []int64
}

// unchanged reports whether a round now would send nothing: no subscription
// turned active since the last one, and no campaign it saw decided more.
// It reads those campaigns' progress (one round trip), so that a waiting
// crowd costs a tick O(campaigns), not O(connections).
func (n *Notifier) unchanged(ctx context.Context, activations uint64) bool {
	last := &n.lastProgress
	if activations != last.activations {
		return false
	}
	if len(last.campaigns) == 0 {
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, storeTimeout)
	ps, err := n.src.Progress(rctx, last.campaigns)
	cancel()
	if err != nil {
		return false // the round reads again and logs
	}
	for i, p := range ps {
		if p.Decided != last.decided[i] {
			return false
		}
	}
	return true
}

// sendProgress reads the progress of every campaign with waiting
// subscriptions in one round trip and queues a progress frame for each
// request whose count moved, or whose subscription is new: a frame a
// second per waiting socket would wake a whole idle crowd every second.
func (n *Notifier) sendProgress(ctx context.Context) {
	n.progressRounds.Add(1)
	activations := n.hub.activationCount()
	if n.unchanged(ctx, activations) {
		return
	}
	ws := n.hub.waiting()
	if len(ws) == 0 {
		n.lastProgress = progressRound{activations: activations}
		return
	}
	index := map[string]int{}
	var campaigns []string
	for _, w := range ws {
		c, _ := model.TagOfRequest(w.e.requestID) // numbers are per bucket
		if _, ok := index[c]; !ok {
			index[c] = len(campaigns)
			campaigns = append(campaigns, c)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, storeTimeout)
	ps, err := n.src.Progress(rctx, campaigns)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("read queue progress", "campaigns", len(campaigns), "err", err)
		}
		return // the next tick tries again
	}
	now := time.Now()
	decided := make([]int64, len(campaigns))
	for i, c := range campaigns {
		ps[i] = n.progress.put(c, ps[i], now)
		decided[i] = ps[i].Decided
	}
	n.lastProgress = progressRound{activations: activations, campaigns: campaigns, decided: decided}
	for _, w := range ws {
		c, _ := model.TagOfRequest(w.e.requestID) // numbers are per bucket
		p := ps[index[c]]
		ahead := p.Ahead(w.seq)
		if w.e.ahead >= 0 && w.e.ahead < ahead {
			ahead = w.e.ahead // a reload starts the numbers again; never go up
		}
		if ahead == w.e.ahead && !w.fresh {
			continue
		}
		w.e.ahead = ahead
		data := encodeFrame(progressFrame{Type: "progress", RequestID: w.e.requestID, Ahead: ahead,
			ETAMs: p.ETA(ahead).Milliseconds()})
		for _, s := range w.subs {
			n.pushProgress(s, data)
		}
	}
}

// pushProgress queues a progress frame for s unless its subscription ended
// (its result frame may be queued already) or its connection is busy: a
// progress frame is worth less than the connection, and the next tick sends
// a fresher one.
func (n *Notifier) pushProgress(s *subscription, data []byte) {
	c := s.conn
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.ended.Load() || c.stopped.Load() || len(c.queue) >= c.sendBuffer/2 {
		return
	}
	c.queue = append(c.queue, outMsg{data: data})
	n.startWriterLocked(c)
}
