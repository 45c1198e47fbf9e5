package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

type adminCampaignBody struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	Stock         int64     `json:"stock"`
	PerUserLimit  int64     `json:"per_user_limit"`
	PaymentWindow string    `json:"payment_window"`
	StartAt       time.Time `json:"start_at"`
	EndAt         time.Time `json:"end_at"`
	State         string    `json:"state"`
	Paused        bool      `json:"paused"`
	EndedEarly    bool      `json:"ended_early"`
	Loaded        bool      `json:"loaded"`
	Code          string    `json:"code"`
}

type publicCampaignBody struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	State     string `json:"state"`
	SoldOut   bool   `json:"sold_out"`
	Remaining *int64 `json:"remaining"`
}

// listIDs walks every page of the admin listing with query and returns the
// ids in order.
func (c *client) listIDs(query string) []string {
	c.t.Helper()
	var ids []string
	cursor := ""
	for {
		var page struct {
			Campaigns  []adminCampaignBody `json:"campaigns"`
			NextCursor string              `json:"next_cursor"`
		}
		if code := c.do("GET", "/admin/v1/campaigns?limit=2&"+query+"&cursor="+cursor, c.admin, nil, nil, &page); code != http.StatusOK {
			c.t.Fatalf("list %s: got %d", query, code)
		}
		for _, ca := range page.Campaigns {
			ids = append(ids, ca.ID)
		}
		if cursor = page.NextCursor; cursor == "" {
			return ids
		}
	}
}

