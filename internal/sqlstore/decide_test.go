package sqlstore

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// decideCampaign is a campaign of the degraded-mode tests: price 250, a
// one-minute payment window, started an hour ago.
func decideCampaign(t testing.TB, db *DB, id string, stock, limit int64) model.Campaign {
	t.Helper()
	start := time.Now().Add(-time.Hour)
	c, err := db.CreateCampaign(t.Context(), model.Campaign{ID: id, Name: "decide", Stock: stock, PerUserLimit: limit,
		Price: 250, PaymentWindow: time.Minute, StartAt: start, EndAt: start.Add(24 * time.Hour)})
	if err != nil {
		t.Fatalf("create campaign %s: %v", id, err)
	}
	return c
}

func mustTakeOver(t testing.TB, db *DB, id string) model.Campaign {
	t.Helper()
	c, err := db.TakeOver(t.Context(), id)
	if err != nil {
		t.Fatalf("TakeOver(%s): %v", id, err)
	}
	return c
}

// ded is request n of campaign id: user, quantity, and its derived order id.
func ded(id string, n int, user string, q int64) model.Deduction {
	rid := model.FormatRequestID(id, fmt.Sprintf("%032x", n))
	return model.Deduction{RequestID: rid, UserID: user, Quantity: q, OrderID: model.OrderIDOf(rid)}
}

// orderOf is the order the Redis path (a worker) stores for d.
func orderOf(id string, d model.Deduction, s model.OrderStatus) model.Order {
	return model.Order{ID: d.OrderID, RequestID: d.RequestID, CampaignID: id, UserID: d.UserID, Quantity: d.Quantity,
		Amount: 250 * d.Quantity, Status: s, ExpiresAt: testExpiry}
}

