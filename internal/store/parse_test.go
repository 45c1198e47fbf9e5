package store

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

func TestParseDeductReply(t *testing.T) {
	batch := []model.Deduction{
		{RequestID: "c.1", UserID: "u1", Quantity: 1, OrderID: "o1"},
		{RequestID: "c.2", UserID: "u2", Quantity: 2, OrderID: "o2"},
	}
	ok := []any{int64(1), int64(3), "success", "o1", "", "rejected", "", "insufficient_stock"}
	with := func(i int, v any) []any {
		r := append([]any(nil), ok...)
		r[i] = v
		return r
	}
	tests := []struct {
		name    string
		reply   []any
		wantErr string // "" = success
	}{
		{name: "valid", reply: ok},
		{name: "empty", reply: nil, wantErr: "empty reply"},
		{name: "only the flag", reply: ok[:1], wantErr: "has 1 elements"},
		{name: "no results", reply: ok[:2], wantErr: "has 2 elements"},
		{name: "one result short", reply: ok[:5], wantErr: "has 5 elements"},
		{name: "one field short", reply: ok[:7], wantErr: "has 7 elements"},
		{name: "one field too many", reply: append(append([]any(nil), ok...), ""), wantErr: "has 9 elements"},
		{name: "flag is a string", reply: with(0, "1"), wantErr: "reply[0]"},
		{name: "flag is nil", reply: with(0, nil), wantErr: "reply[0]"},
		{name: "flag unknown", reply: with(0, int64(3)), wantErr: "reply[0]"},
		{name: "hold with results", reply: with(0, int64(-1)), wantErr: "reply[0]"},
		{name: "epoch is a string", reply: with(1, "3"), wantErr: "reply[1]"},
		{name: "epoch negative", reply: with(1, int64(-1)), wantErr: "reply[1]"},
		{name: "status is an integer", reply: with(2, int64(1)), wantErr: "reply[2]"},
		{name: "order id is nil", reply: with(3, nil), wantErr: "reply[3]"},
		{name: "reason is an integer", reply: with(7, int64(0)), wantErr: "reply[7]"},
		{name: "status queued", reply: with(5, "queued"), wantErr: "not final"},
		{name: "status empty", reply: with(2, ""), wantErr: "not final"},
		{name: "status unknown", reply: with(2, "bogus"), wantErr: "not final"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := parseDeductReply("c", batch, tt.reply)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got (%+v, %v), want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want nil", err)
			}
			want := model.DeductReply{SoldOutNow: true, Epoch: 3, Results: []model.Result{
				{RequestID: "c.1", CampaignID: "c", UserID: "u1", Status: model.StatusSuccess, OrderID: "o1", Quantity: 1},
				{RequestID: "c.2", CampaignID: "c", UserID: "u2", Status: model.StatusRejected, Reason: model.ReasonInsufficientStock, Quantity: 2},
			}}
			if got.SoldOutNow != want.SoldOutNow || got.Epoch != want.Epoch || len(got.Results) != 2 || got.Results[0] != want.Results[0] || got.Results[1] != want.Results[1] {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

// TestParseDeductReplyFlag: the first element says sold out now, or that
// the batch is held (nothing decided) because the campaign is not loaded or
// is paused.
func TestParseDeductReplyFlag(t *testing.T) {
	tests := []struct {
		name    string
		reply   []any
		want    bool
		wantErr error
	}{
		{name: "zero", reply: []any{int64(0), int64(1)}, want: false},
		{name: "one", reply: []any{int64(1), int64(1)}, want: true},
		{name: "not loaded", reply: []any{int64(-1)}, wantErr: model.ErrNotLoaded},
		{name: "paused", reply: []any{int64(-2)}, wantErr: model.ErrPaused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := parseDeductReply("c", nil, tt.reply)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			if got.SoldOutNow != tt.want {
				t.Errorf("SoldOutNow: got %v, want %v", got.SoldOutNow, tt.want)
			}
		})
	}
}

func TestParseAdmitReply(t *testing.T) {
	batch := []model.AdmitRequest{{RequestID: "c.1", CampaignID: "c"}}
	tests := []struct {
		name    string
		reply   []any
		want    model.AdmitReply
		wantErr string // "" = success
	}{
		{name: "new", reply: []any{int64(0), "c.1"}, want: model.AdmitReply{Code: model.Admitted, RequestID: "c.1"}},
		{name: "existing", reply: []any{int64(1), []any{"c.0", "success|2|o1||u1"}}, want: model.AdmitReply{Code: model.AdmitExisting, RequestID: "c.0",
			Result: model.Result{RequestID: "c.0", CampaignID: "c", UserID: "u1", Status: model.StatusSuccess, Quantity: 2, OrderID: "o1"}}},
		{name: "key reused", reply: []any{int64(-5), ""}, want: model.AdmitReply{Code: model.AdmitKeyReused}},
		{name: "challenge spent", reply: []any{int64(-6), ""}, want: model.AdmitReply{Code: model.AdmitChallengeSpent}},
		{name: "not loaded", reply: []any{int64(-1), ""}, want: model.AdmitReply{Code: model.AdmitNotLoaded}},
		{name: "user rate limited", reply: []any{int64(-2), "0.25"}, want: model.AdmitReply{Code: model.AdmitUserRateLimited, RetryAfter: 250 * time.Millisecond}},
		{name: "campaign rate limited", reply: []any{int64(-3), "2"}, want: model.AdmitReply{Code: model.AdmitCampaignRateLimited, RetryAfter: 2 * time.Second}},
		{name: "client IP rate limited", reply: []any{int64(-4), "0"}, want: model.AdmitReply{Code: model.AdmitIPRateLimited}},
		{name: "empty", reply: nil, wantErr: "has 0 elements"},
		{name: "too long", reply: []any{int64(0), "c.1", ""}, wantErr: "has 3 elements"},
		{name: "code is a string", reply: []any{"0", "c.1"}, wantErr: "malformed"},
		{name: "request id is nil", reply: []any{int64(0), nil}, wantErr: "malformed"},
		{name: "new names another request", reply: []any{int64(0), "c.2"}, wantErr: `names "c.2"`},
		{name: "existing as a string", reply: []any{int64(1), "c.0"}, wantErr: "existing request malformed"},
		{name: "existing without result", reply: []any{int64(1), []any{"c.0"}}, wantErr: "existing request malformed"},
		{name: "existing without id", reply: []any{int64(1), []any{"", "queued|1|||u1"}}, wantErr: "without id"},
		{name: "existing result malformed", reply: []any{int64(1), []any{"c.0", "queued"}}, wantErr: "malformed"},
		{name: "retry after not a number", reply: []any{int64(-2), "soon"}, wantErr: "retry after"},
		{name: "retry after negative", reply: []any{int64(-3), "-1"}, wantErr: "retry after"},
		{name: "retry after infinite", reply: []any{int64(-4), "inf"}, wantErr: "retry after"},
		{name: "unknown code", reply: []any{int64(2), "c.1"}, wantErr: "unknown code"},
		{name: "unknown code with a pair", reply: []any{int64(2), []any{"c.0", "queued|1|||u1"}}, wantErr: "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAdmitReply(batch, tt.reply)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got (%+v, %v), want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || len(got) != 1 || got[0] != tt.want {
				t.Errorf("got (%+v, %v), want ([%+v], nil)", got, err, tt.want)
			}
		})
	}
}