// TestCampaignManagement: listing by state with cursors, reading, changing
// (everything before the start, with Redis loaded again; only the name
// after), deleting only an unstarted campaign, and the public list with
// state and remaining.
func TestCampaignManagement(t *testing.T) {
	c := startSystem(t, realConfig(t, "memqueue"))
	rdb := testenv.Redis(t)
	ctx := t.Context()
	open, later, other := testenv.Name(t, "run-"), testenv.Name(t, "up-"), testenv.Name(t, "up2-")
	c.openCampaign(open, 10, 2)
	start := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	for _, id := range []string{later, other} {
		body := campaignBody{ID: id, Name: "later", Stock: 5, PerUserLimit: 1, StartAt: start, EndAt: start.Add(time.Hour)}
		if code := c.do("POST", "/admin/v1/campaigns", c.admin, body, nil, nil); code != http.StatusCreated {
			t.Fatalf("create %s: got %d", id, code)
		}
	}
	if code := c.do("POST", "/admin/v1/campaigns/"+later+"/preload", c.admin, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("preload: got %d", code)
	}

	upcoming, running := c.listIDs("state=upcoming"), c.listIDs("state=running")
	if !slices.Contains(upcoming, later) || !slices.Contains(upcoming, other) || slices.Contains(upcoming, open) {
		t.Errorf("upcoming: got %v, want %s and %s, not %s", upcoming, later, other, open)
	}
	if !slices.Contains(running, open) || slices.Contains(running, later) {
		t.Errorf("running: got %v, want %s only of ours", running, open)
	}
	all := c.listIDs("")
	if i, j := slices.Index(all, other), slices.Index(all, open); i < 0 || j < 0 || i > j || len(slices.Compact(slices.Clone(all))) != len(all) {
		t.Errorf("all, newest first: got %v, want %s before %s, each once", all, other, open)
	}

	// Before the start everything may change; Redis holds the new values.
	var got adminCampaignBody
	patch := `{"name":"renamed","per_user_limit":3,"payment_window":"2m","start_at":"` + start.Add(time.Minute).Format(time.RFC3339) + `"}`
	if code := c.do("PATCH", "/admin/v1/campaigns/"+later, c.admin, patch, nil, &got); code != http.StatusOK ||
		got.Name != "renamed" || got.PerUserLimit != 3 || got.PaymentWindow != "2m0s" || !got.StartAt.Equal(start.Add(time.Minute)) || got.State != "upcoming" {
		t.Fatalf("patch before the start: got %d %+v", code, got)
	}
	meta, err := rdb.HMGet(ctx, "fs:{"+later+"}:meta", "limit", "start_ms", "epoch").Result()
	if err != nil || meta[0] != "3" || meta[1] != strconv.FormatInt(start.Add(time.Minute).UnixMilli(), 10) || meta[2] != "2" {
		t.Fatalf("Redis meta after the patch: got %v, %v; want limit 3, the new start, epoch 2", meta, err)
	}
	if code := c.do("GET", "/admin/v1/campaigns/"+later, c.admin, nil, nil, &got); code != http.StatusOK || got.PerUserLimit != 3 || !got.Loaded {
		t.Fatalf("get after the patch: got %d %+v", code, got)
	}

	// After the start only the name.
	before := c.stats(open)
	for _, body := range []string{`{"per_user_limit":1}`, `{"end_at":"2031-01-01T00:00:00Z"}`, `{"payment_window":"1m","name":"x"}`} {
		if code := c.do("PATCH", "/admin/v1/campaigns/"+open, c.admin, body, nil, &got); code != http.StatusConflict || got.Code != "sale_started" {
			t.Errorf("patch %s after the start: got %d %q, want 409 sale_started", body, code, got.Code)
		}
	}
	if code := c.do("PATCH", "/admin/v1/campaigns/"+open, c.admin, `{"name":"open, renamed"}`, nil, &got); code != http.StatusOK || got.Name != "open, renamed" || got.PerUserLimit != 2 {
		t.Fatalf("rename after the start: got %d %+v", code, got)
	}
	var pc publicCampaignBody
	if code := c.do("GET", "/api/v1/campaigns/"+open, "", nil, nil, &pc); code != http.StatusOK || pc.Name != "open, renamed" ||
		pc.State != "running" || pc.Remaining == nil || *pc.Remaining != 10 {
		t.Fatalf("public campaign: got %d %+v, want the new name at once, running, 10 left", code, pc)
	}
	if after := c.stats(open); after.Remaining != before.Remaining || after.Admitted != before.Admitted {
		t.Fatalf("refused patches changed the sale: %+v into %+v", before, after)
	}

	// The public list: sales not ended, with state and remaining.
	c.buy("alice", open)
	testenv.Eventually(t, 30*time.Second, "the public list: running with 9 left, upcoming with 5, upcoming not loaded", func() (bool, string) {
		var list struct {
			Campaigns []publicCampaignBody `json:"campaigns"`
		}
		if code := c.do("GET", "/api/v1/campaigns", "", nil, nil, &list); code != http.StatusOK {
			t.Fatalf("public list: got %d", code)
		}
		byID := map[string]publicCampaignBody{}
		for _, p := range list.Campaigns {
			byID[p.ID] = p
		}
		o, l, u := byID[open], byID[later], byID[other]
		return o.State == "running" && o.Remaining != nil && *o.Remaining == 9 && l.State == "upcoming" && l.Remaining != nil && *l.Remaining == 5 &&
			u.State == "upcoming" && u.Remaining == nil, fmt.Sprintf("%+v %+v %+v", o, l, u)
	})

	// Delete: only before the start.
	if code := c.do("DELETE", "/admin/v1/campaigns/"+open, c.admin, nil, nil, &got); code != http.StatusConflict || got.Code != "sale_started" {
		t.Fatalf("delete a started sale: got %d %q, want 409 sale_started", code, got.Code)
	}
	if code := c.do("DELETE", "/admin/v1/campaigns/"+later, c.admin, nil, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: got %d, want 204", code)
	}
	if code := c.do("GET", "/admin/v1/campaigns/"+later, c.admin, nil, nil, nil); code != http.StatusNotFound {
		t.Fatalf("get a deleted campaign: got %d, want 404", code)
	}
	if code := c.do("GET", "/api/v1/campaigns/"+later, "", nil, nil, nil); code != http.StatusNotFound {
		t.Fatalf("public get of a deleted campaign: got %d, want 404 at once", code)
	}
	if keys, err := rdb.Keys(ctx, "fs:{"+later+"}*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("Redis keys of a deleted campaign: got %v, %v", keys, err)
	}
	if st := c.stats(open); st.Sold != 1 || st.OrdersInDB != 1 {
		t.Fatalf("the running sale after the delete: got %+v", st)
	}
}

