package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The final re-read: once the sale settled, every request a shopper was
// told succeeded is polled once more, and so is every admitted request
// still without a final result. A success that now reads otherwise (another
// status, another order, 404) was retracted: a fault made the store forget
// or rewrite what a shopper was already told, and the run fails. An
// unfinished request that now reads 404 vanished: its 202 said queued.

// rereadAfter: the notifier answers a final result polled within the last
// second from memory (resultCacheTTL in notifier/notifier.go); the re-read
// waits that out after the last poll so it reads what Redis holds now.
const rereadAfter = time.Second + 100*time.Millisecond

// rereadWorkers bounds the re-read's polls in flight, and rereadPause is
// the wait before another try when an answer names no Retry-After.
const (
	rereadWorkers = 32
	rereadPause   = 250 * time.Millisecond
)

// maxSampleIDs bounds the request ids a report lists for one finding.
const maxSampleIDs = 10

// rereadCounts is what the re-read found; the recorder keeps it.
type rereadCounts struct {
	done       bool
	successes  int // successes re-read
	confirmed  int
	unread     int            // requests the re-read got no 200 or 404 for
	finalLate  map[string]int // unfinished requests final at the re-read, by status
	vanished   []string       // unfinished requests that read 404
	unfinished map[string]bool
}

// reread is one request to read again: the success its shopper was told,
// or (told.Status "") an admitted request without a final result.
type reread struct {
	rid, user string
	told      finalResult
}

// toReread lists the requests told success and the admitted requests with
// no final result, in request id order.
func (r *recorder) toReread() []reread {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []reread
	for rid, user := range r.owner {
		res, ok := r.results[rid]
		switch {
		case !ok:
			out = append(out, reread{rid: rid, user: user})
		case res.Status == "success":
			out = append(out, reread{rid: rid, user: user, told: res})
		}
	}
	slices.SortFunc(out, func(a, b reread) int { return strings.Compare(a.rid, b.rid) })
	return out
}

// lastPoll is when the last poll was answered (zero: none was).
func (r *recorder) lastPoll() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastPollAt
}

// reread polls every request of toReread once more, as its shopper, within
// --settle; a 429 or 503 is tried again after its Retry-After.
func (lt *loadtest) reread(ctx context.Context, shoppers []*shopper) {
	items := lt.rec.toReread()
	if len(items) == 0 {
		lt.rec.rereadDone()
		return
	}
	if last := lt.rec.lastPoll(); !last.IsZero() {
		sleepUntil(ctx, last.Add(rereadAfter))
	}
	lt.say("re-reading %d requests (successes and unfinished)", len(items))
	byUser := make(map[string]*shopper, len(shoppers))
	for _, s := range shoppers {
		byUser[s.user] = s
	}
	deadline := time.Now().Add(lt.o.settle)
	next := make(chan reread)
	var wg sync.WaitGroup
	for range min(rereadWorkers, len(items)) {
		wg.Go(func() {
			for it := range next {
				lt.rec.rereadAnswer(it, lt.readAgain(ctx, byUser[it.user], it.rid, deadline))
			}
		})
	}
	for _, it := range items {
		next <- it
	}
	close(next)
	wg.Wait()
	lt.rec.rereadDone()
}

// readAgain polls rid until the notifier answers 200 or 404, or deadline.
func (lt *loadtest) readAgain(ctx context.Context, s *shopper, rid string, deadline time.Time) pollAnswer {
	for {
		a := lt.poll(ctx, s, rid)
		if a.status == http.StatusOK && a.err == nil || a.status == http.StatusNotFound {
			return a
		}
		next := time.Now().Add(max(a.retryAfter, rereadPause))
		if next.After(deadline) || !sleepUntil(ctx, next) {
			return a
		}
	}
}

