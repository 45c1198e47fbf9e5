package notifier

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/requestid"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/model"
)

// testIssuer stands for the gateways' request id key
// (Options.Issuer).
var testIssuer = requestid.NewIssuer([]byte("the notifier tests' secret, 32 bytes or more"))

// uuidAt is a UUIDv7 of the millisecond at.
func uuidAt(t *testing.T, at time.Time) [16]byte {
	t.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(b[:6], ms[2:])
	b[6] = 0x70 | b[6]&0x0f
	b[8] = 0x80 | b[8]&0x3f
	return b
}

// requestIDAt is a request id of tag issued to userID at at, as the
// gateway makes it under testIssuer's key.
func requestIDAt(t *testing.T, tag, userID string, at time.Time) string {
	t.Helper()
	return testIssuer.Sign(tag, userID, uuidAt(t, at))
}

// unsignedIDAt is a request id of tag at at that no gateway issued: well
// formed, its tail a random UUIDv7.
func unsignedIDAt(t *testing.T, tag string, at time.Time) string {
	t.Helper()
	b := uuidAt(t, at)
	return model.FormatRequestID(tag, hex.EncodeToString(b[:]))
}

// mustLostCount fails unless e's campaign counts want requests lost.
func mustLostCount(t *testing.T, e env, want int64) {
	t.Helper()
	st, err := e.src.(*store.Store).Stats(mustContext(t), e.campaign)
	if err != nil || st.Lost != want {
		t.Fatalf("lost counter: got %d (%v), want %d", st.Lost, err, want)
	}
}

// mustNotStored fails if Redis holds a result for any of ids.
func mustNotStored(t *testing.T, e env, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if r, err := e.src.Result(mustContext(t), id); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("%s: got %+v, %v stored; want %v", id, r, err, model.ErrNotFound)
		}
	}
}

// passQueue makes the queue of e's campaign pass every request admitted
// before now, as a worker deciding a later request does: a sweep marks the
// line after an admission, then a request admitted after it is decided.
func passQueue(t *testing.T, e env) {
	t.Helper()
	st := e.src.(*store.Store)
	e.newRequest(t, "line")
	if _, err := st.SweepNotEnqueued(mustContext(t), []string{e.campaign}, time.Hour, 0); err != nil {
		t.Fatalf("marking sweep: %v", err)
	}
	id := e.newRequest(t, "passer")
	if _, err := st.Deduct(mustContext(t), e.campaign, []model.Deduction{{RequestID: id, UserID: "passer", Quantity: 1, OrderID: model.OrderIDOf(id)}}); err != nil {
		t.Fatalf("deduct: %v", err)
	}
}

// lostOptions are the options of a notifier with the lost rule on e's
// store, answering ids testIssuer issued, and an empty ledger.
func lostOptions(e env) Options {
	return Options{Ledger: newFakeLedger(), Lost: e.src.(*store.Store), Grace: 100 * time.Millisecond, Issuer: testIssuer}
}

// TestPollLost: a request Redis and MySQL know nothing of, issued to the
// asking user, reads queued (not 404) until the queue has passed it, then
// rejected (lost); anything else stays 404, another user's too. An id not
// issued to the asking user (forged, or someone else's) is neither stored
// nor counted lost, and its owner still gets it.
func TestPollLost(t *testing.T) {
	t.Parallel()
	e := redisEnv(t)
	h := newHarness(t, e.src, lostOptions(e))
	died := requestIDAt(t, e.campaign, "alice", time.Now().Add(-time.Minute))
	get := func(t *testing.T, user, id string, wantStatus int, want map[string]any) {
		t.Helper()
		status, body := mustGet(t, h, user, "/api/v1/purchases/"+id)
		if status != wantStatus {
			t.Fatalf("GET %s as %s: got status %d, want %d (body %v)", id, user, status, wantStatus, body)
		}
		if fmt.Sprint(body) != fmt.Sprint(want) {
			t.Fatalf("GET %s as %s: got body %v, want %v", id, user, body, want)
		}
	}
	_, notFound := mustGet(t, h, "alice", "/api/v1/purchases/"+e.campaign+".zz") // as Classify writes it
	if notFound["code"] != "not_found" {
		t.Fatalf("malformed id: got %v, want code not_found", notFound)
	}

	get(t, "alice", died, http.StatusOK, map[string]any{"request_id": died, "campaign_id": e.campaign, "status": "queued", "quantity": 0.0})
	passQueue(t, e)
	lost := map[string]any{"request_id": died, "campaign_id": e.campaign, "status": "rejected", "quantity": 0.0, "reason": "lost"}
	get(t, "alice", died, http.StatusOK, lost)
	get(t, "alice", died, http.StatusOK, lost)
	get(t, "bob", died, http.StatusNotFound, notFound)
	recent := requestIDAt(t, e.campaign, "alice", time.Now())
	get(t, "alice", recent, http.StatusOK, map[string]any{"request_id": recent, "campaign_id": e.campaign, "status": "queued", "quantity": 0.0})
	get(t, "alice", requestIDAt(t, e.campaign, "alice", time.Now().Add(-3*time.Hour)), http.StatusNotFound, notFound)
	get(t, "alice", requestIDAt(t, "nt_unknown", "alice", time.Now()), http.StatusNotFound, notFound)
	get(t, "alice", "not-a-request", http.StatusNotFound, notFound)

	unsigned := unsignedIDAt(t, e.campaign, time.Now().Add(-time.Minute))
	bobs := requestIDAt(t, e.campaign, "bob", time.Now().Add(-time.Minute))
	get(t, "alice", unsigned, http.StatusNotFound, notFound)
	get(t, "alice", bobs, http.StatusNotFound, notFound)
	mustNotStored(t, e, unsigned, bobs)
	mustLostCount(t, e, 1)
	get(t, "bob", bobs, http.StatusOK, map[string]any{"request_id": bobs, "campaign_id": e.campaign, "status": "rejected", "quantity": 0.0, "reason": "lost"})
	mustLostCount(t, e, 2)
}