// TestEndEarlyWithQueued: a sale ended while requests are queued refuses new
// purchases at once (409 ended), and the workers give every queued request
// its final result, rejected ended_early, selling nothing more. The
// requests are admitted with no worker running, which starts after the end.
func TestEndEarlyWithQueued(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	front, err := start(ctx, cfg, log, roleSet{gateway: true, notifier: true})
	if err != nil {
		cancel()
		t.Fatalf("start gateway: %v", err)
	}
	t.Cleanup(func() { cancel(); _ = front.Wait() })
	c := newClient(t, "http://"+front.Addr(), cfg.Auth)
	c.db = cfg.Database
	campaign := testenv.Name(t, "end-")
	c.openCampaign(campaign, 10, 1)
	users := []string{"ann", "ben", "cat"}
	rids := map[string]string{}
	for _, u := range users {
		code, p := c.tryBuy(campaign, u)
		if code != http.StatusAccepted {
			t.Fatalf("purchase by %s: got %d", u, code)
		}
		rids[u] = p
	}
	var got adminCampaignBody
	if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/end", c.admin, nil, nil, &got); code != http.StatusOK ||
		got.State != "ended" || !got.EndedEarly || got.EndAt.After(time.Now()) {
		t.Fatalf("end: got %d %+v, want ended early, now", code, got)
	}
	if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/end", c.admin, nil, nil, &got); code != http.StatusOK || !got.EndedEarly {
		t.Fatalf("end again: got %d %+v, want the same answer", code, got)
	}
	var refusal purchaseBody
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("dan"), `{"quantity":1}`, nil, &refusal); code != http.StatusConflict || refusal.Code != "ended" {
		t.Fatalf("purchase after the end: got %d %q, want 409 ended", code, refusal.Code)
	}
	back, err := start(ctx, cfg, log, roleSet{worker: true})
	if err != nil {
		t.Fatalf("start worker: %v", err)
	}
	t.Cleanup(func() { cancel(); _ = back.Wait() })
	for _, u := range users {
		if r := c.waitFinal(u, rids[u], 30*time.Second); r.Status != "rejected" || r.Reason != "ended_early" {
			t.Errorf("%s's queued request: got %s %q, want rejected ended_early", u, r.Status, r.Reason)
		}
	}
	st := c.settle(campaign, 20*time.Second)
	if st.Sold != 0 || st.Remaining != 10 || st.OrdersInDB != 0 || st.FinishedByStatus["rejected"] != 3 {
		t.Fatalf("stats after the end: got %+v, want nothing sold, three rejected", st)
	}
	checkReconciled(t, cfg.Redis.Addr, cfg.Database, campaign)
}

