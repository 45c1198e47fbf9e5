package sqlstore

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

var allOrderStatuses = []model.OrderStatus{model.OrderPendingPayment, model.OrderPaid, model.OrderCancelled,
	model.OrderExpired, model.OrderRefunded}

// setStatus puts an order in a state directly, to start a test from it.
func setStatus(t *testing.T, db *DB, orderID string, s model.OrderStatus) {
	t.Helper()
	if _, err := db.pool.ExecContext(t.Context(), "UPDATE `orders` SET `status` = ? WHERE `id` = ?", string(s), orderID); err != nil {
		t.Fatalf("set %s to %s: %v", orderID, s, err)
	}
}

func mustOrder(t *testing.T, db *DB, orderID string) model.Order {
	t.Helper()
	o, err := db.Order(t.Context(), orderID)
	if err != nil {
		t.Fatalf("Order(%s): %v", orderID, err)
	}
	return o
}

// TestTransitionOrder: every allowed move succeeds from its state and from
// no other, leaving the order as it was when refused; a move the lifecycle
// does not allow is an error and changes nothing.
func TestTransitionOrder(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			n := 0
			for _, from := range allOrderStatuses {
				for _, to := range allOrderStatuses {
					for _, current := range allOrderStatuses {
						name := fmt.Sprintf("%s->%s/in_%s", from, to, current)
						o := testOrders("c1", n, 1)[0]
						n++
						mustInsert(t, db, []model.Order{o})
						setStatus(t, db, o.ID, current)
						before := mustOrder(t, db, o.ID)
						at := before.UpdatedAt.Add(time.Second)

						moved, err := db.TransitionOrder(t.Context(), o.ID, from, to, at)
						after := mustOrder(t, db, o.ID)
						switch {
						case !from.CanTransition(to):
							var inv *model.InvalidError
							if !errors.As(err, &inv) || moved {
								t.Errorf("%s: got %v, %v; want an InvalidError", name, moved, err)
							}
						case err != nil:
							t.Errorf("%s: got error %v", name, err)
						case (current == from) != moved:
							t.Errorf("%s: got moved %v, want %v", name, moved, current == from)
						}
						want := before
						if moved {
							want.Status, want.UpdatedAt = to, at
						}
						if !after.UpdatedAt.Equal(want.UpdatedAt) || after.Status != want.Status {
							t.Errorf("%s: got %s at %s, want %s at %s", name, after.Status, after.UpdatedAt, want.Status, want.UpdatedAt)
						}
					}
				}
			}
			if _, err := db.Order(t.Context(), "no-such-order"); !errors.Is(err, model.ErrNotFound) {
				t.Errorf("Order(unknown): got %v, want %v", err, model.ErrNotFound)
			}
			if moved, err := db.TransitionOrder(t.Context(), "no-such-order", model.OrderPendingPayment, model.OrderExpired, time.Now()); moved || err != nil {
				t.Errorf("TransitionOrder(unknown): got %v, %v; want false, nil", moved, err)
			}
		})
	}
}