// TestWSLost: a WebSocket waiter of a request Redis and MySQL know
// nothing of, issued to them, is subscribed (not refused not_found) and
// gets rejected (lost) once the queue has passed the request; one of an id
// not issued to them is refused not_found, and nothing is stored or
// counted for it.
func TestWSLost(t *testing.T) {
	t.Parallel()
	e := redisEnv(t)
	opts := lostOptions(e)
	opts.RecheckInterval = 50 * time.Millisecond
	h := newHarness(t, e.src, opts)
	died := requestIDAt(t, e.campaign, "alice", time.Now().Add(-time.Minute))
	ws := mustDial(t, h, "alice")
	if got, errs := mustSubscribe(t, ws, died); len(got) != 1 || len(errs) != 0 {
		t.Fatalf("subscribe: got %v, errors %+v; want subscribed", got, errs)
	}
	passQueue(t, e)
	checkResult(t, mustReadResult(t, ws), model.Result{RequestID: died, CampaignID: e.campaign, Status: model.StatusRejected, Reason: model.ReasonLost})

	// Already lost when subscribed: at once. Another user: not found.
	other := mustDial(t, h, "bob")
	if got, errs := mustSubscribe(t, other, died); len(got) != 0 || len(errs) != 1 || errs[0].Code != codeNotFound {
		t.Fatalf("another user: got %v, errors %+v; want not_found", got, errs)
	}
	again := requestIDAt(t, e.campaign, "alice", time.Now().Add(-time.Minute))
	if got, errs := mustSubscribe(t, ws, again); len(got) != 1 || len(errs) != 0 {
		t.Fatalf("subscribe: got %v, errors %+v; want subscribed", got, errs)
	}
	checkResult(t, mustReadResult(t, ws), model.Result{RequestID: again, CampaignID: e.campaign, Status: model.StatusRejected, Reason: model.ReasonLost})

	// Not issued to alice: forged, or bob's.
	unsigned := unsignedIDAt(t, e.campaign, time.Now().Add(-time.Minute))
	bobs := requestIDAt(t, e.campaign, "bob", time.Now().Add(-time.Minute))
	got, errs := mustSubscribe(t, ws, unsigned, bobs)
	if len(got) != 0 || len(errs) != 2 || errs[0].Code != codeNotFound || errs[1].Code != codeNotFound {
		t.Fatalf("ids not issued to alice: got %v, errors %+v; want not_found twice", got, errs)
	}
	mustNotStored(t, e, unsigned, bobs)
	mustLostCount(t, e, 2)
}

// fakeRestorer answers NeedsRestore with a campaign as MySQL would hold
// it, and records the restores asked for.
type fakeRestorer struct {
	campaign model.Campaign
	lost     bool
	restores chan string // the triggers
}

func (f *fakeRestorer) NeedsRestore(context.Context, string) (model.Campaign, bool, error) {
	return f.campaign, f.lost, nil
}

func (f *fakeRestorer) RestoreInBackground(_ context.Context, _, trigger string, _ func()) {
	f.restores <- trigger
}