// TestAdminCommand: `flashsale admin campaigns …` against a running server,
// every command over the same API, refusals exiting non-zero with the
// API's code.
func TestAdminCommand(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	id := testenv.Name(t, "cli-")
	env := map[string]string{adminTokenEnv: testAdminToken}
	admin := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"admin", "campaigns"}, append(args, "--url", c.base)...), &out, env, logTo(io.Discard))
		return out.String(), err
	}
	mustAdmin := func(want string, args ...string) string {
		t.Helper()
		out, err := admin(args...)
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("admin %v: got %v\n%s\nwant %q", args, err, out, want)
		}
		return out
	}
	startAt := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	endAt := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	mustAdmin(`"id": "`+id+`"`, "create", "--id", id, "--name", "CLI sale", "--stock", "4", "--limit", "2", "--start", startAt, "--end", endAt)
	mustAdmin(`"outcome": "loaded"`, "preload", id)
	mustAdmin(id, "list", "--state", "running", "--all")
	mustAdmin(`"name": "CLI renamed"`, "patch", id, "--name", "CLI renamed")
	if out, err := admin("patch", id, "--limit", "1"); err == nil || !strings.Contains(err.Error(), "409 sale_started") {
		t.Fatalf("patch the limit after the start: got %v\n%s\nwant 409 sale_started", err, out)
	}
	mustAdmin(`"paused": true`, "pause", id)
	mustAdmin(`"state": "paused"`, "get", id)
	mustAdmin(`"paused": false`, "resume", id)
	c.buy("alice", id)
	c.settle(id, 20*time.Second)
	mustAdmin(`"sold": 1`, "stats", id)
	mustAdmin(`"ended_early": true`, "end", id)
	if out, err := admin("delete", id); err == nil || !strings.Contains(err.Error(), "409 sale_started") {
		t.Fatalf("delete a started sale: got %v\n%s", err, out)
	}
	if out, err := admin("get", id, "--admin-token", "wrong-token"); err == nil || !strings.Contains(err.Error(), "403 forbidden") {
		t.Fatalf("wrong token: got %v\n%s", err, out)
	}
	if err := run(context.Background(), []string{"admin", "campaigns", "get", id, "--url", c.base}, io.Discard, map[string]string{}, logTo(io.Discard)); err == nil || !strings.Contains(err.Error(), adminTokenEnv) {
		t.Fatalf("no token: got %v, want a refusal naming %s", err, adminTokenEnv)
	}
	future := testenv.Name(t, "cli-up-")
	mustAdmin(`"id": "`+future+`"`, "create", "--id", future, "--name", "later", "--stock", "1", "--start", time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		"--end", time.Now().Add(2*time.Hour).UTC().Format(time.RFC3339))
	mustAdmin("ok", "delete", future)
	if code := c.do("GET", "/admin/v1/campaigns/"+future, c.admin, nil, nil, nil); code != http.StatusNotFound {
		t.Fatalf("after the CLI's delete: got %d, want 404", code)
	}
}

// TestArchiveCommand: `flashsale archive` refuses, removing nothing, while
// the sale runs, while an order is pending payment and while Redis
// disagrees with MySQL; then it removes every key of the campaign and
// keeps MySQL's records.
func TestArchiveCommand(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	campaign := testenv.Name(t, "arch-")
	c.openCampaign(campaign, 5, 1)
	order := c.buy("alice", campaign)
	c.settle(campaign, 20*time.Second)
	env := commandEnv(cfg)
	archive := func() (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), []string{"archive", "--campaign", campaign}, &out, env, logTo(io.Discard))
		return out.String(), err
	}
	rdb := testenv.Redis(t)
	keys := func() []string {
		t.Helper()
		ks, err := rdb.Keys(t.Context(), "fs:{"+campaign+"}*").Result()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(ks)
		return ks
	}
	refused := func(why string) {
		t.Helper()
		before := keys()
		out, err := archive()
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Fatalf("archive: got %v\n%s\nwant a refusal naming %q", err, out, why)
		}
		if after := keys(); !slices.Equal(before, after) || len(after) < 5 {
			t.Fatalf("refused archive changed the keys: %v into %v", before, after)
		}
	}
	refused("the sale ends at")
	if code := c.do("POST", "/admin/v1/campaigns/"+campaign+"/end", c.admin, nil, nil, nil); code != http.StatusOK {
		t.Fatalf("end: got %d", code)
	}
	refused("pending payment")
	if code := c.do("POST", "/api/v1/orders/"+order.ID+"/cancel", c.token("alice"), nil, nil, nil); code != http.StatusOK {
		t.Fatalf("cancel: got %d", code)
	}
	testenv.Eventually(t, 20*time.Second, "the units back after the cancel", func() (bool, string) {
		st := c.stats(campaign)
		return st.Remaining == 5, fmt.Sprintf("%+v", st)
	})
	rdb.HSet(t.Context(), "fs:{"+campaign+"}:users", "mallory", 1)
	refused("disagree")
	rdb.HDel(t.Context(), "fs:{"+campaign+"}:users", "mallory")
	if out, err := archive(); err != nil || !strings.Contains(out, "archived") {
		t.Fatalf("archive: got %v\n%s", err, out)
	}
	if ks := keys(); len(ks) != 0 {
		t.Fatalf("keys after the archive: got %v, want none", ks)
	}
	if got := c.ordersInDB(campaign); len(got) != 1 {
		t.Fatalf("orders after the archive: got %v, want alice's still there", got)
	}
	if out, err := archive(); err != nil {
		t.Fatalf("archive again: got %v\n%s, want nothing to do", err, out)
	}
}
