package main

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The order lifecycle at scale (--pay-ratio, --payment-window): a buyer
// pays with probability --pay-ratio and otherwise lets the order expire;
// shoppers left without an order keep retrying, so every unit that comes
// back is sold again while demand remains. The run waits until every order
// is paid or ended, then checks the lifecycle's invariants.

// lifecyclePrice is what one unit costs in a lifecycle run (minor units).
const lifecyclePrice = 100

// Retry pacing of the shoppers waiting for units to come back: each retry
// worker pauses between attempts, so they poll the sale rather than flood it.
const (
	retryPauseMin = 100 * time.Millisecond
	retryPauseMax = 300 * time.Millisecond
)

// settleOrder pays a new order or lets it expire, as the shopper decided.
// The result is final a moment before the worker's INSERT lands, so a 404
// right after the success is tried again for a while.
func (lt *loadtest) settleOrder(ctx context.Context, s *shopper, orderID string) {
	if !s.pays {
		lt.rec.orderSettled("abandoned")
		return
	}
	deadline := time.Now().Add(lt.o.timeout)
	for {
		status, code, err := lt.pay(ctx, s, orderID)
		switch {
		case err == nil && status == http.StatusOK:
			lt.rec.orderSettled("paid")
			return
		case err == nil && status == http.StatusConflict && code == "order_not_payable":
			lt.rec.orderSettled("late") // it expired before the payment
			return
		case err == nil && status == http.StatusNotFound && time.Now().Before(deadline):
			if !sleepUntil(ctx, time.Now().Add(20*time.Millisecond)) {
				return
			}
			continue
		}
		if err == nil {
			err = fmt.Errorf("status %d %s", status, code)
		}
		lt.rec.orderSettled("pay failed: " + err.Error())
		return
	}
}

// pay posts …/orders/{id}/pay for the shopper.
func (lt *loadtest) pay(ctx context.Context, s *shopper, orderID string) (int, string, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(lt.o.url + "/api/v1/orders/" + url.PathEscape(orderID) + "/pay")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.Set("Authorization", "Bearer "+s.token)
	if err := lt.shopperCall(ctx, lt.shoppers, routePay, req, resp); err != nil {
		return 0, "", err
	}
	var body struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(resp.Body(), &body)
	return resp.StatusCode(), body.Code, nil
}

// resell lets the shoppers without an order retry, --concurrency at a
// time, until every unit is paid for, no shopper is left waiting, or no
// new order came for --settle. It returns how many shoppers were still
// waiting when it stopped.
func (lt *loadtest) resell(ctx context.Context, shoppers []*shopper) int {
	var waiting []*shopper
	for _, s := range shoppers {
		if !lt.rec.hasOrder(s.user) {
			waiting = append(waiting, s)
		}
	}
	next := make(chan *shopper, len(waiting))
	for _, s := range waiting {
		next <- s
	}
	var left atomic.Int64
	left.Store(int64(len(waiting)))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range min(lt.o.concurrency, len(waiting)) {
		wg.Go(func() {
			for {
				var s *shopper
				select {
				case <-stop:
					return
				case s = <-next:
				}
				if lt.retry(ctx, s) {
					left.Add(-1)
				} else {
					next <- s
				}
				select {
				case <-stop:
					return
				case <-time.After(retryPauseMin + mrand.N(retryPauseMax-retryPauseMin)):
				}
			}
		})
	}
	lastOrders, progress := lt.rec.orderCount(), time.Now()
	for left.Load() > 0 && lt.rec.paidCount() < lt.o.stock && time.Since(progress) < lt.o.settle && ctx.Err() == nil {
		sleepUntil(ctx, time.Now().Add(100*time.Millisecond))
		if n := lt.rec.orderCount(); n != lastOrders {
			lastOrders, progress = n, time.Now()
		}
	}
	close(stop)
	wg.Wait()
	return int(left.Load())
}

// retry makes one purchase attempt for a waiting shopper and reports
// whether the shopper is done waiting (has an order, or gave up on an
// error the sale will not recover from).
func (lt *loadtest) retry(ctx context.Context, s *shopper) bool {
	sent := time.Now()
	a := lt.purchase(ctx, s, "", sent)
	if a.status != http.StatusAccepted {
		return false // sold out, rate limited: try again later
	}
	lt.rec.admitted(s.user, a.requestID)
	r, err := lt.pollResult(ctx, s, a.requestID, sent.Add(lt.o.settle))
	if err != nil {
		lt.rec.missing(a.requestID, err)
		return true
	}
	lt.rec.result(s.user, r, "poll", sent)
	if r.Status != "success" {
		return false
	}
	lt.settleOrder(ctx, s, r.OrderID)
	return true
}