// heldUnits returns a campaign's units_held and the units of its active
// orders, which must be equal while MySQL decides it.
func heldUnits(t testing.TB, db *DB, id string) (held, active int64) {
	t.Helper()
	c, err := db.Campaign(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	orders, err := db.CampaignOrders(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range orders {
		if o.Status.Active() {
			active += o.Quantity
		}
	}
	return c.UnitsHeld, active
}

// checkDecided fails unless Decided answers each of want's requests with
// its result.
func checkDecided(t testing.TB, db *DB, want map[string]model.Result) {
	t.Helper()
	got, err := db.Decided(t.Context(), slices.Collect(maps.Keys(want)))
	if err != nil {
		t.Fatalf("Decided: %v", err)
	}
	for rid, w := range want {
		if g, ok := got[rid]; !ok || g != w {
			t.Errorf("Decided(%s): got %+v (found %v), want %+v", rid, g, ok, w)
		}
	}
}

// TestDecide: one case per outcome of Decide, each on a campaign of its
// own; after each, units_held is the units of the active orders and
// Decided answers what Decide did.
func TestDecide(t *testing.T) {
	type batch struct {
		ds   []model.Deduction
		want []string // one per deduction: its status, and its reason after a slash
	}
	tests := []struct {
		name         string
		stock, limit int64
		// prepare runs before the take-over: the Redis path's orders, a pause.
		prepare  func(t *testing.T, db *DB, id string)
		noTake   bool
		batches  func(id string) []batch
		wantErr  error
		wantHeld int64
	}{
		{name: "success", stock: 10, limit: 5, wantHeld: 5, batches: func(id string) []batch {
			return []batch{{ds: []model.Deduction{ded(id, 1, "u1", 2), ded(id, 2, "u2", 3)}, want: []string{"success", "success"}}}
		}},
		{name: "sold_out", stock: 3, limit: 5, wantHeld: 3, batches: func(id string) []batch {
			return []batch{{ds: []model.Deduction{ded(id, 1, "u1", 3), ded(id, 2, "u2", 1)}, want: []string{"success", "sold_out"}},
				{ds: []model.Deduction{ded(id, 3, "u3", 1)}, want: []string{"sold_out"}}}
		}},
		{name: "insufficient_stock", stock: 3, limit: 5, wantHeld: 3, batches: func(id string) []batch {
			return []batch{{ds: []model.Deduction{ded(id, 1, "u1", 2), ded(id, 2, "u2", 2), ded(id, 3, "u3", 1)},
				want: []string{"success", "rejected/insufficient_stock", "success"}}}
		}},
		{name: "limit_exceeded", stock: 100, limit: 3, wantHeld: 5,
			// The Redis path sold u1 two units before the take-over, and
			// an expired order of u1's holds nothing.
			prepare: func(t *testing.T, db *DB, id string) {
				mustInsert(t, db, []model.Order{orderOf(id, ded(id, 100, "u1", 2), model.OrderPaid),
					orderOf(id, ded(id, 101, "u1", 3), model.OrderExpired)})
			},
			batches: func(id string) []batch {
				return []batch{{ds: []model.Deduction{ded(id, 1, "u1", 2), ded(id, 2, "u1", 1), ded(id, 3, "u2", 2), ded(id, 4, "u2", 2)},
					want: []string{"limit_exceeded", "success", "success", "limit_exceeded"}}}
			}},
		{name: "already decided", stock: 2, limit: 5, wantHeld: 2,
			prepare: func(t *testing.T, db *DB, id string) {
				mustInsert(t, db, []model.Order{orderOf(id, ded(id, 100, "u0", 1), model.OrderExpired)})
			},
			batches: func(id string) []batch {
				first := []model.Deduction{ded(id, 1, "u1", 2), ded(id, 2, "u2", 1), ded(id, 1, "u1", 2)}
				return []batch{
					{ds: first, want: []string{"success", "sold_out", "success"}},
					// Redelivered, with the Redis path's order (expired: a
					// success stands) and a request that came twice.
					{ds: append(slices.Clone(first), ded(id, 100, "u0", 1), ded(id, 2, "u2", 1)),
						want: []string{"success", "sold_out", "success", "success", "sold_out"}},
				}
			}},
		{name: "bad quantity", stock: 5, limit: 5, wantHeld: 1, batches: func(id string) []batch {
			return []batch{{ds: []model.Deduction{ded(id, 1, "u1", 0), ded(id, 2, "u2", 1)}, want: []string{"rejected/bad_message", "success"}}}
		}},
		{name: "ended_early", stock: 5, limit: 5, wantHeld: 1,
			prepare: func(t *testing.T, db *DB, id string) {
				mustInsert(t, db, []model.Order{orderOf(id, ded(id, 1, "u1", 1), model.OrderPendingPayment)})
				if _, err := db.SetPaused(t.Context(), id, true); err != nil {
					t.Fatal(err)
				}
				if _, err := db.ChangeCampaign(t.Context(), id, func(c model.Campaign) (model.Campaign, error) {
					return c.EndEarly(time.Now())
				}); err != nil {
					t.Fatal(err)
				}
			},
			batches: func(id string) []batch {
				ds := []model.Deduction{ded(id, 1, "u1", 1), ded(id, 2, "u2", 1)}
				return []batch{{ds: ds, want: []string{"success", "rejected/ended_early"}}, {ds: ds, want: []string{"success", "rejected/ended_early"}}}
			}},
		{name: "paused", stock: 5, limit: 5, wantErr: model.ErrPaused,
			prepare: func(t *testing.T, db *DB, id string) {
				if _, err := db.SetPaused(t.Context(), id, true); err != nil {
					t.Fatal(err)
				}
			},
			batches: func(id string) []batch { return []batch{{ds: []model.Deduction{ded(id, 1, "u1", 1)}}} }},
		{name: "not taken over", stock: 5, limit: 5, noTake: true, wantErr: model.ErrLedgerMoved,
			batches: func(id string) []batch { return []batch{{ds: []model.Deduction{ded(id, 1, "u1", 1)}}} }},
	}
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			for i, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					id := fmt.Sprintf("d%d", i)
					decideCampaign(t, db, id, tc.stock, tc.limit)
					if tc.prepare != nil {
						tc.prepare(t, db, id)
					}
					if !tc.noTake {
						mustTakeOver(t, db, id)
					}
					before, _ := db.CampaignOrderStats(t.Context(), id)
					at := time.Now().UTC().Truncate(time.Millisecond)
					decided := map[string]model.Result{}
					for _, b := range tc.batches(id) {
						got, err := db.Decide(t.Context(), id, b.ds, at)
						if tc.wantErr != nil {
							after, _ := db.CampaignOrderStats(t.Context(), id)
							if !errors.Is(err, tc.wantErr) || got != nil || after != before {
								t.Fatalf("got %v, %v, orders %+v; want %v, no results, orders %+v", got, err, after, tc.wantErr, before)
							}
							continue
						}
						if err != nil || len(got) != len(b.ds) {
							t.Fatalf("Decide: got %d results, %v; want %d", len(got), err, len(b.ds))
						}
						for j, r := range got {
							d := b.ds[j]
							want := model.Result{RequestID: d.RequestID, CampaignID: id, UserID: d.UserID, Quantity: d.Quantity}
							status, reason, _ := strings.Cut(b.want[j], "/")
							want.Status, want.Reason = model.Status(status), reason
							if want.Status == model.StatusSuccess {
								want.OrderID = d.OrderID
							}
							if r != want {
								t.Errorf("result %d: got %+v, want %+v", j, r, want)
							}
							decided[r.RequestID] = r
						}
					}
					if tc.wantErr != nil {
						return
					}
					if held, active := heldUnits(t, db, id); held != tc.wantHeld || active != held {
						t.Errorf("got units_held %d, active units %d; want %d", held, active, tc.wantHeld)
					}
					checkDecided(t, db, decided)
				})
			}
		})
	}
}

