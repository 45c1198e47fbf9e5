package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

const waitFor = 5 * time.Second

// recv returns the next value of ch, failing the test after waitFor.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		var zero T
		t.Fatalf("no %s within %v", what, waitFor)
		return zero
	}
}

// subscribed runs sub in the background until the test ends, waits until the
// subscription is confirmed, and checks at cleanup that sub returned nil once
// its context was cancelled.
func subscribed(t *testing.T, sub func(ctx context.Context, ready func()) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	// A results subscription confirms again after a reconnect.
	go func() { done <- sub(ctx, sync.OnceFunc(func() { close(ready) })) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("subscription returned %v, want nil after cancel", err)
			}
		case <-time.After(waitFor):
			t.Errorf("subscription still running %v after cancel", waitFor)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("subscription ended before ready: %v", err)
	case <-time.After(waitFor):
		t.Fatalf("subscription not ready within %v", waitFor)
	}
}

func TestEvents(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 1, 1)
		// The channel is shared by everything on this Redis: keep only this test's events.
		got := make(chan model.Event, 16)
		subscribed(t, func(ctx context.Context, ready func()) error {
			return s.SubscribeEvents(ctx, ready, func(e model.Event) {
				if strings.HasPrefix(e.CampaignID, c.ID) {
					got <- e
				}
			})
		})
		// Malformed payloads go first; pub/sub keeps order, so had they been
		// passed on they would arrive before the valid events.
		for _, p := range []string{string(model.EventSoldOut) + c.ID, string(model.EventReset) + " " + c.ID + "!", string(model.EventReset) + " " + c.ID + " x"} {
			if err := s.rdb.Publish(t.Context(), EventsChannel, p).Err(); err != nil {
				t.Fatalf("PUBLISH %q: %v", p, err)
			}
		}
		want := []model.Event{{Type: model.EventSoldOut, CampaignID: c.ID}, {Type: model.EventReset, CampaignID: c.ID}}
		for _, e := range want {
			if err := s.PublishEvent(t.Context(), e); err != nil {
				t.Fatalf("PublishEvent(%+v): %v", e, err)
			}
		}
		for i, w := range want {
			if e := recv(t, got, "event"); e != w {
				t.Errorf("event %d: got %+v, want %+v", i, e, w)
			}
		}
	})
}

// rawPublish sends payload on campaignID's results channel as PublishResults
// would, bypassing its encoding.
func rawPublish(t *testing.T, s *Store, campaignID, payload string) {
	t.Helper()
	var err error
	if s.plainResults {
		err = s.rdb.Publish(t.Context(), resultsChannel(campaignID), payload).Err()
	} else {
		err = s.rdb.SPublish(t.Context(), resultsChannel(campaignID), payload).Err()
	}
	if err != nil {
		t.Fatalf("publish %q: %v", payload, err)
	}
}

// rawMessages subscribes to campaignID's results channel with go-redis
// directly and returns its messages' payloads.
func rawMessages(t *testing.T, s *Store, campaignID string) <-chan string {
	t.Helper()
	var ps *redis.PubSub
	if s.plainResults {
		ps = s.rdb.Subscribe(t.Context(), resultsChannel(campaignID))
	} else {
		ps = s.rdb.SSubscribe(t.Context(), resultsChannel(campaignID))
	}
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(t.Context()); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	out := make(chan string, 1024)
	go func() {
		for m := range ps.Channel() {
			out <- m.Payload
		}
	}()
	return out
}