// TestPaymentVsExpiryRace: a succeeded payment and the expiry of the same
// pending order at the same instant, 200 times, each from its own
// goroutine (on MariaDB each through its own connection pool, as two
// instances would): exactly one wins every time, and a payment that loses
// is recorded refund_required.
func TestPaymentVsExpiryRace(t *testing.T) {
	const rounds = 200
	pairs := map[string]func(t *testing.T) (payer, expirer *DB){
		// An in-memory SQLite database lives in its one connection.
		DriverSQLite: func(t *testing.T) (*DB, *DB) {
			db := mustOpen(t, DriverSQLite, ":memory:")
			return db, db
		},
		DriverMySQL: func(t *testing.T) (*DB, *DB) {
			dsn := testenv.MySQLDSN(t)
			return mustOpen(t, DriverMySQL, dsn), mustOpen(t, DriverMySQL, dsn)
		},
	}
	for driver, pair := range pairs {
		t.Run(driver, func(t *testing.T) {
			payer, expirer := pair(t)
			orders := testOrders("race", 0, rounds)
			mustInsert(t, payer, orders)
			paid, expired := 0, 0
			for i, o := range orders {
				var (
					wg       sync.WaitGroup
					start    = make(chan struct{})
					payment  model.Payment
					moved    bool
					pErr     error
					eErr     error
					paymentI = model.Payment{ID: fmt.Sprintf("pay-%d", i), OrderID: o.ID, Amount: o.Amount, Status: model.PaymentSucceeded}
				)
				wg.Go(func() {
					<-start
					payment, _, pErr = payer.RecordPayment(t.Context(), paymentI)
				})
				wg.Go(func() {
					<-start
					moved, eErr = expirer.TransitionOrder(t.Context(), o.ID, model.OrderPendingPayment, model.OrderExpired, time.Now())
				})
				close(start)
				wg.Wait()
				if pErr != nil || eErr != nil {
					t.Fatalf("round %d: payment %v, expiry %v", i, pErr, eErr)
				}
				final := mustOrder(t, payer, o.ID).Status
				switch {
				case moved && payment.Status == model.PaymentRefundRequired && final == model.OrderExpired:
					expired++
				case !moved && payment.Status == model.PaymentSucceeded && final == model.OrderPaid:
					paid++
				default:
					t.Fatalf("round %d: got expiry moved %v, payment %s, order %s; want exactly one winner", i, moved, payment.Status, final)
				}
			}
			t.Logf("%d paid, %d expired", paid, expired)
		})
	}
}

func mustOpen(t *testing.T, driver, dsn string) *DB {
	t.Helper()
	db, err := Open(t.Context(), driver, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", driver, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestRecordPayment: a payment id is recorded once however many deliveries
// race; the first succeeded payment pays its order; a second one for a paid
// order, or one for an order no longer pending, is refund_required; a
// failed payment leaves the order pending.
func TestRecordPayment(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			orders := testOrders("pay", 0, 3)
			mustInsert(t, db, orders)
			o := orders[0]
			p := model.Payment{ID: "pi_1", OrderID: o.ID, Amount: o.Amount, Status: model.PaymentSucceeded}

			const deliveries = 16
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				created int
				stored  []model.Payment
			)
			for range deliveries {
				wg.Go(func() {
					got, c, err := db.RecordPayment(t.Context(), p)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Errorf("RecordPayment: %v", err)
						return
					}
					if c {
						created++
					}
					stored = append(stored, got)
				})
			}
			wg.Wait()
			if created != 1 || len(stored) != deliveries {
				t.Fatalf("got %d created of %d answers, want 1 of %d", created, len(stored), deliveries)
			}
			for _, s := range stored {
				if s != stored[0] || s.Status != model.PaymentSucceeded || s.OrderID != o.ID || s.Amount != o.Amount || s.CreatedAt.IsZero() {
					t.Fatalf("got stored %+v, want every answer %+v, succeeded", s, stored[0])
				}
			}
			if got := mustOrder(t, db, o.ID).Status; got != model.OrderPaid {
				t.Fatalf("order: got %s, want paid", got)
			}

			tests := []struct {
				name        string
				p           model.Payment
				wantStatus  model.PaymentStatus
				wantOrder   model.OrderStatus
				wantCreated bool
			}{
				{name: "replay with other details keeps the first", p: model.Payment{ID: "pi_1", OrderID: orders[1].ID, Amount: 1, Status: model.PaymentFailed},
					wantStatus: model.PaymentSucceeded, wantOrder: model.OrderPendingPayment},
				{name: "second payment of a paid order", p: model.Payment{ID: "pi_2", OrderID: o.ID, Amount: o.Amount, Status: model.PaymentSucceeded},
					wantStatus: model.PaymentRefundRequired, wantOrder: model.OrderPaid, wantCreated: true},
				{name: "failed payment", p: model.Payment{ID: "pi_3", OrderID: orders[1].ID, Amount: orders[1].Amount, Status: model.PaymentFailed},
					wantStatus: model.PaymentFailed, wantOrder: model.OrderPendingPayment, wantCreated: true},
				{name: "success after the failure", p: model.Payment{ID: "pi_4", OrderID: orders[1].ID, Amount: orders[1].Amount, Status: model.PaymentSucceeded},
					wantStatus: model.PaymentSucceeded, wantOrder: model.OrderPaid, wantCreated: true},
			}
			for _, tc := range tests {
				got, c, err := db.RecordPayment(t.Context(), tc.p)
				if err != nil || c != tc.wantCreated || got.Status != tc.wantStatus {
					t.Errorf("%s: got %+v, created %v, %v; want %s, created %v", tc.name, got, c, err, tc.wantStatus, tc.wantCreated)
				}
				if o := mustOrder(t, db, orders[1].ID); tc.p.OrderID == orders[1].ID && o.Status != tc.wantOrder {
					t.Errorf("%s: order got %s, want %s", tc.name, o.Status, tc.wantOrder)
				}
			}

			late := orders[2]
			setStatus(t, db, late.ID, model.OrderExpired)
			got, _, err := db.RecordPayment(t.Context(), model.Payment{ID: "pi_5", OrderID: late.ID, Amount: late.Amount, Status: model.PaymentSucceeded})
			if err != nil || got.Status != model.PaymentRefundRequired {
				t.Fatalf("late payment: got %+v, %v; want refund_required", got, err)
			}
			if s := mustOrder(t, db, late.ID).Status; s != model.OrderExpired {
				t.Fatalf("late payment resurrected its order: got %s, want expired", s)
			}
			if _, _, err := db.RecordPayment(t.Context(), model.Payment{ID: "pi_6", OrderID: late.ID, Status: "pending"}); err == nil {
				t.Fatalf("unknown payment status: got nil, want an error")
			}
		})
	}
}