// TestDecideOrder: a success is an order pending payment, priced, that
// expires a payment window after the decision; a request not of the
// order id it names, or of an unknown campaign, is an error.
func TestDecideOrder(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			const id = "do"
			decideCampaign(t, db, id, 10, 5)
			mustTakeOver(t, db, id)
			at := time.Date(2031, 2, 3, 4, 5, 6, 7e6, time.UTC)
			d := ded(id, 1, "u1", 3)
			if _, err := db.Decide(t.Context(), id, []model.Deduction{d}, at); err != nil {
				t.Fatal(err)
			}
			got := mustOrder(t, db, d.OrderID)
			want := model.Order{ID: d.OrderID, RequestID: d.RequestID, CampaignID: id, UserID: "u1", Quantity: 3, Amount: 750,
				Status: model.OrderPendingPayment, CreatedAt: at, UpdatedAt: at, ExpiresAt: at.Add(time.Minute)}
			if got != want {
				t.Errorf("order: got %+v, want %+v", got, want)
			}

			bad := ded(id, 2, "u2", 1)
			bad.OrderID = "o2"
			var inv *model.InvalidError
			if _, err := db.Decide(t.Context(), id, []model.Deduction{bad}, at); !errors.As(err, &inv) {
				t.Errorf("an order id not derived: got %v, want an InvalidError", err)
			}
			if _, err := db.Decide(t.Context(), "nope", []model.Deduction{ded("nope", 1, "u1", 1)}, at); !errors.Is(err, model.ErrNotFound) {
				t.Errorf("unknown campaign: got %v, want %v", err, model.ErrNotFound)
			}
			// An order stored under the request's order id by another
			// request: the success is not skipped as a redelivery.
			other := ded(id, 3, "u3", 1)
			taken := orderOf(id, ded(id, 4, "u4", 1), model.OrderPaid)
			taken.ID = other.OrderID
			if err := db.InsertOrders(t.Context(), []model.Order{taken}, model.Epochs{id: mustCampaignOf(t, db, id).Epoch}); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Decide(t.Context(), id, []model.Deduction{other}, at); !errors.Is(err, model.ErrConflict) {
				t.Errorf("order id taken: got %v, want %v", err, model.ErrConflict)
			}
		})
	}
}

func mustCampaignOf(t testing.TB, db *DB, id string) model.Campaign {
	t.Helper()
	c, err := db.Campaign(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTakeOver: a take-over moves the epoch, so the Redis path's inserts
// under the old one are refused, counts the active orders' units and marks
// the final orders returned; taking over again changes nothing.
func TestTakeOver(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			const id = "to"
			c := decideCampaign(t, db, id, 100, 10)
			if c.DecidedInMySQL || c.UnitsHeld != 0 {
				t.Fatalf("new campaign: got decided %v, units held %d; want false, 0", c.DecidedInMySQL, c.UnitsHeld)
			}
			statuses := []model.OrderStatus{model.OrderPendingPayment, model.OrderPaid, model.OrderExpired, model.OrderCancelled, model.OrderRefunded}
			var orders []model.Order
			for i, s := range statuses {
				orders = append(orders, orderOf(id, ded(id, i, fmt.Sprintf("u%d", i), int64(1+i)), s))
			}
			mustInsert(t, db, orders)
			if err := db.MarkReturned(t.Context(), orders[3].ID); err != nil {
				t.Fatal(err)
			}

			got := mustTakeOver(t, db, id)
			if !got.DecidedInMySQL || got.UnitsHeld != 3 || got.Epoch != c.Epoch+1 {
				t.Fatalf("TakeOver: got decided %v, units held %d, epoch %d; want true, 3, %d", got.DecidedInMySQL, got.UnitsHeld, got.Epoch, c.Epoch+1)
			}
			if stored := mustCampaignOf(t, db, id); stored != got {
				t.Errorf("stored: got %+v, want %+v", stored, got)
			}
			for _, o := range orders {
				if got := mustOrder(t, db, o.ID); got.Returned != o.Status.Final() {
					t.Errorf("order %s: got returned %v, want %v", o.Status, got.Returned, o.Status.Final())
				}
			}
			// The Redis path, under the epoch it decided in.
			late := []model.Order{orderOf(id, ded(id, 10, "u10", 1), model.OrderPendingPayment)}
			if err := db.InsertOrders(t.Context(), late, model.Epochs{id: c.Epoch}); !errors.Is(err, model.ErrLedgerMoved) {
				t.Errorf("insert under the old epoch: got %v, want %v", err, model.ErrLedgerMoved)
			}

			if _, err := db.Decide(t.Context(), id, []model.Deduction{ded(id, 11, "u11", 2)}, time.Now()); err != nil {
				t.Fatal(err)
			}
			again := mustTakeOver(t, db, id)
			if again.Epoch != got.Epoch || again.UnitsHeld != 5 {
				t.Errorf("TakeOver again: got epoch %d, units held %d; want %d, 5", again.Epoch, again.UnitsHeld, got.Epoch)
			}
			if _, err := db.TakeOver(t.Context(), "nope"); !errors.Is(err, model.ErrNotFound) {
				t.Errorf("TakeOver of an unknown campaign: got %v, want %v", err, model.ErrNotFound)
			}
		})
	}
}

