package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
	go func() { done <- sub(ctx, func() { close(ready) }) }()
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

func TestResults(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 1, 1)
		got := make(chan model.Result, 16)
		subscribed(t, func(ctx context.Context, ready func()) error {
			return s.SubscribeResults(ctx, ready, func(r model.Result) {
				if r.CampaignID == c.ID {
					got <- r
				}
			})
		})
		for _, p := range []string{"not json", `{"campaign_id":"` + c.ID + `","status":"bogus"}`} {
			if err := s.rdb.Publish(t.Context(), ResultsChannel, p).Err(); err != nil {
				t.Fatalf("PUBLISH %q: %v", p, err)
			}
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
		// A cluster client sends each keyless PUBLISH of a pipeline to a
		// node of its own, so a batch's messages may arrive out of order;
		// sharded pub/sub (SPUBLISH per campaign, issue 18) keeps them on one.
		skipOnCluster(t, s, "results over plain PUBLISH on a cluster keep no order between messages")
		c := newCampaign(t, 1, 1)
		const n = 2*resultsPerMessage + 3
		got := make(chan model.Result, n)
		subscribed(t, func(ctx context.Context, ready func()) error {
			return s.SubscribeResults(ctx, ready, func(r model.Result) {
				if r.CampaignID == c.ID {
					got <- r
				}
			})
		})
		// A plain subscriber counts the messages that carry them.
		messages := make(chan struct{}, n)
		subscribed(t, func(ctx context.Context, ready func()) error {
			return s.subscribe(ctx, ResultsChannel, ready, func(payload string) {
				if strings.Contains(payload, c.ID) {
					messages <- struct{}{}
				}
			})
		})
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