func TestResults(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 1, 1)
		got := make(chan model.Result, 16)
		subscribed(t, func(ctx context.Context, ready func()) error {
			return s.SubscribeResults(ctx, c.ID, ready, func(r model.Result) { got <- r })
		})
		for _, p := range []string{"not json", `{"campaign_id":"` + c.ID + `","status":"bogus"}`} {
			rawPublish(t, s, c.ID, p)
		}
		if err := s.PublishResults(t.Context(), nil); err != nil {
			t.Fatalf("PublishResults(nil): got %v, want nil", err)
		}
		at := time.Now().UTC().Truncate(time.Millisecond)
		want := []model.Result{
			{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u1", Status: model.StatusSuccess, OrderID: "o1", Quantity: 1, FinishedAt: at},
			{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u2", Status: model.StatusSoldOut, Quantity: 1, FinishedAt: at},
			{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "u3", Status: model.StatusRejected, Reason: model.ReasonInsufficientStock, Quantity: 2, FinishedAt: at},
		}
		if err := s.PublishResults(t.Context(), want); err != nil {
			t.Fatalf("PublishResults: %v", err)
		}
		for i, w := range want {
			r := recv(t, got, "result")
			if !r.FinishedAt.Equal(w.FinishedAt) {
				t.Errorf("result %d FinishedAt: got %v, want %v", i, r.FinishedAt, w.FinishedAt)
			}
			r.FinishedAt = w.FinishedAt
			if r != w {
				t.Errorf("result %d: got %+v, want %+v", i, r, w)
			}
		}
	})
}

// TestResultsShareMessages: a large batch of results reaches subscribers
// whole and in order, many results to a Redis message.
func TestResultsShareMessages(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 1, 1)
		const n = 2*resultsPerMessage + 3
		got := make(chan model.Result, n)
		subscribed(t, func(ctx context.Context, ready func()) error {
			return s.SubscribeResults(ctx, c.ID, ready, func(r model.Result) { got <- r })
		})
		messages := rawMessages(t, s, c.ID)
		want := make([]model.Result, n)
		for i := range want {
			want[i] = model.Result{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: fmt.Sprintf("u%d", i),
				Status: model.StatusSoldOut, Quantity: 1}
		}
		if err := s.PublishResults(t.Context(), want); err != nil {
			t.Fatalf("PublishResults: %v", err)
		}
		for i, w := range want {
			if r := recv(t, got, "result"); r != w {
				t.Fatalf("result %d: got %+v, want %+v", i, r, w)
			}
		}
		for range 3 {
			recv(t, messages, "message")
		}
		select {
		case <-messages:
			t.Errorf("got more than 3 messages for %d results", n)
		case <-time.After(50 * time.Millisecond):
		}
	})
}

// TestResultsPerCampaign: one batch with results of campaigns on every
// master of the cluster reaches each campaign's subscriber, and a subscriber
// receives its campaign's results and no other's.
func TestResultsPerCampaign(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		campaigns := campaignsOnEveryMaster(t, s)
		got := subscribeEach(t, s, campaigns)
		var batch []model.Result
		for round := range 2 {
			for _, c := range campaigns {
				batch = append(batch, model.Result{RequestID: newRequestID(c), CampaignID: c, UserID: fmt.Sprintf("u%d", round),
					Status: model.StatusSoldOut, Quantity: 1})
			}
		}
		if err := s.PublishResults(t.Context(), batch); err != nil {
			t.Fatalf("PublishResults: %v", err)
		}
		for i, c := range campaigns {
			for round := range 2 {
				r := recv(t, got[i], "result of "+c)
				if want := batch[round*len(campaigns)+i]; r != want {
					t.Errorf("campaign %d, result %d: got %+v, want %+v", i, round, r, want)
				}
			}
		}
		// Pub/sub keeps a connection's order: a marker published after the
		// batch arrives after anything of the batch that was still coming.
		for i, c := range campaigns {
			marker := model.Result{RequestID: newRequestID(c), CampaignID: c, UserID: "marker", Status: model.StatusSoldOut, Quantity: 1}
			if err := s.PublishResults(t.Context(), []model.Result{marker}); err != nil {
				t.Fatalf("PublishResults: %v", err)
			}
			if r := recv(t, got[i], "marker of "+c); r != marker {
				t.Errorf("campaign %d: got %+v, want only its own results, then the marker", i, r)
			}
		}
	})
}