// TestTakeOverWaitsForInserts: an insert that has read the old epoch holds
// the take-over back until it commits, and its orders are counted.
func TestTakeOverWaitsForInserts(t *testing.T) {
	db := openDBs(t)[DriverMySQL](t)
	id := testenv.UniqueName("tw")
	decideCampaign(t, db, id, 100, 10)
	held, release := make(chan struct{}), make(chan struct{})
	db.afterEpochCheck = func() {
		close(held)
		<-release
	}
	orders := []model.Order{orderOf(id, ded(id, 1, "u1", 2), model.OrderPendingPayment), orderOf(id, ded(id, 2, "u2", 3), model.OrderPaid)}
	inserted := make(chan error, 1)
	go func() { inserted <- db.InsertOrders(t.Context(), orders, model.Epochs{id: 0}) }()
	<-held
	db.afterEpochCheck = nil

	taken := make(chan model.Campaign, 1)
	go func() {
		c, err := db.TakeOver(t.Context(), id)
		if err != nil {
			t.Errorf("TakeOver: %v", err)
		}
		taken <- c
	}()
	testenv.Eventually(t, 10*time.Second, "the take-over waiting for the campaign's lock", func() (bool, string) {
		var n int64
		err := db.pool.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND INFO LIKE '%FOR UPDATE%' AND INFO LIKE ?",
			"%"+id+"%").Scan(&n)
		if err != nil {
			t.Fatalf("read the process list: %v", err)
		}
		return n > 0, "none in the process list"
	})
	select {
	case c := <-taken:
		t.Fatalf("TakeOver returned %+v while an insert of the old epoch was open", c)
	default:
	}
	close(release)
	if err := <-inserted; err != nil {
		t.Fatalf("held insert: %v", err)
	}
	if c := <-taken; c.UnitsHeld != 5 || c.Epoch != 1 {
		t.Fatalf("TakeOver: got units held %d, epoch %d; want 5 (the held insert's), 1", c.UnitsHeld, c.Epoch)
	}
}

// TestReturnUnits: a final order's units come back once, an active one's
// never; finals the take-over counted are not returned again; a campaign
// Redis decides is refused.
func TestReturnUnits(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			const id = "ru"
			decideCampaign(t, db, id, 10, 10)
			before := orderOf(id, ded(id, 100, "u0", 1), model.OrderCancelled)
			mustInsert(t, db, []model.Order{before})
			mustTakeOver(t, db, id)
			d := ded(id, 1, "u1", 3)
			if _, err := db.Decide(t.Context(), id, []model.Deduction{d}, time.Now()); err != nil {
				t.Fatal(err)
			}
			expire := func(t *testing.T) {
				if moved, err := db.TransitionOrder(t.Context(), d.OrderID, model.OrderPendingPayment, model.OrderExpired, time.Now()); err != nil || !moved {
					t.Fatalf("expire: got %v, %v", moved, err)
				}
			}
			tests := []struct {
				name     string
				before   func(t *testing.T)
				orderID  string
				want     bool
				wantErr  error
				wantHeld int64
			}{
				{name: "active", orderID: d.OrderID, wantHeld: 3},
				{name: "final before the take-over", orderID: before.ID, wantHeld: 3},
				{name: "final", before: expire, orderID: d.OrderID, want: true, wantHeld: 0},
				{name: "final again", orderID: d.OrderID, wantHeld: 0},
				{name: "unknown", orderID: "nope", wantErr: model.ErrNotFound},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					if tc.before != nil {
						tc.before(t)
					}
					got, err := db.ReturnUnits(t.Context(), tc.orderID)
					if got != tc.want || !errors.Is(err, tc.wantErr) {
						t.Fatalf("got %v, %v; want %v, %v", got, err, tc.want, tc.wantErr)
					}
					if held, _ := heldUnits(t, db, id); tc.wantErr == nil && held != tc.wantHeld {
						t.Errorf("got units held %d, want %d", held, tc.wantHeld)
					}
				})
			}

			// Redis decides: the caller releases there.
			mustBump(t, db, id)
			e := ded(id, 2, "u2", 1)
			mustInsert(t, db, []model.Order{orderOf(id, e, model.OrderCancelled)})
			if got, err := db.ReturnUnits(t.Context(), e.OrderID); got || !errors.Is(err, model.ErrLedgerMoved) {
				t.Errorf("campaign decided in Redis: got %v, %v; want false, %v", got, err, model.ErrLedgerMoved)
			}
			if o := mustOrder(t, db, e.OrderID); o.Returned {
				t.Errorf("campaign decided in Redis: the order is marked returned")
			}
		})
	}
}

