package store

import (
	"reflect"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// delivery is one request of a Deduct batch in a table: rid and order are
// labels, so the same label in two places is the same request (a redelivery).
type delivery struct {
	rid   string
	user  string
	qty   int64
	order string // candidate order id
}

// outcome is what a delivery must get back.
type outcome struct {
	status model.Status
	order  string // label of the order id, "" when none
	reason string
}

func TestDeduct(t *testing.T) {
	const (
		success = model.StatusSuccess
		soldOut = model.StatusSoldOut
		limit   = model.StatusLimitExceeded
		reject  = model.StatusRejected
	)
	tests := []struct {
		name         string
		stock, limit int64
		batches      [][]delivery
		want         [][]outcome
		wantSoldOut  []bool // SoldOutNow of each batch
		wantRemain   int64
		wantSold     int64
		wantFinished map[model.Status]int64
		wantUnits    map[string]int64
	}{
		{
			name: "success returns the order id passed", stock: 5, limit: 2,
			batches:      [][]delivery{{{"r1", "u1", 1, "o1"}}},
			want:         [][]outcome{{{success, "o1", ""}}},
			wantSoldOut:  []bool{false},
			wantRemain:   4,
			wantSold:     1,
			wantFinished: map[model.Status]int64{success: 1},
			wantUnits:    map[string]int64{"u1": 1},
		},
		{
			name: "sold out when stock is zero", stock: 1, limit: 1,
			batches:      [][]delivery{{{"r1", "u1", 1, "o1"}}, {{"r2", "u2", 1, "o2"}}},
			want:         [][]outcome{{{success, "o1", ""}}, {{soldOut, "", ""}}},
			wantSoldOut:  []bool{true, false},
			wantRemain:   0,
			wantSold:     1,
			wantFinished: map[model.Status]int64{success: 1, soldOut: 1},
			wantUnits:    map[string]int64{"u1": 1, "u2": 0},
		},
		{
			name: "limit exceeded by a second purchase", stock: 5, limit: 1,
			batches:      [][]delivery{{{"r1", "u1", 1, "o1"}}, {{"r2", "u1", 1, "o2"}}},
			want:         [][]outcome{{{success, "o1", ""}}, {{limit, "", ""}}},
			wantSoldOut:  []bool{false, false},
			wantRemain:   4,
			wantSold:     1,
			wantFinished: map[model.Status]int64{success: 1, limit: 1},
			wantUnits:    map[string]int64{"u1": 1},
		},
		{
			name: "limit exceeded by one large request", stock: 5, limit: 2,
			batches:      [][]delivery{{{"r1", "u1", 3, "o1"}}},
			want:         [][]outcome{{{limit, "", ""}}},
			wantSoldOut:  []bool{false},
			wantRemain:   5,
			wantFinished: map[model.Status]int64{limit: 1},
			wantUnits:    map[string]int64{"u1": 0},
		},
		{
			name: "insufficient stock when qty exceeds what is left", stock: 2, limit: 5,
			batches:      [][]delivery{{{"r1", "u1", 3, "o1"}}},
			want:         [][]outcome{{{reject, "", model.ReasonInsufficientStock}}},
			wantSoldOut:  []bool{false},
			wantRemain:   2,
			wantFinished: map[model.Status]int64{reject: 1},
			wantUnits:    map[string]int64{"u1": 0},
		},
		{
			name: "sold out now when a batch takes the last units", stock: 3, limit: 3,
			batches:      [][]delivery{{{"r1", "u1", 1, "o1"}}, {{"r2", "u2", 2, "o2"}}},
			want:         [][]outcome{{{success, "o1", ""}}, {{success, "o2", ""}}},
			wantSoldOut:  []bool{false, true},
			wantRemain:   0,
			wantSold:     3,
			wantFinished: map[model.Status]int64{success: 2},
			wantUnits:    map[string]int64{"u1": 1, "u2": 2},
		},
		{
			name: "mixed outcomes in arrival order", stock: 3, limit: 2,
			batches: [][]delivery{{
				{"r1", "u1", 1, "o1"},
				{"r2", "u1", 1, "o2"},
				{"r3", "u1", 1, "o3"},
				{"r4", "u2", 1, "o4"},
				{"r5", "u3", 1, "o5"},
			}},
			want: [][]outcome{{
				{success, "o1", ""},
				{success, "o2", ""},
				{limit, "", ""},
				{success, "o4", ""},
				{soldOut, "", ""},
			}},
			wantSoldOut:  []bool{true},
			wantRemain:   0,
			wantSold:     3,
			wantFinished: map[model.Status]int64{success: 3, limit: 1, soldOut: 1},
			wantUnits:    map[string]int64{"u1": 2, "u2": 1, "u3": 0},
		},
		{
			name: "insufficient stock then a smaller request fits", stock: 2, limit: 5,
			batches:      [][]delivery{{{"r1", "u1", 3, "o1"}, {"r2", "u1", 2, "o2"}}},
			want:         [][]outcome{{{reject, "", model.ReasonInsufficientStock}, {success, "o2", ""}}},
			wantSoldOut:  []bool{true},
			wantRemain:   0,
			wantSold:     2,
			wantFinished: map[model.Status]int64{reject: 1, success: 1},
			wantUnits:    map[string]int64{"u1": 2},
		},
		{
			name: "same request twice in one batch deducts once", stock: 5, limit: 5,
			batches:      [][]delivery{{{"r1", "u1", 2, "o1"}, {"r1", "u1", 2, "o2"}}},
			want:         [][]outcome{{{success, "o1", ""}, {success, "o1", ""}}},
			wantSoldOut:  []bool{false},
			wantRemain:   3,
			wantSold:     2,
			wantFinished: map[model.Status]int64{success: 1},
			wantUnits:    map[string]int64{"u1": 2},
		},
		{
			name: "same rejected request twice in one batch", stock: 2, limit: 5,
			batches:      [][]delivery{{{"r1", "u1", 3, "o1"}, {"r1", "u1", 3, "o2"}}},
			want:         [][]outcome{{{reject, "", model.ReasonInsufficientStock}, {reject, "", model.ReasonInsufficientStock}}},
			wantSoldOut:  []bool{false},
			wantRemain:   2,
			wantFinished: map[model.Status]int64{reject: 1},
		},
		{
			name: "same request in two batches keeps the first order id", stock: 5, limit: 1,
			batches:      [][]delivery{{{"r1", "u1", 1, "o1"}}, {{"r1", "u1", 1, "o2"}}},
			want:         [][]outcome{{{success, "o1", ""}}, {{success, "o1", ""}}},
			wantSoldOut:  []bool{false, false},
			wantRemain:   4,
			wantSold:     1,
			wantFinished: map[model.Status]int64{success: 1},
			wantUnits:    map[string]int64{"u1": 1},
		},
		{
			name: "redelivered last sale after sold out is still a success", stock: 1, limit: 1,
			batches:      [][]delivery{{{"r1", "u1", 1, "o1"}}, {{"r1", "u1", 1, "o2"}, {"r2", "u2", 1, "o3"}}},
			want:         [][]outcome{{{success, "o1", ""}}, {{success, "o1", ""}, {soldOut, "", ""}}},
			wantSoldOut:  []bool{true, false},
			wantRemain:   0,
			wantSold:     1,
			wantFinished: map[model.Status]int64{success: 1, soldOut: 1},
			wantUnits:    map[string]int64{"u1": 1, "u2": 0},
		},
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newCampaign(t, tt.stock, tt.limit)
				mustLoad(t, s, c)
				ids := newLabels(c.ID)
				last := map[string]model.Result{} // latest reply per request id
				for i, b := range tt.batches {
					batch := make([]model.Deduction, len(b))
					for j, d := range b {
						batch[j] = model.Deduction{RequestID: ids.rid(d.rid), UserID: d.user, Quantity: d.qty, OrderID: d.order}
					}
					got := mustDeduct(t, s, c.ID, batch)
					if got.SoldOutNow != tt.wantSoldOut[i] {
						t.Errorf("batch %d: SoldOutNow got %v, want %v", i, got.SoldOutNow, tt.wantSoldOut[i])
					}
					if got.Epoch != c.Epoch {
						t.Errorf("batch %d: Epoch got %d, want %d", i, got.Epoch, c.Epoch)
					}
					for j, d := range batch {
						w := tt.want[i][j]
						want := model.Result{
							RequestID: d.RequestID, CampaignID: c.ID, UserID: d.UserID,
							Status: w.status, OrderID: w.order, Reason: w.reason, Quantity: d.Quantity,
						}
						if got.Results[j] != want {
							t.Errorf("batch %d request %d (%s): got %+v, want %+v", i, j, b[j].rid, got.Results[j], want)
						}
						last[d.RequestID] = got.Results[j]
					}
				}

				for rid, want := range last {
					if got := mustResult(t, s, rid); got != want {
						t.Errorf("Result(%s): got %+v, want %+v", rid, got, want)
					}
				}
				st := mustStats(t, s, c.ID)
				if !st.Loaded {
					t.Errorf("Loaded: got false, want true")
				}
				if st.Stock != tt.stock {
					t.Errorf("Stock: got %d, want %d", st.Stock, tt.stock)
				}
				if st.Remaining != tt.wantRemain {
					t.Errorf("Remaining: got %d, want %d", st.Remaining, tt.wantRemain)
				}
				if st.Sold != tt.wantSold {
					t.Errorf("Sold: got %d, want %d", st.Sold, tt.wantSold)
				}
				checkFinished(t, st, tt.wantFinished)
				wantFlag := tt.wantRemain == 0
				if st.SoldOut != wantFlag {
					t.Errorf("Stats.SoldOut: got %v, want %v", st.SoldOut, wantFlag)
				}
				if got := mustSoldOut(t, s, c.ID); got != wantFlag {
					t.Errorf("SoldOut(): got %v, want %v", got, wantFlag)
				}
				for user, want := range tt.wantUnits {
					if got := mustUserUnits(t, s, c.ID, user); got != want {
						t.Errorf("UserUnits(%s): got %d, want %d", user, got, want)
					}
				}
			})
		}
	})
}

