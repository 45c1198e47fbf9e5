package notifier

import (
	"context"
	"sync"
	"time"

	"github.com/flashsale/flashsale/model"
)

// feedLinger is how long a campaign's results subscription outlives its last
// waiter: a shopper who reconnects or buys again soon finds it up, and a
// campaign whose waiters come and go does not cost a SSUBSCRIBE and
// SUNSUBSCRIBE each time.
const feedLinger = 30 * time.Second

// feeds keeps one results subscription (a sharded channel, on the shard
// that decides it) per tag a local shopper waits on: a campaign, or each
// bucket of a campaign of several (model.TagOfRequest), so a notifier
// receives the results of its shoppers' campaigns and no others, and a hot
// bucketed campaign's results come from every shard that decides them.
type feeds struct {
	n      *Notifier
	linger time.Duration

	mu sync.Mutex
	// ctx is Run's context while Run runs; nil before and after, when no
	// feed is started.
	ctx   context.Context
	byTag map[string]*feed
	// failing counts the feeds whose last attempt to subscribe failed.
	failing int
	wg      sync.WaitGroup
}

// feed is the results subscription of one tag.
type feed struct {
	cancel context.CancelFunc
	// tried is closed when the first attempt to subscribe ends: confirmed
	// by Redis, or failed (then waiters need not wait for the retries).
	tried     chan struct{}
	triedOnce sync.Once
	// idleSince is when the sweep first saw the tag without a waiter,
	// zero while it has one.
	idleSince time.Time
	failing   bool // guarded by feeds.mu
}

func newFeeds(n *Notifier, linger time.Duration) *feeds {
	if linger <= 0 {
		linger = feedLinger
	}
	return &feeds{n: n, linger: linger, byTag: map[string]*feed{}}
}

// run starts feeds on demand until ctx ends, and ends those that lost their
// last waiter more than linger ago. It returns once every feed stopped.
func (f *feeds) run(ctx context.Context) {
	f.mu.Lock()
	f.ctx = ctx
	f.mu.Unlock()
	every(ctx, max(f.linger/4, 10*time.Millisecond), func() { f.sweep(time.Now()) })
	f.mu.Lock()
	f.ctx = nil
	for tag, fd := range f.byTag {
		fd.cancel()
		delete(f.byTag, tag)
	}
	f.n.metrics.ResultsChannels.Set(0)
	f.failing = 0
	f.mu.Unlock()
	f.wg.Wait()
}

// healthy reports whether run runs and no feed is failing to subscribe.
func (f *feeds) healthy() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ctx != nil && f.failing == 0
}

// count returns the number of tags subscribed to (for tests).
func (f *feeds) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.byTag)
}

// ensure makes sure the tags of ids are subscribed to and waits, at
// most until ctx ends, for each subscription's first confirmation (or its
// first failure: Redis is down, and the stored read will say so). Callers
// register their waiters in the hub first and read stored results after: a
// result published before the confirmation is then in the stored read, and
// one published after it reaches the hub.
func (f *feeds) ensure(ctx context.Context, ids []string) {
	var waits []chan struct{}
	seen := map[string]bool{}
	f.mu.Lock()
	for _, id := range ids {
		tag, ok := model.TagOfRequest(id)
		if !ok || seen[tag] {
			continue
		}
		seen[tag] = true
		fd := f.byTag[tag]
		if fd == nil {
			if fd = f.startLocked(tag); fd == nil {
				break // not running
			}
		}
		fd.idleSince = time.Time{}
		waits = append(waits, fd.tried)
	}
	f.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			// Redis is slow or down: the stored read and the re-check
			// loop still find the result, later.
			return
		}
	}
}

func (f *feeds) startLocked(tag string) *feed {
	if f.ctx == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(f.ctx)
	fd := &feed{cancel: cancel, tried: make(chan struct{})}
	f.byTag[tag] = fd
	f.n.metrics.ResultsChannels.Set(float64(len(f.byTag)))
	f.wg.Go(func() { f.keep(ctx, tag, fd) })
	return fd
}

// keep holds the subscription of one tag until ctx ends, subscribing again
// with backoff when it fails or the server ends it (the slot moved). Each
// confirmation after the first follows a gap in which results may have been
// published unseen: the tag's waiters re-read their stored results.
func (f *feeds) keep(ctx context.Context, tag string, fd *feed) {
	// gap: results may have been published unseen since the feed started
	// (a confirmation or an attempt came before).
	gap := false
	backoff := minBackoff
	for {
		var confirmed bool
		err := f.n.src.SubscribeResults(ctx, tag, func() {
			confirmed = true
			f.setFailing(tag, fd, false)
			fd.triedOnce.Do(func() { close(fd.tried) })
			if gap {
				f.n.recheckTag(ctx, tag)
			}
			gap = true
		}, f.n.published)
		if ctx.Err() != nil {
			return
		}
		gap = true
		if confirmed {
			backoff = minBackoff
		} else {
			f.setFailing(tag, fd, true)
			fd.triedOnce.Do(func() { close(fd.tried) })
		}
		f.n.log.Warn("results subscription ended; subscribing again", "tag", tag, "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (f *feeds) setFailing(tag string, fd *feed, failing bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fd.failing == failing || f.byTag[tag] != fd {
		return // unchanged, or the feed was ended and uncounted
	}
	fd.failing = failing
	if failing {
		f.failing++
	} else {
		f.failing--
	}
}

// sweep ends the feeds whose tag has had no waiter for linger.
func (f *feeds) sweep(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.byTag) == 0 {
		return
	}
	waiting := f.n.hub.tagsWaitedOn()
	for tag, fd := range f.byTag {
		switch {
		case waiting[tag]:
			fd.idleSince = time.Time{}
		case fd.idleSince.IsZero():
			fd.idleSince = now
		case now.Sub(fd.idleSince) >= f.linger:
			fd.cancel()
			if fd.failing {
				f.failing--
			}
			delete(f.byTag, tag)
		}
	}
	f.n.metrics.ResultsChannels.Set(float64(len(f.byTag)))
}