// TestBumpEpochHandsBack: a load's bump hands the campaign back to Redis:
// its orders include what MySQL decided, Decide and ReturnUnits are
// refused after it, and the Redis path stores under the new epoch.
func TestBumpEpochHandsBack(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			const id = "hb"
			decideCampaign(t, db, id, 10, 10)
			taken := mustTakeOver(t, db, id)
			d := ded(id, 1, "u1", 2)
			if _, err := db.Decide(t.Context(), id, []model.Deduction{d}, time.Now()); err != nil {
				t.Fatal(err)
			}
			c, orders := mustBump(t, db, id)
			if c.DecidedInMySQL || c.Epoch != taken.Epoch+1 || len(orders) != 1 || orders[0].ID != d.OrderID {
				t.Fatalf("BumpEpoch: got decided %v, epoch %d, orders %+v; want false, %d, the order decided in MySQL",
					c.DecidedInMySQL, c.Epoch, orders, taken.Epoch+1)
			}
			if _, err := db.Decide(t.Context(), id, []model.Deduction{ded(id, 2, "u2", 1)}, time.Now()); !errors.Is(err, model.ErrLedgerMoved) {
				t.Errorf("Decide after the hand-back: got %v, want %v", err, model.ErrLedgerMoved)
			}
			if _, err := db.ReturnUnits(t.Context(), d.OrderID); !errors.Is(err, model.ErrLedgerMoved) {
				t.Errorf("ReturnUnits after the hand-back: got %v, want %v", err, model.ErrLedgerMoved)
			}
			if err := db.InsertOrders(t.Context(), []model.Order{orderOf(id, ded(id, 3, "u3", 1), model.OrderPendingPayment)},
				model.Epochs{id: c.Epoch}); err != nil {
				t.Errorf("insert under the new epoch: %v", err)
			}
			if again := mustTakeOver(t, db, id); !again.DecidedInMySQL || again.UnitsHeld != 3 || again.Epoch != c.Epoch+1 {
				t.Errorf("second take-over: got %+v; want decided, 3 units held, epoch %d", again, c.Epoch+1)
			}
		})
	}
}

// TestDecided: a success for a stored order of the request, a refusal for
// a stored decision, nothing for an unknown request or for an order stored
// under the request's order id by another request; more ids than one
// query takes.
func TestDecided(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			const id = "dd"
			decideCampaign(t, db, id, 1, 5)
			stored := ded(id, 1, "u1", 1)
			mustInsert(t, db, []model.Order{orderOf(id, stored, model.OrderExpired)})
			// Request 3's order id, stored by request 4.
			taken := orderOf(id, ded(id, 4, "u4", 1), model.OrderPaid)
			taken.ID = ded(id, 3, "u3", 1).OrderID
			mustInsert(t, db, []model.Order{taken})
			mustTakeOver(t, db, id)
			refused := ded(id, 2, "u2", 1)
			if _, err := db.Decide(t.Context(), id, []model.Deduction{refused}, time.Now()); err != nil {
				t.Fatal(err)
			}
			want := map[string]model.Result{
				stored.RequestID: {RequestID: stored.RequestID, CampaignID: id, UserID: "u1", Status: model.StatusSuccess,
					OrderID: stored.OrderID, Quantity: 1},
				refused.RequestID: {RequestID: refused.RequestID, CampaignID: id, UserID: "u2", Status: model.StatusSoldOut, Quantity: 1},
			}
			ids := []string{ded(id, 3, "u3", 1).RequestID, ded(id, 4, "u4", 1).RequestID, "x.unknown"}
			// Past a chunk, with the known ids in the second.
			for n := range maxIDsPerQuery + 100 {
				ids = append(ids, ded(id, 1000+n, "u", 1).RequestID)
			}
			ids = append(ids, stored.RequestID, refused.RequestID)
			got, err := db.Decided(t.Context(), ids)
			if err != nil || !maps.Equal(got, want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, want)
			}
			if got, err := db.Decided(t.Context(), nil); err != nil || len(got) != 0 {
				t.Errorf("no ids: got %+v, %v", got, err)
			}
		})
	}
}

