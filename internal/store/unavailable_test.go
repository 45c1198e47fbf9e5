package store

import (
	"context"
	"errors"
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
