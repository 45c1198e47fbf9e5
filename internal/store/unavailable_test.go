package store

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// TestStatsUnavailable: Stats on a Redis that does not answer is
// model.ErrUnavailable (503), a reply error that is a bug is not.
func TestStatsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	_ = ln.Close() // nothing listens there now: connections are refused
	dead := redis.NewClient(&redis.Options{Addr: down})
	t.Cleanup(func() { _ = dead.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := New(dead).Stats(ctx, "c"); !errors.Is(err, model.ErrUnavailable) {
		t.Errorf("Redis down: got %v, want model.ErrUnavailable", err)
	}

	rdb := testenv.Redis(t)
	id := testenv.Name(t, "c")
	if err := rdb.Set(t.Context(), campaignKeys(id).meta, "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := New(rdb).Stats(t.Context(), id); err == nil || errors.Is(err, model.ErrUnavailable) {
		t.Errorf("wrong type: got %v, want an error that is not model.ErrUnavailable", err)
	}
}

func TestTransientReply(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want bool
	}{
		{"LOADING Redis is loading the dataset in memory", true},
		{"READONLY You can't write against a read only replica.", true},
		{"CLUSTERDOWN The cluster is down", true},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", false},
		{"ERR user_script:1: Script attempted to access a non local key", false},
	} {
		if got := transientReply(tc.msg); got != tc.want {
			t.Errorf("%q: got %v, want %v", tc.msg, got, tc.want)
		}
	}
}

// TestAdmitMaybeNotEnqueued: an admission whose call reached a server that
// never answered may have been stored (model.ErrMaybeNotEnqueued, with
// model.ErrUnavailable); one refused at the dial, or answered with an
// error, was not.
func TestAdmitMaybeNotEnqueued(t *testing.T) {
	batch := []model.AdmitRequest{{RequestID: newRequestID("c"), CampaignID: "c", UserID: "u", Quantity: 1}}
	admit := func(addr string) error {
		c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
		defer c.Close()
		_, err := New(c).Admit(t.Context(), "c", batch, model.RateLimits{})
		return err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() { // accepts, reads, never answers: a reply lost
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, conn) }()
		}
	}()
	if err := admit(ln.Addr().String()); !errors.Is(err, model.ErrMaybeNotEnqueued) || !errors.Is(err, model.ErrUnavailable) {
		t.Errorf("no reply: got %v, want model.ErrMaybeNotEnqueued and model.ErrUnavailable", err)
	}

	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := down.Addr().String()
	_ = down.Close()
	if err := admit(addr); err == nil || errors.Is(err, model.ErrMaybeNotEnqueued) {
		t.Errorf("connection refused: got %v, want an error that is not model.ErrMaybeNotEnqueued", err)
	}

	rdb := testenv.Redis(t)
	camp := newCampaign(t, 1, 1)
	mustLoad(t, New(rdb), camp)
	if err := rdb.Set(t.Context(), campaignKeys(camp.ID).results, "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	batch[0].CampaignID, batch[0].RequestID = camp.ID, newRequestID(camp.ID)
	if _, err := New(rdb).Admit(t.Context(), camp.ID, batch, model.RateLimits{}); err == nil || errors.Is(err, model.ErrMaybeNotEnqueued) {
		t.Errorf("an error reply: got %v, want an error that is not model.ErrMaybeNotEnqueued", err)
	}
}