// TestDecideRace: concurrent batches of one campaign, some requests sent
// twice, while expired orders give their units back. Each request has one
// result, the same on every call; nobody passes the limit; units_held is
// the units of the active orders and never more than the stock; and once
// the demand after the last return exceeds what is left, exactly the
// stock is sold.
func TestDecideRace(t *testing.T) {
	const (
		stock, limit = 30, 3
		users        = 20 // limit × users > stock: the stock binds
		callers      = 16
		perBatch     = 9
		step         = 6 // each batch shares 3 requests with the next caller's
	)
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			const id = "race"
			decideCampaign(t, db, id, stock, limit)
			mustTakeOver(t, db, id)

			var mu sync.Mutex
			results := map[string]model.Result{}
			record := func(rs []model.Result) {
				mu.Lock()
				defer mu.Unlock()
				for _, r := range rs {
					if was, ok := results[r.RequestID]; ok && was != r {
						t.Errorf("request %s: got %+v, then %+v", r.RequestID, was, r)
					}
					results[r.RequestID] = r
				}
			}
			sold := make(chan model.Result, callers*perBatch*2)
			var returned atomic.Int64
			returnerDone := make(chan struct{})
			go func() {
				defer close(returnerDone)
				n, seen := 0, map[string]bool{}
				for r := range sold {
					// A request two callers sent is reported by both.
					if seen[r.OrderID] {
						continue
					}
					seen[r.OrderID] = true
					if n++; n%4 != 0 {
						continue
					}
					moved, err := db.TransitionOrder(t.Context(), r.OrderID, model.OrderPendingPayment, model.OrderExpired, time.Now())
					if err != nil || !moved {
						t.Errorf("expire %s: got %v, %v", r.OrderID, moved, err)
						continue
					}
					for i, want := range []bool{true, false} {
						if got, err := db.ReturnUnits(t.Context(), r.OrderID); got != want || err != nil {
							t.Errorf("ReturnUnits(%s) #%d: got %v, %v; want %v", r.OrderID, i+1, got, err, want)
						}
					}
					returned.Add(r.Quantity)
				}
			}()

			sent := map[string]bool{}
			var wg sync.WaitGroup
			for g := range callers {
				for j := range perBatch {
					sent[ded(id, g*step+j, "", 0).RequestID] = true
				}
				wg.Go(func() {
					var batch []model.Deduction
					for j := range perBatch {
						k := g*step + j
						batch = append(batch, ded(id, k, fmt.Sprintf("u%d", k%users), int64(1+k%2)))
					}
					// Sent twice, the second time backwards.
					for pass := range 2 {
						got, err := db.Decide(t.Context(), id, batch, time.Now())
						if err != nil {
							t.Errorf("Decide: %v", err)
							return
						}
						record(got)
						if pass == 0 {
							for _, r := range got {
								if r.Status == model.StatusSuccess {
									sold <- r
								}
							}
						}
						slices.Reverse(batch)
					}
				})
			}
			wg.Wait()
			close(sold)
			<-returnerDone

			// Demand from new shoppers, more than is left.
			var top []model.Deduction
			for k := range stock {
				top = append(top, ded(id, 10_000+k, fmt.Sprintf("top%d", k), 1))
			}
			got, err := db.Decide(t.Context(), id, top, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			record(got)
			for _, d := range top {
				sent[d.RequestID] = true
			}
			if len(results) != len(sent) {
				t.Errorf("got results of %d requests, want %d", len(results), len(sent))
			}

			orders, err := db.CampaignOrders(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			var active int64
			byUser := map[string]int64{}
			for _, o := range orders {
				if o.Status.Active() {
					active += o.Quantity
					byUser[o.UserID] += o.Quantity
				}
				if r := results[o.RequestID]; r.Status != model.StatusSuccess || r.OrderID != o.ID {
					t.Errorf("order %s of request %s: its result is %+v", o.ID, o.RequestID, r)
				}
			}
			for u, n := range byUser {
				if n > limit {
					t.Errorf("user %s holds %d units, limit %d", u, n, limit)
				}
			}
			var successes int64
			for _, r := range results {
				if r.Status == model.StatusSuccess {
					successes += r.Quantity
				}
			}
			held, _ := heldUnits(t, db, id)
			if active != stock || held != stock || successes-returned.Load() != stock {
				t.Errorf("got %d active units, %d held, %d sold - %d returned; want %d each", active, held, successes, returned.Load(), stock)
			}
			if len(orders) == 0 || returned.Load() == 0 {
				t.Errorf("got %d orders, %d units returned: the race exercised nothing", len(orders), returned.Load())
			}
			checkDecided(t, db, results)
		})
	}
}