// A redelivery in a later batch must leave every counter as it was.
func TestDeductRedeliveryChangesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 2, 1)
		mustLoad(t, s, c)
		r1, r2 := newRequestID(c.ID), newRequestID(c.ID)
		first := mustDeduct(t, s, c.ID, []model.Deduction{
			{RequestID: r1, UserID: "u1", Quantity: 1, OrderID: "o1"},
			{RequestID: r2, UserID: "u1", Quantity: 1, OrderID: "o2"},
		})
		before := mustStats(t, s, c.ID)
		again := mustDeduct(t, s, c.ID, []model.Deduction{
			{RequestID: r2, UserID: "u1", Quantity: 1, OrderID: "o4"},
			{RequestID: r1, UserID: "u1", Quantity: 1, OrderID: "o3"},
		})
		if again.Results[0] != first.Results[1] || again.Results[1] != first.Results[0] {
			t.Errorf("redelivery: got %+v, want %+v", again.Results, []model.Result{first.Results[1], first.Results[0]})
		}
		if again.Results[1].OrderID != "o1" {
			t.Errorf("redelivered order id: got %q, want %q", again.Results[1].OrderID, "o1")
		}
		if after := mustStats(t, s, c.ID); !reflect.DeepEqual(after, before) {
			t.Errorf("stats after redelivery: got %+v, want %+v", after, before)
		}
		if got := mustUserUnits(t, s, c.ID, "u1"); got != 1 {
			t.Errorf("UserUnits(u1): got %d, want 1", got)
		}
	})
}