// TestPollAfterSale: a request of a campaign Redis does not hold whose
// sale is over (lost after the end, or archived), which neither Redis nor
// MySQL decided, reads queued until the sale ended the longest queue delay
// ago, then rejected (lost), computed, not stored; an id the campaign
// cannot have issued to the user stays 404. A campaign whose sale runs is
// restored, and its requests read queued meanwhile.
func TestPollAfterSale(t *testing.T) {
	t.Parallel()
	e := redisEnv(t)
	now := time.Now()
	c := model.Campaign{ID: e.campaign + "-gone", Stock: 10, PerUserLimit: 1, Buckets: 2, Epoch: 3,
		StartAt: now.Add(-time.Hour), EndAt: now.Add(-10 * time.Minute)}
	restorer := &fakeRestorer{campaign: c, restores: make(chan string, 8)}
	opts := lostOptions(e)
	opts.MaxQueueDelay = 5 * time.Minute
	opts.Restorer = restorer
	h := newHarness(t, e.src, opts)
	idOf := func(user string, at time.Time) string {
		return requestIDAt(t, model.UserTag(c, user), user, at)
	}
	otherBucket := func(user string) string {
		return model.BucketTag(c.ID, 1-model.BucketOf(user, 2), 2)
	}
	status := func(user, id string) (int, string) {
		t.Helper()
		code, body := mustGet(t, h, user, "/api/v1/purchases/"+id)
		return code, fmt.Sprint(body["status"], "/", body["reason"])
	}
	// Each case its own id: a final answer is kept a second (finals).
	inSale := func() string { return idOf("alice", now.Add(-30*time.Minute)) }
	lostID := inSale()
	for _, tc := range []struct {
		name     string
		endedAgo time.Duration
		epoch    model.Epoch
		id       string
		want     int
		result   string
	}{
		{"ended the delay ago", 10 * time.Minute, 3, lostID, http.StatusOK, "rejected/lost"},
		{"ended less than the delay ago", time.Minute, 3, inSale(), http.StatusOK, "queued/<nil>"},
		{"never loaded", 10 * time.Minute, 0, inSale(), http.StatusNotFound, "<nil>/<nil>"},
		{"another user's bucket", 10 * time.Minute, 3, requestIDAt(t, otherBucket("alice"), "alice", now.Add(-30*time.Minute)), http.StatusNotFound, "<nil>/<nil>"},
		{"not issued", 10 * time.Minute, 3, unsignedIDAt(t, model.UserTag(c, "alice"), now.Add(-30*time.Minute)), http.StatusNotFound, "<nil>/<nil>"},
		{"issued to another user", 10 * time.Minute, 3, requestIDAt(t, model.UserTag(c, "alice"), "bob", now.Add(-30*time.Minute)), http.StatusNotFound, "<nil>/<nil>"},
		{"admitted before the start", 10 * time.Minute, 3, idOf("alice", now.Add(-2*time.Hour)), http.StatusNotFound, "<nil>/<nil>"},
		{"admitted after the end", 40 * time.Minute, 3, inSale(), http.StatusNotFound, "<nil>/<nil>"},
	} {
		restorer.campaign.EndAt, restorer.campaign.Epoch = now.Add(-tc.endedAgo), tc.epoch
		if code, got := status("alice", tc.id); code != tc.want || got != tc.result {
			t.Errorf("%s: got %d %s, want %d %s", tc.name, code, got, tc.want, tc.result)
		}
	}
	// Computed, not stored: nothing in Redis answers for it.
	if _, err := e.src.Result(mustContext(t), lostID); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("after-sale answer stored: Result got %v, want %v", err, model.ErrNotFound)
	}
	// A sale that runs: restored by the poll, queued meanwhile; not by
	// the poll of an id not issued to the poller.
	restorer.campaign.EndAt, restorer.campaign.Epoch, restorer.lost = now.Add(time.Hour), 3, true
	if code, got := status("alice", unsignedIDAt(t, model.UserTag(c, "alice"), now.Add(-30*time.Minute))); code != http.StatusNotFound {
		t.Errorf("not issued, lost while the sale runs: got %d %s, want 404", code, got)
	}
	if n := len(restorer.restores); n != 0 {
		t.Errorf("not issued, lost while the sale runs: got %d restores, want none", n)
	}
	if code, got := status("alice", inSale()); code != http.StatusOK || got != "queued/<nil>" {
		t.Errorf("lost while the sale runs: got %d %s, want 200 queued", code, got)
	}
	select {
	case trigger := <-restorer.restores:
		if trigger != "poll" {
			t.Errorf("restore trigger: got %q, want poll", trigger)
		}
	case <-time.After(10 * time.Second):
		t.Error("lost while the sale runs: no restore started")
	}
}