// TestDecideHandBackRace: MySQL decides batches while a load hands the
// campaign back to Redis and a worker stores orders Redis decided before
// the take-over. The old insert is refused; the batches Decide refuses
// after the hand-back, and the old ones, are decided again in Redis; then
// every success is one order, Redis and MySQL agree, and redelivering
// MySQL's batches to Redis gives the same successes.
func TestDecideHandBackRace(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			st := store.New(testenv.Redis(t))
			id := testenv.Name(t, "hbr")
			decideCampaign(t, db, id, 1000, 10)
			if _, err := reconcile.Load(t.Context(), db, st, id); err != nil {
				t.Fatal(err)
			}
			// A worker's batch, decided in Redis before it went away.
			var old []model.Deduction
			for k := range 4 {
				old = append(old, ded(id, 1000+k, fmt.Sprintf("old%d", k), 1))
			}
			reply, err := st.Deduct(t.Context(), id, old)
			if err != nil {
				t.Fatal(err)
			}
			var oldOrders []model.Order
			for _, d := range old {
				oldOrders = append(oldOrders, orderOf(id, d, model.OrderPendingPayment))
			}
			mustTakeOver(t, db, id)

			const callers, batches = 6, 5
			var mu sync.Mutex
			var redo [][]model.Deduction
			decidedHere := map[string]model.Result{}
			var decides atomic.Int64
			var wg sync.WaitGroup
			for g := range callers {
				wg.Go(func() {
					for b := range batches {
						var batch []model.Deduction
						for j := range 3 {
							k := (g*batches+b)*3 + j
							batch = append(batch, ded(id, k, fmt.Sprintf("u%d", k), 1))
						}
						got, err := db.Decide(t.Context(), id, batch, time.Now())
						mu.Lock()
						switch {
						case errors.Is(err, model.ErrLedgerMoved):
							redo = append(redo, batch)
						case err != nil:
							t.Errorf("Decide: %v", err)
						default:
							for _, r := range got {
								decidedHere[r.RequestID] = r
							}
						}
						mu.Unlock()
						decides.Add(1)
					}
				})
			}
			wg.Go(func() {
				if err := db.InsertOrders(t.Context(), oldOrders, model.Epochs{id: reply.Epoch}); !errors.Is(err, model.ErrLedgerMoved) {
					t.Errorf("insert under the epoch before the take-over: got %v, want %v", err, model.ErrLedgerMoved)
				}
				mu.Lock()
				redo = append(redo, old)
				mu.Unlock()
			})
			wg.Go(func() {
				testenv.Eventually(t, 10*time.Second, "some batches decided in MySQL", func() (bool, string) {
					return decides.Load() >= callers, fmt.Sprintf("%d decided", decides.Load())
				})
				if _, err := reconcile.Load(t.Context(), db, st, id); err != nil {
					t.Errorf("load: %v", err)
				}
			})
			wg.Wait()
			if len(decidedHere) == 0 {
				t.Fatal("MySQL decided nothing")
			}

			// What MySQL refused, decided again where the worker goes back to.
			requests := len(decidedHere)
			for _, batch := range redo {
				requests += len(batch)
				reply, err := st.Deduct(t.Context(), id, batch)
				if err != nil {
					t.Fatal(err)
				}
				var orders []model.Order
				for i, r := range reply.Results {
					if r.Status != model.StatusSuccess {
						t.Fatalf("redone in Redis: got %+v, want a success", r)
					}
					orders = append(orders, orderOf(id, batch[i], model.OrderPendingPayment))
				}
				if err := db.InsertOrders(t.Context(), orders, model.Epochs{id: reply.Epoch}); err != nil {
					t.Fatalf("insert of the redone batch: %v", err)
				}
			}
			orders, err := db.CampaignOrders(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if len(orders) != requests {
				t.Errorf("got %d orders, want one for each of %d requests", len(orders), requests)
			}
			rep, err := reconcile.New(st, db).Check(t.Context(), id)
			if err != nil || !rep.Consistent() || rep.DBUnits != int64(requests) {
				t.Errorf("Redis vs MySQL: %+v, %v; want consistent with %d units", rep, err, requests)
			}
			// A redelivery of MySQL's successes to Redis changes nothing.
			for rid, r := range decidedHere {
				d := model.Deduction{RequestID: rid, UserID: r.UserID, Quantity: r.Quantity, OrderID: r.OrderID}
				again, err := st.Deduct(t.Context(), id, []model.Deduction{d})
				if err != nil || again.Results[0].Status != model.StatusSuccess || again.Results[0].OrderID != r.OrderID {
					t.Fatalf("redelivered to Redis: got %+v, %v; want its success", again.Results, err)
				}
			}
		})
	}
}