// A script that stops inside its loop writes nothing: here the second
// request's stored units are not a number (a Lua error once the first request
// has been decided a success), and neither the first request's deduction nor
// its result may remain, so the redelivered batch is decided afresh.
func TestDeductErrorChangesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 5, 2)
		mustLoad(t, s, c)
		k := campaignKeys(c.ID)
		if err := s.rdb.HSet(t.Context(), k.users, "u2", "not-a-number").Err(); err != nil {
			t.Fatal(err)
		}
		before := mustStats(t, s, c.ID)
		_, err := s.Deduct(t.Context(), c.ID, []model.Deduction{
			{RequestID: newRequestID(c.ID), UserID: "u1", Quantity: 1, OrderID: "o1"},
			{RequestID: newRequestID(c.ID), UserID: "u2", Quantity: 1, OrderID: "o2"},
		})
		if err == nil {
			t.Fatalf("Deduct: got nil, want the script's error")
		}
		if after := mustStats(t, s, c.ID); !reflect.DeepEqual(after, before) {
			t.Errorf("stats after the failed call: got %+v, want %+v", after, before)
		}
		if got := mustUserUnits(t, s, c.ID, "u1"); got != 0 {
			t.Errorf("UserUnits(u1): got %d, want 0", got)
		}
		if n, err := s.rdb.HLen(t.Context(), k.results).Result(); err != nil || n != 0 {
			t.Errorf("stored results: got %d (%v), want 0", n, err)
		}
	})
}

func TestDeductEmptyBatch(t *testing.T) {
	s := New(nil) // an empty batch never reaches Redis
	got, err := s.Deduct(t.Context(), "c", nil)
	if err != nil || len(got.Results) != 0 || got.SoldOutNow {
		t.Errorf("Deduct(empty): got %+v, %v; want empty reply, nil", got, err)
	}
}

// TestStats follows a campaign from admit to decision.
func TestStats(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 3, 1)
		if st := mustStats(t, s, c.ID); st.Loaded || st.Queued() != 0 || !reflect.DeepEqual(st.FinishedByStatus, finished(nil)) {
			t.Errorf("Stats before preload: got %+v, want not loaded with zero counts", st)
		}
		mustLoad(t, s, c)
		users := []string{"u1", "u2", "u1", "u3", "u4", "u5"}
		batch := make([]model.Deduction, 0, len(users))
		for i, u := range users {
			rid := newRequestID(c.ID)
			mustAdmit(t, s, model.AdmitRequest{RequestID: rid, CampaignID: c.ID, UserID: u, Quantity: 1})
			if i < len(users)-1 { // the last stays queued
				batch = append(batch, model.Deduction{RequestID: rid, UserID: u, Quantity: 1, OrderID: "o" + u})
			}
		}
		st := mustStats(t, s, c.ID)
		if st.Admitted != 6 || st.Queued() != 6 || st.Remaining != 3 {
			t.Errorf("Stats after admit: got admitted %d queued %d remaining %d, want 6 6 3", st.Admitted, st.Queued(), st.Remaining)
		}
		mustDeduct(t, s, c.ID, batch)

		got := mustStats(t, s, c.ID)
		want := model.Stats{
			Loaded: true, Stock: 3, Remaining: 0, Sold: 3, SoldOut: true, Admitted: 6,
			FinishedByStatus: finished(map[model.Status]int64{
				model.StatusSuccess: 3, model.StatusLimitExceeded: 1, model.StatusSoldOut: 1,
			}),
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Stats: got %+v, want %+v", got, want)
		}
		if got.Queued() != 1 {
			t.Errorf("Queued: got %d, want 1", got.Queued())
		}
	})
}