// TestPagination: pages of every size walk a listing newest first with no
// row twice and none missed, orders sharing a created_at included.
func TestPagination(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			// Five batches (a batch shares its created_at), for one user
			// and one campaign, and another user's orders in between.
			var mine []model.Order
			for b := range 5 {
				batch := testOrders("pg", 100*b, 9)
				for i := range batch {
					if i%3 != 2 {
						batch[i].UserID = "shopper"
					}
				}
				mustInsert(t, db, batch)
				time.Sleep(2 * time.Millisecond) // the next batch's created_at is later, even at MySQL's milliseconds
				for _, o := range batch {
					if o.UserID == "shopper" {
						mine = append(mine, mustOrder(t, db, o.ID))
					}
				}
			}
			newestFirst := func(list []model.Order) {
				slices.SortFunc(list, func(a, b model.Order) int {
					if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
						return c
					}
					return cmpString(b.ID, a.ID)
				})
			}
			newestFirst(mine)
			newest, oldest := testOrders("pg", 400, 9), testOrders("pg", 0, 9)
			if !slices.ContainsFunc(newest, func(o model.Order) bool { return o.ID == mine[0].ID }) ||
				!slices.ContainsFunc(oldest, func(o model.Order) bool { return o.ID == mine[len(mine)-1].ID }) {
				t.Fatalf("got newest %s, oldest %s; want one of the last batch first, one of the first last", mine[0].ID, mine[len(mine)-1].ID)
			}
			all, err := db.CampaignOrders(t.Context(), "pg")
			if err != nil {
				t.Fatal(err)
			}
			newestFirst(all)
			setStatus(t, db, all[3].ID, model.OrderExpired)
			setStatus(t, db, all[20].ID, model.OrderExpired)
			expired := []string{all[3].ID, all[20].ID}

			for _, limit := range []int{1, 2, 7, 29, 30, 31, 100} {
				walk := func(name string, want []string, list func(cursor string) ([]model.Order, string, error)) {
					var got []string
					cursor := ""
					for pages := 0; ; pages++ {
						page, next, err := list(cursor)
						if err != nil {
							t.Fatalf("%s, limit %d: %v", name, limit, err)
						}
						if len(page) > limit || (next != "" && len(page) != limit) {
							t.Fatalf("%s, limit %d: got a page of %d with next %q", name, limit, len(page), next)
						}
						got = append(got, orderIDs(page)...)
						if next == "" {
							break
						}
						if pages > len(want) {
							t.Fatalf("%s, limit %d: more pages than rows", name, limit)
						}
						cursor = next
					}
					if !slices.Equal(got, want) {
						t.Errorf("%s, limit %d: got %v, want %v", name, limit, got, want)
					}
				}
				walk("user", orderIDs(mine), func(c string) ([]model.Order, string, error) {
					return db.UserOrders(t.Context(), "shopper", c, limit)
				})
				walk("campaign", orderIDs(all), func(c string) ([]model.Order, string, error) {
					return db.CampaignOrderPage(t.Context(), "pg", "", c, limit)
				})
				walk("campaign expired", expired, func(c string) ([]model.Order, string, error) {
					return db.CampaignOrderPage(t.Context(), "pg", model.OrderExpired, c, limit)
				})
			}
			for _, bad := range []string{"!", "bm90IGEgY3Vyc29y", "MTIz"} {
				var inv *model.InvalidError
				if _, _, err := db.UserOrders(t.Context(), "shopper", bad, 10); !errors.As(err, &inv) || inv.Field != "cursor" {
					t.Errorf("cursor %q: got %v, want an InvalidError on cursor", bad, err)
				}
			}
			if got, next, err := db.UserOrders(t.Context(), "nobody", "", 10); len(got) != 0 || next != "" || err != nil {
				t.Errorf("no orders: got %v, %q, %v", got, next, err)
			}
		})
	}
}