// rereadAnswer records what the re-read of it answered.
func (r *recorder) rereadAnswer(it reread, a pollAnswer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rc := &r.reread
	if rc.finalLate == nil {
		rc.finalLate, rc.unfinished = map[string]int{}, map[string]bool{}
	}
	read := a.status == http.StatusOK && a.err == nil
	if it.told.Status == "success" {
		rc.successes++
		switch {
		case read && a.result.Status == "success" && a.result.OrderID == it.told.OrderID:
			rc.confirmed++
		case read:
			r.retract(it.told, a.result.Status+" "+a.result.OrderID)
		case a.status == http.StatusNotFound:
			r.retract(it.told, "404")
		default:
			rc.unread++
		}
		return
	}
	switch {
	case read && a.result.final():
		rc.finalLate[a.result.Status]++
		return
	case a.status == http.StatusNotFound:
		rc.vanished = append(rc.vanished, it.rid)
	case !read:
		rc.unread++
	}
	rc.unfinished[it.rid] = true
}

func (r *recorder) rereadDone() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reread.done = true
}

// retract records that the success told was contradicted by now (the
// first contradiction of a request); the caller holds r.mu.
func (r *recorder) retract(told finalResult, now string) {
	if _, seen := r.retracted[told.RequestID]; !seen {
		r.retracted[told.RequestID] = fmt.Sprintf("%s (success, order %s; then %s)", told.RequestID, told.OrderID, now)
	}
}

// rereadReport is what the final re-read found.
type rereadReport struct {
	// Done: the re-read ran (it does once the sale settled).
	Done bool `json:"done"`
	// Successes re-read, and those that read the same success again.
	Successes int `json:"successes"`
	Confirmed int `json:"confirmed"`
	// Retracted: successes told, then read otherwise, with what was read;
	// each fails the run.
	Retracted       int      `json:"retracted"`
	RetractedSample []string `json:"retracted_sample,omitempty"`
	// Unread: requests that got neither a 200 nor a 404 within --settle.
	Unread int `json:"unread"`
}

// unfinishedReport is the admitted requests (a 202, or the 200 of a replay
// whose first answer was lost) that never reached a final result, neither
// within --settle nor at the re-read.
type unfinishedReport struct {
	Count  int      `json:"count"`
	Sample []string `json:"sample,omitempty"`
	// Vanished: of those, the requests the re-read found gone (404),
	// although their 202 said queued.
	Vanished       int      `json:"vanished"`
	VanishedSample []string `json:"vanished_sample,omitempty"`
	// FinalAtReread: requests with no final result within --settle that
	// had one at the re-read, by status (still missing for the invariant).
	FinalAtReread map[string]int `json:"final_at_reread,omitempty"`
}

// rereadReports computes the two reports; the caller holds r.mu.
func (r *recorder) rereadReports() (rereadReport, unfinishedReport) {
	rc := r.reread
	rr := rereadReport{Done: rc.done, Successes: rc.successes, Confirmed: rc.confirmed, Retracted: len(r.retracted), Unread: rc.unread}
	rr.RetractedSample = sample(slices.Collect(maps.Values(r.retracted)))
	var open []string
	for rid := range r.owner {
		if _, ok := r.results[rid]; ok {
			continue
		}
		// Before the re-read (or without it) every request without a
		// result is unfinished.
		if !rc.done || rc.unfinished[rid] {
			open = append(open, rid)
		}
	}
	u := unfinishedReport{Count: len(open), Sample: sample(open), Vanished: len(rc.vanished), VanishedSample: sample(rc.vanished)}
	if len(rc.finalLate) > 0 {
		u.FinalAtReread = rc.finalLate
	}
	return rr, u
}

// sample is up to maxSampleIDs of ids, sorted.
func sample(ids []string) []string {
	if len(ids) == 0 {
		return nil
	}
	s := slices.Clone(ids)
	slices.Sort(s)
	return s[:min(len(s), maxSampleIDs)]
}

// retractionInvariant: no shopper told success is later told otherwise.
func (r *recorder) retractionInvariant() invariant {
	rc := r.reread
	detail := fmt.Sprintf("re-read %d successes: %d confirmed, %d retracted, %d unread", rc.successes, rc.confirmed, len(r.retracted), rc.unread)
	if !rc.done {
		detail = "not re-read; " + detail
	}
	if len(r.retracted) > 0 {
		detail += ": " + strings.Join(sample(slices.Collect(maps.Values(r.retracted))), ", ")
	}
	return invariant{Name: "no success retracted", OK: len(r.retracted) == 0, Detail: detail}
}
