package notifier

import (
	"context"
	"sync"

	"github.com/flashsale/flashsale/model"
)

// lookups reads the stored results that subscribe frames ask for, several
// frames of any connections in one round trip: a frame that arrives while
// maxLookupFlights round trips are under way waits, and the next round trip
// carries every frame waiting by then. Nothing lingers: a frame that finds a
// round trip free goes at once, so batches form only under load, where a
// socket per purchase otherwise paid a Redis round trip per frame
// (docs/BENCHMARKS.md, round 9).
type lookups struct {
	src ResultSource
	// life bounds every round trip (with storeTimeout): one carries
	// several frames, so none of their contexts may end it.
	life context.Context

	mu      sync.Mutex
	waiting []*lookup
	flights int // round trips under way, or about to be
}

// lookup is one frame's read.
type lookup struct {
	ids     []string
	results []model.Result
	err     error
	done    chan struct{}
}

const (
	// maxLookupFlights bounds the round trips under way at once.
	maxLookupFlights = 2
	// maxLookupIDs bounds the request ids of one round trip (a frame
	// carries at most MaxSubscriptionsPerConn; a bigger one goes alone).
	maxLookupIDs = 1024
)

func newLookups(life context.Context, src ResultSource) *lookups {
	return &lookups{src: src, life: life}
}

// results returns the stored results of ids, in order, as
// ResultSource.Results does.
func (l *lookups) results(ids []string) ([]model.Result, error) {
	lk := &lookup{ids: ids, done: make(chan struct{})}
	l.mu.Lock()
	l.waiting = append(l.waiting, lk)
	lead := l.flights < maxLookupFlights
	if lead {
		l.flights++
	}
	l.mu.Unlock()
	if lead {
		l.fly()
	}
	<-lk.done
	return lk.results, lk.err
}

// fly makes one round trip for the frames waiting, then hands the flight on
// to a new goroutine if more came meanwhile, so no caller serves others for
// longer than one round trip.
func (l *lookups) fly() {
	l.mu.Lock()
	batch, n := l.waiting, 0
	for i, lk := range batch {
		if i > 0 && n+len(lk.ids) > maxLookupIDs {
			batch = batch[:i]
			break
		}
		n += len(lk.ids)
	}
	l.waiting = l.waiting[len(batch):]
	if len(l.waiting) == 0 {
		l.waiting = nil
	}
	if len(batch) == 0 { // another flight took them
		l.flights--
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()

	ids := batch[0].ids
	if len(batch) > 1 {
		ids = make([]string, 0, n)
		for _, lk := range batch {
			ids = append(ids, lk.ids...)
		}
	}
	ctx, cancel := context.WithTimeout(l.life, storeTimeout)
	results, err := l.src.Results(ctx, ids)
	cancel()
	at := 0
	for _, lk := range batch {
		if err != nil {
			lk.err = err
		} else {
			lk.results = results[at : at+len(lk.ids) : at+len(lk.ids)]
		}
		at += len(lk.ids)
		close(lk.done)
	}

	l.mu.Lock()
	more := len(l.waiting) > 0
	if !more {
		l.flights--
	}
	l.mu.Unlock()
	if more {
		go l.fly()
	}
}