// lifecycleState is the sale as the admin API shows it once every order
// is paid or ended.
type lifecycleState struct {
	pending    int64            // orders still pending payment (0 once final)
	paid       int64            // paid orders
	paidUnits  int64            // their units
	activeUser map[string]int64 // units of paid orders by user
	waiting    int              // shoppers still without an order when the retries stopped
}

// awaitFinalOrders waits until no order of the campaign is pending
// payment (or deadline), then lists the paid ones.
func (lt *loadtest) awaitFinalOrders(ctx context.Context, deadline time.Time) (lifecycleState, error) {
	path := "/admin/v1/campaigns/" + lt.o.campaign + "/orders?limit=1&status=pending_payment"
	for {
		var page orderListing
		if err := lt.adminCall(ctx, http.MethodGet, path, nil, &page); err != nil {
			return lifecycleState{}, fmt.Errorf("pending orders: %w", err)
		}
		if len(page.Orders) == 0 || !time.Now().Before(deadline) || ctx.Err() != nil {
			break
		}
		sleepUntil(ctx, time.Now().Add(200*time.Millisecond))
	}
	st := lifecycleState{activeUser: map[string]int64{}}
	for _, status := range []string{"pending_payment", "paid"} {
		cursor := ""
		for {
			var page orderListing
			q := "/admin/v1/campaigns/" + lt.o.campaign + "/orders?limit=100&status=" + status + "&cursor=" + url.QueryEscape(cursor)
			if err := lt.adminCall(ctx, http.MethodGet, q, nil, &page); err != nil {
				return lifecycleState{}, fmt.Errorf("%s orders: %w", status, err)
			}
			for _, o := range page.Orders {
				if status == "pending_payment" {
					st.pending++
					continue
				}
				st.paid++
				st.paidUnits += o.Quantity
				st.activeUser[o.UserID] += o.Quantity
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
	}
	return st, nil
}

// orderListing is a page of the admin's order listing.
type orderListing struct {
	Orders []struct {
		UserID   string `json:"user_id"`
		Quantity int64  `json:"quantity"`
	} `json:"orders"`
	NextCursor string `json:"next_cursor"`
}

// orderSettled records what became of a new order: "paid", "late" (it
// expired before the payment), "abandoned" or a payment failure.
func (r *recorder) orderSettled(outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.settledOrders[outcome]++
}

// hasOrder reports whether user was told of a success.
func (r *recorder) hasOrder(user string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.units[user] > 0
}

// orderCount is the successes shoppers were told of (one unit each).
func (r *recorder) orderCount() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.successes
}

func (r *recorder) paidCount() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(r.settledOrders["paid"])
}

// lifecycleReport is what a lifecycle run adds to the report.
type lifecycleReport struct {
	PaymentWindow string         `json:"payment_window"`
	PayRatio      float64        `json:"pay_ratio"`
	Orders        int64          `json:"orders"`
	Paid          int64          `json:"paid"`
	Ended         int64          `json:"ended"` // expired or paid too late
	UnitsResold   int64          `json:"units_resold"`
	Settled       map[string]int `json:"orders_by_buyer_action"`
	Waiting       int            `json:"shoppers_waiting_at_end"`
}

// lifecycleInvariants are a lifecycle run's checks: units come back and are
// sold again, so they replace those that count every success as a sale.
func (r *recorder) lifecycleInvariants(st serverStats, lc *lifecycleState) []invariant {
	check := func(name string, ok bool, format string, args ...any) invariant {
		return invariant{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)}
	}
	var over []string
	for user, n := range lc.activeUser {
		if n > r.o.perUserLimit {
			over = append(over, fmt.Sprintf("%s holds %d", user, n))
		}
	}
	sort.Strings(over)
	return []invariant{
		check("no oversell", lc.paidUnits <= r.o.stock, "paid units %d, stock %d", lc.paidUnits, r.o.stock),
		check("every order paid or ended", lc.pending == 0, "%d orders still pending payment", lc.pending),
		check("released units resold while demand remained", lc.paidUnits == r.o.stock || lc.waiting == 0,
			"paid units %d of %d, %d shoppers still waiting", lc.paidUnits, r.o.stock, lc.waiting),
		r.resultInvariant(st),
		check("no user above its limit", len(over) == 0, "limit %d%s", r.o.perUserLimit, listed(over)),
		check("orders in the database = successes", st.OrdersInDB == r.successes,
			"orders_in_db %d, successes %d", st.OrdersInDB, r.successes),
		check("no unit released twice: Redis = MySQL", st.Sold == lc.paidUnits && st.Remaining == r.o.stock-lc.paidUnits,
			"server sold %d, remaining %d; paid units %d of %d", st.Sold, st.Remaining, lc.paidUnits, r.o.stock),
		check("every payment answered paid its order", int64(r.settledOrders["paid"]) == lc.paid,
			"payments answered 200: %d, paid orders %d", r.settledOrders["paid"], lc.paid),
		r.idempotencyInvariant(),
		r.retractionInvariant(),
	}
}