// BenchmarkDecide measures Decide on MariaDB: batches of all-success
// requests of distinct users of one campaign, from one caller and from 16.
func BenchmarkDecide(b *testing.B) {
	for _, callers := range []int{1, 16} {
		for _, size := range []int{1, 16, 128} {
			b.Run(fmt.Sprintf("callers=%d/batch=%d", callers, size), func(b *testing.B) {
				db := openDBs(b)[DriverMySQL](b)
				const id = "bench"
				decideCampaign(b, db, id, model.MaxStock, 1)
				mustTakeOver(b, db, id)
				var next atomic.Int64
				decide := func(batch []model.Deduction) bool {
					from := int(next.Add(int64(size))) - size
					for i := range batch {
						batch[i] = ded(id, from+i, fmt.Sprintf("u%d", from+i), 1)
					}
					_, err := db.Decide(b.Context(), id, batch, time.Now())
					if err != nil {
						b.Error(err)
					}
					return err == nil
				}
				if callers == 1 {
					batch := make([]model.Deduction, size)
					for b.Loop() {
						if !decide(batch) {
							return
						}
					}
				} else {
					b.SetParallelism(callers / runtime.GOMAXPROCS(0))
					b.RunParallel(func(pb *testing.PB) {
						batch := make([]model.Deduction, size)
						for pb.Next() && decide(batch) {
						}
					})
				}
				b.ReportMetric(float64(next.Load())/b.Elapsed().Seconds(), "units/s")
			})
		}
	}
}

// BenchmarkConditionalUpdate is the bound of deciding on one hot row in
// MariaDB: 16 callers each taking one unit with an autocommitted
// conditional UPDATE, nothing else.
func BenchmarkConditionalUpdate(b *testing.B) {
	db := openDBs(b)[DriverMySQL](b)
	const id = "bench"
	decideCampaign(b, db, id, model.MaxStock, 1)
	var units atomic.Int64
	b.SetParallelism(16 / runtime.GOMAXPROCS(0))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := db.pool.ExecContext(b.Context(),
				"UPDATE `campaigns` SET `units_held` = `units_held` + 1 WHERE `id` = ? AND `units_held` + 1 <= `stock`", id)
			if err != nil {
				b.Error(err)
				return
			}
			if n, _ := res.RowsAffected(); n == 1 {
				units.Add(1)
			}
		}
	})
	b.ReportMetric(float64(units.Load())/b.Elapsed().Seconds(), "units/s")
}

// TestDecidedStats: while MySQL decides a campaign its stats count the
// orders (Redis's before the take-over among them) as successes, the
// refusals MySQL decided by status, and units_held as sold; while Redis
// decides it there are none.
func TestDecidedStats(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			const id = "ds"
			decideCampaign(t, db, id, 4, 2)
			before := ded(id, 1, "u1", 1)
			mustInsert(t, db, []model.Order{orderOf(id, before, model.OrderPaid)})
			if _, decided, err := db.DecidedStats(t.Context(), id); err != nil || decided {
				t.Fatalf("decided in Redis: got decided %v, %v; want false", decided, err)
			}
			mustTakeOver(t, db, id)
			// u1 passes its limit, u2 buys 2 (3 sold), u3 wants more than
			// is left, u4 buys the last unit, u5 finds none.
			ds := []model.Deduction{ded(id, 3, "u1", 2), ded(id, 2, "u2", 2), ded(id, 4, "u3", 2), ded(id, 5, "u4", 1), ded(id, 6, "u5", 1)}
			if _, err := db.Decide(t.Context(), id, ds, time.Now()); err != nil {
				t.Fatal(err)
			}
			st, decided, err := db.DecidedStats(t.Context(), id)
			want := model.Stats{Loaded: true, Stock: 4, Sold: 4, Remaining: 0, SoldOut: true, Admitted: 6,
				FinishedByStatus: map[model.Status]int64{model.StatusSuccess: 3, model.StatusRejected: 1,
					model.StatusLimitExceeded: 1, model.StatusSoldOut: 1}}
			if err != nil || !decided || !reflect.DeepEqual(st, want) {
				t.Errorf("got %+v, %v, %v; want %+v", st, decided, err, want)
			}
		})
	}
}