func TestDecodeStored(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		want    model.Result
		wantErr bool
	}{
		{
			name: "success", value: "success|2|o1||u1",
			want: model.Result{RequestID: "c.1", CampaignID: "c", Status: model.StatusSuccess, Quantity: 2, OrderID: "o1", UserID: "u1"},
		},
		{
			name: "rejected", value: "rejected|3||insufficient_stock|u1",
			want: model.Result{RequestID: "c.1", CampaignID: "c", Status: model.StatusRejected, Quantity: 3, Reason: "insufficient_stock", UserID: "u1"},
		},
		{
			name: "queued", value: "queued|1|||u1",
			want: model.Result{RequestID: "c.1", CampaignID: "c", Status: model.StatusQueued, Quantity: 1, UserID: "u1"},
		},
		{
			name: "user keeps extra separators", value: "sold_out|1|||u|x",
			want: model.Result{RequestID: "c.1", CampaignID: "c", Status: model.StatusSoldOut, Quantity: 1, UserID: "u|x"},
		},
		{name: "empty", value: "", wantErr: true},
		{name: "four fields", value: "success|1|o1|", wantErr: true},
		{name: "quantity not a number", value: "success|x|o1||u1", wantErr: true},
		{name: "quantity empty", value: "success||o1||u1", wantErr: true},
		{name: "quantity fractional", value: "success|1.5|o1||u1", wantErr: true},
		{name: "unknown status", value: "bogus|1|||u1", wantErr: true},
		{name: "empty status", value: "|1|||u1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeStored("c.1", "c", tt.value)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("got (%+v, nil), want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got (%+v, %v), want (%+v, nil)", got, err, tt.want)
			}
		})
	}
}

func TestEncodeStoredRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		r    model.Result
	}{
		{name: "queued", r: model.Result{Status: model.StatusQueued, Quantity: 1, UserID: "u1"}},
		{name: "success", r: model.Result{Status: model.StatusSuccess, Quantity: 3, OrderID: "o-1", UserID: "user@example.com"}},
		{name: "rejected", r: model.Result{Status: model.StatusRejected, Quantity: 1, Reason: model.ReasonBadMessage, UserID: "u:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.r
			want.RequestID, want.CampaignID = "c.1", "c"
			got, err := decodeStored("c.1", "c", storedOf(tt.r).String())
			if err != nil || got != want {
				t.Errorf("got (%+v, %v), want (%+v, nil)", got, err, want)
			}
		})
	}
}

