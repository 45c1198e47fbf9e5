package store

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// backend is one Redis the scripts must work on: real Redis and Redis
// Cluster in production and miniredis in the embedded mode. On the cluster
// each test's campaigns get slots of their own, so the tests as a whole
// cover every master, and a script touching a key without its campaign's tag
// fails with CROSSSLOT.
type backend struct {
	name  string
	store func(t *testing.T) *Store
}

func backends() []backend {
	return []backend{
		{name: "redis", store: func(t *testing.T) *Store { return New(testenv.Redis(t)) }},
		{name: "cluster", store: func(t *testing.T) *Store { return New(testenv.RedisCluster(t)) }},
		{name: "miniredis", store: func(t *testing.T) *Store {
			m := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { _ = c.Close() })
			return New(c, WithPlainResults())
		}},
	}
}

// forEachBackend runs fn as one subtest per backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, s *Store)) {
	t.Helper()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { fn(t, b.store(t)) })
	}
}

// forEachServer runs fn on the real Redis and on the cluster only: races
// and batch sizes that miniredis's single lock proves nothing about.
func forEachServer(t *testing.T, fn func(t *testing.T, s *Store)) {
	t.Helper()
	for _, b := range backends() {
		if b.name != "miniredis" {
			t.Run(b.name, func(t *testing.T) { fn(t, b.store(t)) })
		}
	}
}

// testStart is a sale start in the future, on a whole millisecond so that it
// survives the round trip through rebuild.lua unchanged.
func testStart() time.Time { return time.Now().Add(time.Hour).Truncate(time.Millisecond) }

// newCampaign returns a campaign of t's own, whose Redis keys are deleted
// when t ends.
func newCampaign(t testing.TB, stock, limit int64) model.Campaign {
	start := testStart()
	return model.Campaign{
		ID:           testenv.Name(t, "c"),
		Name:         "test",
		Stock:        stock,
		PerUserLimit: limit,
		StartAt:      start,
		EndAt:        start.Add(time.Hour),
		Epoch:        1, // what a first load bumps it to
	}
}

func newRequestID(campaignID string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return model.FormatRequestID(campaignID, hex.EncodeToString(b))
}

// labels maps the short names a table uses ("r1") to request ids of one
// campaign, made on first use.
type labels struct {
	campaignID string
	ids        map[string]string
}

func newLabels(campaignID string) *labels {
	return &labels{campaignID: campaignID, ids: map[string]string{}}
}

func (l *labels) rid(label string) string {
	if id, ok := l.ids[label]; ok {
		return id
	}
	id := newRequestID(l.campaignID)
	l.ids[label] = id
	return id
}

// mustLoad loads c without orders, as its first load does, and checks that
// it was loaded.
func mustLoad(t *testing.T, s *Store, c model.Campaign) {
	t.Helper()
	mustRebuild(t, s, c, nil)
}

func mustRebuild(t *testing.T, s *Store, c model.Campaign, orders []model.Order) {
	t.Helper()
	loaded, err := s.Rebuild(t.Context(), c, orders, nil)
	if err != nil || !loaded {
		t.Fatalf("Rebuild(%s, epoch %d, %d orders): got %v, %v; want loaded", c.ID, c.Epoch, len(orders), loaded, err)
	}
}

// mustDeduct decides batch and raises the durable mark as the worker does
// once the orders are stored, so its successes read as successes.
func mustDeduct(t *testing.T, s *Store, campaignID string, batch []model.Deduction) model.DeductReply {
	t.Helper()
	r, err := s.Deduct(t.Context(), campaignID, batch)
	if err != nil {
		t.Fatalf("Deduct(%s, %d requests): %v", campaignID, len(batch), err)
	}
	if len(r.Results) != len(batch) {
		t.Fatalf("Deduct(%s): got %d results, want %d", campaignID, len(r.Results), len(batch))
	}
	mustMarkDurable(t, s, campaignID, r)
	return r
}