// TestPaymentsPagination: payments list newest first by status.
func TestPaymentsPagination(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			orders := testOrders("pp", 0, 12)
			mustInsert(t, db, orders)
			base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			var late, every []string
			for i, o := range orders {
				if i%2 == 0 {
					setStatus(t, db, o.ID, model.OrderExpired)
				}
				// Pairs share a created_at.
				p := model.Payment{ID: fmt.Sprintf("pi_%02d", i), OrderID: o.ID, Amount: o.Amount, Status: model.PaymentSucceeded,
					CreatedAt: base.Add(time.Duration(i/2) * time.Second)}
				got, _, err := db.RecordPayment(t.Context(), p)
				if err != nil {
					t.Fatal(err)
				}
				every = append([]string{got.ID}, every...)
				if got.Status == model.PaymentRefundRequired {
					late = append([]string{got.ID}, late...)
				}
			}
			for _, tc := range []struct {
				status model.PaymentStatus
				want   []string
			}{{"", every}, {model.PaymentRefundRequired, late}} {
				var got []string
				cursor := ""
				for {
					page, next, err := db.Payments(t.Context(), tc.status, cursor, 5)
					if err != nil {
						t.Fatal(err)
					}
					for _, p := range page {
						got = append(got, p.ID)
					}
					if cursor = next; cursor == "" {
						break
					}
				}
				if !slices.Equal(got, tc.want) {
					t.Errorf("status %q: got %v, want %v", tc.status, got, tc.want)
				}
			}
		})
	}
}