func TestResult(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 1, 1)
		mustLoad(t, s, c)
		hex32 := strings.Repeat("ab", 16)
		tests := []struct {
			name      string
			requestID string
		}{
			{name: "empty", requestID: ""},
			{name: "no separator", requestID: c.ID + hex32},
			{name: "short tail", requestID: model.FormatRequestID(c.ID, hex32[:31])},
			{name: "upper-case tail", requestID: model.FormatRequestID(c.ID, strings.ToUpper(hex32))},
			{name: "bad campaign", requestID: model.FormatRequestID("c{x}", hex32)},
			{name: "empty campaign", requestID: "." + hex32},
			{name: "unknown", requestID: model.FormatRequestID(c.ID, hex32)},
			{name: "unknown campaign", requestID: newRequestID(c.ID + "x")},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got, err := s.Result(t.Context(), tt.requestID)
				if !errors.Is(err, model.ErrNotFound) {
					t.Errorf("Result(%q): got (%+v, %v), want error %v", tt.requestID, got, err, model.ErrNotFound)
				}
			})
		}
		t.Run("corrupt stored value", func(t *testing.T) {
			rid := newRequestID(c.ID)
			if err := s.rdb.HSet(t.Context(), campaignKeys(c.ID).results, rid, "garbage").Err(); err != nil {
				t.Fatalf("HSET: %v", err)
			}
			got, err := s.Result(t.Context(), rid)
			if err == nil || errors.Is(err, model.ErrNotFound) {
				t.Errorf("Result: got (%+v, %v), want a decode error", got, err)
			}
		})
	})
}

// TestResultsBatch: the batch read answers every id in order, the missing and
// malformed ones with the zero Result, in one round trip across campaigns.
func TestResultsBatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c1, c2 := newCampaign(t, 1, 1), newCampaign(t, 1, 1)
		stored := func(t *testing.T, campaignID string, r model.Result) string {
			t.Helper()
			id := newRequestID(campaignID)
			if err := s.rdb.HSet(t.Context(), campaignKeys(campaignID).results, id, storedOf(r).String()).Err(); err != nil {
				t.Fatalf("HSET: %v", err)
			}
			return id
		}
		queued := model.Result{Status: model.StatusQueued, Quantity: 1, UserID: "alice"}
		success := model.Result{Status: model.StatusSuccess, Quantity: 2, OrderID: "o1", UserID: "u|bob"}
		q1, s2 := stored(t, c1.ID, queued), stored(t, c2.ID, success)
		q2 := stored(t, c2.ID, queued)
		unknown := newRequestID(c1.ID)
		ids := []string{q1, unknown, "malformed", s2, q2, q1}
		want := make([]model.Result, len(ids))
		for i, at := range []struct {
			id, campaignID string
			r              model.Result
		}{{q1, c1.ID, queued}, {}, {}, {s2, c2.ID, success}, {q2, c2.ID, queued}, {q1, c1.ID, queued}} {
			if at.id != "" {
				want[i] = at.r
				want[i].RequestID, want[i].CampaignID = at.id, at.campaignID
			}
		}

		trips := &resultTrips{}
		s.rdb.AddHook(trips)
		got, err := s.Results(t.Context(), ids)
		if err != nil {
			t.Fatalf("Results: %v", err)
		}
		if len(got) != len(want) {
			t.Fatalf("got %d results, want %d", len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("result %d (%s): got %+v, want %+v", i, ids[i], got[i], want[i])
			}
		}
		if n := trips.n.Load(); n != 1 {
			t.Errorf("got %d round trips, want 1", n)
		}

		t.Run("nothing to read", func(t *testing.T) {
			before := trips.n.Load()
			got, err := s.Results(t.Context(), []string{"malformed", ""})
			if err != nil || len(got) != 2 || got[0] != (model.Result{}) || got[1] != (model.Result{}) {
				t.Errorf("got (%+v, %v), want two zero results", got, err)
			}
			if n := trips.n.Load() - before; n != 0 {
				t.Errorf("got %d round trips, want 0", n)
			}
		})
		t.Run("corrupt stored value", func(t *testing.T) {
			rid := newRequestID(c1.ID)
			if err := s.rdb.HSet(t.Context(), campaignKeys(c1.ID).results, rid, "garbage").Err(); err != nil {
				t.Fatalf("HSET: %v", err)
			}
			got, err := s.Results(t.Context(), []string{q1, rid})
			if err == nil || errors.Is(err, model.ErrNotFound) || errors.Is(err, model.ErrUnavailable) {
				t.Errorf("got (%+v, %v), want a decode error", got, err)
			}
		})
		t.Run("Redis unreachable", func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			for _, ids := range [][]string{{q1}, {q1, s2}} {
				if _, err := s.Results(ctx, ids); !errors.Is(err, model.ErrUnavailable) {
					t.Errorf("%d campaigns: got %v, want %v", len(ids), err, model.ErrUnavailable)
				}
			}
		})
	})
}

// resultTrips counts the round trips of a go-redis client that read stored
// results (HGET, HMGET), alone or in a pipeline; a new connection's own
// handshake commands are not counted.
type resultTrips struct{ n atomic.Int64 }

func readsResults(cmd redis.Cmder) bool { return cmd.Name() == "hget" || cmd.Name() == "hmget" }

func (h *resultTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *resultTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if readsResults(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *resultTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, readsResults) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}
