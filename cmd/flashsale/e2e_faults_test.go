package main

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"flashsale/internal/testenv"
	"flashsale/queue"
)

// TestIdempotencyKey: the same key from the same user returns the same
// request id (200) and never creates a second request.
func TestIdempotencyKey(t *testing.T) {
	c := startSystem(t, realConfig(t, "redisstream"))
	campaign := testenv.UniqueName("idem-")
	c.openCampaign(campaign, 10, 3)
	path := "/api/v1/campaigns/" + campaign + "/purchases"
	key := map[string]string{"Idempotency-Key": "order-42"}
	var first, second, other purchaseBody
	if code := c.do("POST", path, c.token("ann"), `{"quantity":1}`, key, &first); code != http.StatusAccepted {
		t.Fatalf("first: got %d, want 202", code)
	}
	if code := c.do("POST", path, c.token("ann"), `{"quantity":1}`, key, &second); code != http.StatusOK || second.RequestID != first.RequestID {
		t.Fatalf("repeat: got %d %s, want 200 %s", code, second.RequestID, first.RequestID)
	}
	if code := c.do("POST", path, c.token("ben"), `{"quantity":1}`, key, &other); code != http.StatusAccepted || other.RequestID == first.RequestID {
		t.Fatalf("another user, same key: got %d %s, want 202 and a new id", code, other.RequestID)
	}
	st := c.settle(campaign, 10*time.Second)
	if st.Accepted != 2 || st.Sold != 2 || st.OrdersInDB != 2 {
		t.Fatalf("got accepted %d sold %d orders %d, want 2 2 2", st.Accepted, st.Sold, st.OrdersInDB)
	}
	if code, r := c.poll("ben", first.RequestID); code != http.StatusNotFound {
		t.Fatalf("another user's poll: got %d %+v, want 404", code, r)
	}
}

// failingPublisher refuses every publish, as a broken queue would.
type failingPublisher struct{}

func (failingPublisher) Publish(context.Context, string, ...queue.Message) error {
	return errors.New("broker unreachable")
}

// TestQueueDownLeavesNothingBehind: when the queue refuses the publish the
// shopper gets 503 unavailable and no queued marker or counter remains.
func TestQueueDownLeavesNothingBehind(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	c := startSystemWith(t, cfg, func(p queue.Publisher) queue.Publisher { return failingPublisher{} })
	campaign := testenv.UniqueName("qdown-")
	c.openCampaign(campaign, 5, 1)
	var body purchaseBody
	code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("ann"), `{"quantity":1}`,
		map[string]string{"Idempotency-Key": "k1"}, &body)
	if code != http.StatusServiceUnavailable || body.Code != "unavailable" {
		t.Fatalf("got %d %q, want 503 unavailable", code, body.Code)
	}
	st := c.stats(campaign)
	if st.Accepted != 0 || st.Queued != 0 || st.Remaining != 5 {
		t.Fatalf("left behind: %+v", st)
	}
}

// TestSoldOutFlagAtGateway: once stock is gone, later purchases are refused
// with 410 from the gateway's flag, and the public view says sold out.
func TestSoldOutFlagAtGateway(t *testing.T) {
	c := startSystem(t, realConfig(t, "redisstream"))
	campaign := testenv.UniqueName("so-")
	c.openCampaign(campaign, 1, 1)
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("ann"), `{"quantity":1}`, nil, nil); code != http.StatusAccepted {
		t.Fatalf("first purchase: got %d", code)
	}
	c.settle(campaign, 10*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		var body purchaseBody
		code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("ben"), `{"quantity":1}`, nil, &body)
		if code == http.StatusGone && body.Code == "sold_out" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d %q, want 410 sold_out within 5s of selling out", code, body.Code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var pub struct {
		SoldOut bool `json:"sold_out"`
	}
	if code := c.do("GET", "/api/v1/campaigns/"+campaign, "", nil, nil, &pub); code != http.StatusOK || !pub.SoldOut {
		t.Fatalf("public view: got %d sold_out=%v, want 200 true", code, pub.SoldOut)
	}
}
