package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// TestCampaignsOnEveryMaster: the calls that take several campaigns at once
// (Withdraw, SweepNotEnqueued, Results, Progress, Remaining), and
// a challenge spent by Admit, work when the campaigns live on different masters of the cluster: each key of
// a command stays within its campaign's slot, and a pipeline is split by
// slot. The other tests cover each script on the cluster one campaign at a
// time (the "cluster" backend).
func TestCampaignsOnEveryMaster(t *testing.T) {
	rdb := testenv.RedisCluster(t)
	s := New(rdb)
	ctx := t.Context()
	var n atomic.Int64
	if err := rdb.ForEachMaster(ctx, func(context.Context, *redis.Client) error { n.Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	// Campaigns until every master holds some: their names are random.
	masters := map[string]bool{}
	var campaigns []model.Campaign
	for len(campaigns) < 100 && (len(masters) < int(n.Load()) || len(campaigns) < 6) {
		c := newCampaign(t, 10, 1)
		m, err := rdb.MasterForKey(ctx, campaignKeys(c.ID).meta)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
		campaigns = append(campaigns, c)
	}
	if len(masters) != int(n.Load()) {
		t.Fatalf("%d campaigns landed on %d masters, want %d", len(campaigns), len(masters), n.Load())
	}
	var ids []string
	var withdrawn, notEnqueued []model.AdmitRequest
	var kept []model.Deduction
	for _, c := range campaigns {
		mustLoad(t, s, c)
		ids = append(ids, c.ID)
		for _, user := range []string{"kept", "withdrawn", "notenqueued"} {
			a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: user, Quantity: 1}
			mustAdmit(t, s, a)
			switch user {
			case "kept":
				kept = append(kept, model.Deduction{RequestID: a.RequestID, UserID: user, Quantity: 1, OrderID: "o-" + a.RequestID})
			case "withdrawn":
				withdrawn = append(withdrawn, a)
			default:
				notEnqueued = append(notEnqueued, a)
			}
		}
	}
	// A challenge admits once, on its campaign's master (admit.lua spends it).
	for _, c := range campaigns {
		pass := model.ChallengePass{ID: "ch1", ExpiresAt: time.Now().Add(time.Minute)}
		for i, want := range []model.AdmitCode{model.Admitted, model.AdmitChallengeSpent} {
			a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: fmt.Sprintf("holder%d", i), Quantity: 1, Challenge: pass}
			got, err := s.Admit(ctx, c.ID, []model.AdmitRequest{a}, model.RateLimits{})
			if err != nil || got[0].Code != want {
				t.Fatalf("Admit %s with challenge #%d: got %+v, %v; want code %d", c.ID, i+1, got, err, want)
			}
		}
	}
	mustWithdraw(t, s, withdrawn...)
	for i, c := range campaigns {
		if r := mustDeduct(t, s, c.ID, kept[i:i+1]); r.Results[0].Status != model.StatusSuccess {
			t.Fatalf("Deduct %s: got %s, want success", c.ID, r.Results[0].Status)
		}
		passQueue(t, s, c, "closing")
	}
	// Never published: the "notenqueued" request and the challenge's holder.
	swept := mustSweepNotEnqueued(t, s, 0, 0, ids...)
	if len(swept) != 2*len(campaigns) {
		t.Fatalf("SweepNotEnqueued: got %d results, want %d (two per campaign)", len(swept), 2*len(campaigns))
	}

	var rids []string
	for i := range campaigns {
		rids = append(rids, kept[i].RequestID, withdrawn[i].RequestID, notEnqueued[i].RequestID)
	}
	results, err := s.Results(ctx, rids)
	if err != nil {
		t.Fatalf("Results: %v", err)
	}
	for i, r := range results {
		want := []model.Status{model.StatusSuccess, "", model.StatusRejected}[i%3]
		if r.Status != want {
			t.Errorf("Results[%d] (%s): got %q, want %q", i, rids[i], r.Status, want)
		}
	}
	progress, err := s.Progress(ctx, ids)
	if err != nil {
		t.Fatalf("Progress: %v", err)
	}
	remaining, err := s.Remaining(ctx, ids)
	if err != nil {
		t.Fatalf("Remaining: %v", err)
	}
	for i, id := range ids {
		if progress[i].Decided < 1 {
			t.Errorf("Progress %s: got decided %d, want >= 1", id, progress[i].Decided)
		}
		if remaining[id] != 8 {
			t.Errorf("Remaining %s: got %d, want 8", id, remaining[id])
		}
	}
}