// subscribeEach subscribes to the results of each tag and returns their
// channels, in order.
func subscribeEach(t *testing.T, s *Store, tags []string) []chan model.Result {
	t.Helper()
	got := make([]chan model.Result, len(tags))
	for i, tag := range tags {
		got[i] = make(chan model.Result, 64)
		subscribed(t, func(ctx context.Context, ready func()) error {
			return s.SubscribeResults(ctx, tag, ready, func(r model.Result) { got[i] <- r })
		})
	}
	return got
}

// campaignsOnEveryMaster returns a campaign id on each master of s's cluster
// (three ids on a single server).
func campaignsOnEveryMaster(t *testing.T, s *Store) []string {
	t.Helper()
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return []string{newCampaign(t, 1, 1).ID, newCampaign(t, 1, 1).ID, newCampaign(t, 1, 1).ID}
	}
	var count atomic.Int64 // ForEachMaster calls in parallel
	if err := cc.ForEachMaster(t.Context(), func(context.Context, *redis.Client) error { count.Add(1); return nil }); err != nil {
		t.Fatalf("masters: %v", err)
	}
	masters := int(count.Load())
	byMaster := map[string]string{}
	for range 200 {
		id := newCampaign(t, 1, 1).ID
		m, err := cc.MasterForKey(t.Context(), resultsChannel(id))
		if err != nil {
			t.Fatalf("master of %s: %v", id, err)
		}
		if _, ok := byMaster[m.Options().Addr]; !ok {
			byMaster[m.Options().Addr] = id
		}
		if len(byMaster) == masters {
			break
		}
	}
	if len(byMaster) != masters {
		t.Fatalf("campaigns on %d masters, want %d", len(byMaster), masters)
	}
	var ids []string
	for _, id := range byMaster {
		ids = append(ids, id)
	}
	return ids
}

// TestResultsPerBucket: a campaign of 16 buckets publishes each bucket's
// results on the bucket's own channel, so on the cluster they leave from
// every master, as its deductions do; a bucket's subscriber receives its
// bucket's results and no other's, and the campaign's own channel none.
func TestResultsPerBucket(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		const n = 16
		c := newCampaign(t, 1, 1)
		tags := make([]string, n+1) // the buckets, then the campaign's own
		for b := range n {
			tags[b] = model.BucketTag(c.ID, b, n)
		}
		tags[n] = c.ID
		if cc, ok := s.rdb.(*redis.ClusterClient); ok {
			masters := map[string]bool{}
			for _, tag := range tags[:n] {
				m, err := cc.MasterForKey(t.Context(), resultsChannel(tag))
				if err != nil {
					t.Fatal(err)
				}
				masters[m.Options().Addr] = true
			}
			if len(masters) != 3 {
				t.Errorf("the buckets' channels are on %d masters, want all 3", len(masters))
			}
		}
		got := subscribeEach(t, s, tags)
		var batch []model.Result
		for round := range 2 {
			for _, tag := range tags[:n] {
				batch = append(batch, model.Result{RequestID: newRequestID(tag), CampaignID: c.ID, UserID: fmt.Sprintf("u%d", round),
					Status: model.StatusSoldOut, Quantity: 1})
			}
		}
		if err := s.PublishResults(t.Context(), batch); err != nil {
			t.Fatalf("PublishResults: %v", err)
		}
		for i, tag := range tags {
			if i < n {
				for round := range 2 {
					if r, want := recv(t, got[i], "result of "+tag), batch[round*n+i]; r != want {
						t.Errorf("bucket %d, result %d: got %+v, want %+v", i, round, r, want)
					}
				}
			}
			// A marker published after the batch comes next: nothing of
			// another bucket reached this channel.
			marker := model.Result{RequestID: newRequestID(tag), CampaignID: c.ID, UserID: "marker", Status: model.StatusSoldOut, Quantity: 1}
			if err := s.PublishResults(t.Context(), []model.Result{marker}); err != nil {
				t.Fatalf("PublishResults: %v", err)
			}
			if r := recv(t, got[i], "marker of "+tag); r != marker {
				t.Errorf("%s: got %+v, want only its own results, then the marker", tag, r)
			}
		}
	})
}