// mustMarkDurable raises tag's durable mark to r's successes.
func mustMarkDurable(t *testing.T, s *Store, tag string, r model.DeductReply) {
	t.Helper()
	if r.Made == 0 {
		return
	}
	if err := s.MarkDurable(t.Context(), tag, r.Made, r.Epoch); err != nil {
		t.Fatalf("MarkDurable(%s, %d, epoch %d): %v", tag, r.Made, r.Epoch, err)
	}
}

// mustAdmit admits r alone with the rate limits off, as the gateway does
// with limits off and nothing else in flight. It returns the request id that
// stands for r and whether it is an earlier request's (the Idempotency-Key
// was seen before).
func mustAdmit(t *testing.T, s *Store, r model.AdmitRequest) (string, bool) {
	t.Helper()
	got, err := s.Admit(t.Context(), r.CampaignID, []model.AdmitRequest{r}, model.RateLimits{})
	if err != nil {
		t.Fatalf("Admit(%+v): %v", r, err)
	}
	switch got[0].Code {
	case model.Admitted:
		return got[0].RequestID, false
	case model.AdmitExisting:
		return got[0].RequestID, true
	}
	t.Fatalf("Admit(%+v): got code %d, want %d or %d", r, got[0].Code, model.Admitted, model.AdmitExisting)
	return "", false
}

func mustWithdraw(t *testing.T, s *Store, batch ...model.AdmitRequest) {
	t.Helper()
	if err := s.Withdraw(t.Context(), batch); err != nil {
		t.Fatalf("Withdraw(%+v): %v", batch, err)
	}
}

func mustStats(t *testing.T, s *Store, campaignID string) model.Stats {
	t.Helper()
	st, err := s.Stats(t.Context(), campaignID)
	if err != nil {
		t.Fatalf("Stats(%s): %v", campaignID, err)
	}
	return st
}

func mustResult(t *testing.T, s *Store, requestID string) model.Result {
	t.Helper()
	r, err := s.Result(t.Context(), requestID)
	if err != nil {
		t.Fatalf("Result(%s): %v", requestID, err)
	}
	return r
}

func mustNoResult(t *testing.T, s *Store, requestID string) {
	t.Helper()
	r, err := s.Result(t.Context(), requestID)
	if !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("Result(%s) = %+v, %v; want error %v", requestID, r, err, model.ErrNotFound)
	}
}

// seqless returns r without its sequence number, which a queued result
// must have (admit.lua numbers every admitted request).
func seqless(t *testing.T, r model.Result) model.Result {
	t.Helper()
	if r.Status == model.StatusQueued && r.Seq < 1 {
		t.Errorf("queued result %s: got sequence number %d, want >= 1", r.RequestID, r.Seq)
	}
	r.Seq = 0
	return r
}

func mustSoldOut(t *testing.T, s *Store, campaignID string) bool {
	t.Helper()
	ok, err := s.SoldOut(t.Context(), campaignID)
	if err != nil {
		t.Fatalf("SoldOut(%s): %v", campaignID, err)
	}
	return ok
}

// mustUserUnits reads the units deduct.lua counted for a user (0 when none).
func mustUserUnits(t *testing.T, s *Store, campaignID, userID string) int64 {
	t.Helper()
	n, err := s.rdb.HGet(t.Context(), campaignKeys(campaignID).users, userID).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatalf("units of %s in %s: %v", userID, campaignID, err)
	}
	return n
}

// finished returns a FinishedByStatus map with every final status present.
func finished(counts map[model.Status]int64) map[model.Status]int64 {
	out := map[model.Status]int64{}
	for _, s := range model.FinalStatuses {
		out[s] = counts[s]
	}
	return out
}

// checkFinished compares Stats.FinishedByStatus with want (missing = 0).
func checkFinished(t *testing.T, got model.Stats, want map[model.Status]int64) {
	t.Helper()
	for _, s := range model.FinalStatuses {
		if got.FinishedByStatus[s] != want[s] {
			t.Errorf("finished %s: got %d, want %d", s, got.FinishedByStatus[s], want[s])
		}
	}
	if len(got.FinishedByStatus) != len(model.FinalStatuses) {
		t.Errorf("FinishedByStatus: got %v, want exactly the final statuses", got.FinishedByStatus)
	}
}