// TestSweeperQueries: DuePending finds pending orders past a time, earliest
// first; Unreturned finds final orders whose release is not marked;
// MarkReturned marks final orders only.
func TestSweeperQueries(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			orders := testOrders("sw", 0, 6)
			for i := range orders {
				orders[i].ExpiresAt = base.Add(time.Duration(5-i) * time.Minute) // later ids expire earlier
			}
			orders[5].ExpiresAt = time.Time{} // stored before payment windows: never due
			mustInsert(t, db, orders)
			setStatus(t, db, orders[4].ID, model.OrderPaid)

			due, err := db.DuePending(t.Context(), base.Add(3*time.Minute), 10)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := orderIDs(due), []string{orders[3].ID, orders[2].ID}; !slices.Equal(got, want) {
				t.Fatalf("DuePending: got %v, want %v (earliest first, paid and undated orders left out)", got, want)
			}
			if !due[0].ExpiresAt.Equal(orders[3].ExpiresAt) {
				t.Fatalf("DuePending: got expires_at %s, want %s", due[0].ExpiresAt, orders[3].ExpiresAt)
			}
			if due, _ := db.DuePending(t.Context(), base.Add(3*time.Minute), 1); len(due) != 1 {
				t.Fatalf("DuePending limit 1: got %d orders", len(due))
			}

			if got, err := db.Unreturned(t.Context(), 10); err != nil || len(got) != 0 {
				t.Fatalf("Unreturned with none final: got %v, %v", got, err)
			}
			setStatus(t, db, orders[0].ID, model.OrderExpired)
			setStatus(t, db, orders[1].ID, model.OrderCancelled)
			setStatus(t, db, orders[2].ID, model.OrderRefunded)
			got, err := db.Unreturned(t.Context(), 10)
			if want := []string{orders[0].ID, orders[1].ID, orders[2].ID}; err != nil || !slices.Equal(slices.Sorted(slices.Values(orderIDs(got))), want) {
				t.Fatalf("Unreturned: got %v, %v; want %v", orderIDs(got), err, want)
			}
			for _, id := range []string{orders[0].ID, orders[0].ID, orders[3].ID} {
				if err := db.MarkReturned(t.Context(), id); err != nil {
					t.Fatalf("MarkReturned(%s): %v", id, err)
				}
			}
			if !mustOrder(t, db, orders[0].ID).Returned || mustOrder(t, db, orders[3].ID).Returned {
				t.Fatalf("Returned: got the pending order marked or the expired one not")
			}
			got, err = db.Unreturned(t.Context(), 10)
			if want := []string{orders[1].ID, orders[2].ID}; err != nil || !slices.Equal(slices.Sorted(slices.Values(orderIDs(got))), want) {
				t.Fatalf("Unreturned after MarkReturned: got %v, %v; want %v", orderIDs(got), err, want)
			}
			// The pending order was not marked: it still becomes due.
			due, _ = db.DuePending(t.Context(), base.Add(3*time.Minute), 10)
			if got, want := orderIDs(due), []string{orders[3].ID}; !slices.Equal(got, want) {
				t.Fatalf("DuePending after marking a pending order: got %v, want %v", got, want)
			}
		})
	}
}

func orderIDs(list []model.Order) []string {
	out := make([]string, len(list))
	for i, o := range list {
		out[i] = o.ID
	}
	return out
}

// TestCampaignPaymentFields: price and payment window survive the round
// trip, and a campaign created without a window gets the default.
func TestCampaignPaymentFields(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) {
			db := open(t)
			start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			for _, c := range []model.Campaign{
				{ID: "priced", Name: "n", Stock: 5, PerUserLimit: 1, Price: 1999, PaymentWindow: 2500 * time.Millisecond, StartAt: start, EndAt: start.Add(time.Hour)},
				{ID: "defaults", Name: "n", Stock: 5, PerUserLimit: 1, StartAt: start, EndAt: start.Add(time.Hour)},
			} {
				want := c.WithDefaults()
				created, err := db.CreateCampaign(t.Context(), c)
				if err != nil {
					t.Fatal(err)
				}
				got, err := db.Campaign(t.Context(), c.ID)
				if err != nil {
					t.Fatal(err)
				}
				for _, g := range []model.Campaign{created, got} {
					if g.Price != want.Price || g.PaymentWindow != want.PaymentWindow {
						t.Errorf("%s: got price %d window %s, want %d %s", c.ID, g.Price, g.PaymentWindow, want.Price, want.PaymentWindow)
					}
				}
			}
		})
	}
}
