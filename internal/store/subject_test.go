package store

import (
	"strings"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// providerUsers are user ids as identity providers issue them, and the
// edges of model.CheckUserID: the field separators of the stored formats
// ('|' of the results and idem hashes) among them.
var providerUsers = []string{
	"auth0|5f7c8ec7b4a1d2006b1f0e3a",
	"google-oauth2|1234",
	"google-oauth2|12", // a prefix of the one above
	"Zoë|日本語",
	"a|b|c|d|e|f", // more separators than a stored result has fields
	`"quoted" {tag} \ x`,
	strings.Repeat("é", 127) + "a", // 255 bytes
}

// TestProviderSubjects: every script and stored format carries any user id
// a token may name, whole and apart from every other one: the queued
// marker, the Idempotency-Key, the per-user rate limit and units, the
// final results of deduct, reject and the not-enqueued sweep, and a
// release.
func TestProviderSubjects(t *testing.T) {
	for _, user := range providerUsers {
		if !model.ValidUserID(user) {
			t.Fatalf("test user %q is not a valid user id", user)
		}
	}
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 100, 2)
		mustLoad(t, s, c)
		limits := model.RateLimits{UserRate: 1, UserBurst: 2}
		rids := map[string]string{}
		for _, user := range providerUsers {
			a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: user, Quantity: 2, IdempotencyKey: "k-1"}
			got, err := s.Admit(t.Context(), c.ID, []model.AdmitRequest{a}, limits)
			if err != nil || got[0].Code != model.Admitted {
				t.Fatalf("admit %q: got %+v, %v; want admitted", user, got, err)
			}
			rids[user] = a.RequestID
			if r := mustResult(t, s, a.RequestID); r.UserID != user || r.Status != model.StatusQueued {
				t.Fatalf("queued result of %q: got user %q status %s", user, r.UserID, r.Status)
			}
		}
		for _, user := range providerUsers {
			// The same key names the same request for this user alone; the
			// retry takes the user's second token of burst.
			retry := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: user, Quantity: 2, IdempotencyKey: "k-1"}
			got, err := s.Admit(t.Context(), c.ID, []model.AdmitRequest{retry}, limits)
			if err != nil || got[0].Code != model.AdmitExisting || got[0].RequestID != rids[user] {
				t.Fatalf("retry of %q: got %+v, %v; want existing %s", user, got, err, rids[user])
			}
			if r, ok, err := s.IdempotentRequest(t.Context(), retry); err != nil || !ok || r.RequestID != rids[user] {
				t.Fatalf("IdempotentRequest(%q): got %+v, %v, %v; want %s", user, r, ok, err, rids[user])
			}
			// The burst of 2 is this user's alone and now spent.
			third := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: user, Quantity: 1}
			got, err = s.Admit(t.Context(), c.ID, []model.AdmitRequest{third}, limits)
			if err != nil || got[0].Code != model.AdmitUserRateLimited {
				t.Fatalf("third admit of %q: got %+v, %v; want rate limited", user, got, err)
			}
		}
		var batch []model.Deduction
		for i, user := range providerUsers {
			batch = append(batch, model.Deduction{RequestID: rids[user], UserID: user, Quantity: 2, OrderID: "o" + string(rune('a'+i))})
		}
		// Each user's own limit: a further unit is over it, for that user only.
		extra := model.Deduction{RequestID: newRequestID(c.ID), UserID: providerUsers[0], Quantity: 1, OrderID: "ox"}
		reply := mustDeduct(t, s, c.ID, append(batch, extra))
		for i, r := range reply.Results[:len(batch)] {
			if r.Status != model.StatusSuccess || r.UserID != batch[i].UserID {
				t.Fatalf("deduct of %q: got %+v, want success", batch[i].UserID, r)
			}
			if stored := mustResult(t, s, r.RequestID); stored.UserID != batch[i].UserID || stored.OrderID != batch[i].OrderID {
				t.Fatalf("stored result of %q: got %+v", batch[i].UserID, stored)
			}
			if n := mustUserUnits(t, s, c.ID, batch[i].UserID); n != 2 {
				t.Fatalf("units of %q: got %d, want 2", batch[i].UserID, n)
			}
		}
		if r := reply.Results[len(batch)]; r.Status != model.StatusLimitExceeded {
			t.Fatalf("extra unit of %q: got %s, want limit_exceeded", extra.UserID, r.Status)
		}
		if released, err := s.Release(t.Context(), c.ID, "ob", providerUsers[1], 2); err != nil || !released {
			t.Fatalf("release of %q: got %v, %v", providerUsers[1], released, err)
		}
		if n, m := mustUserUnits(t, s, c.ID, providerUsers[1]), mustUserUnits(t, s, c.ID, providerUsers[2]); n != 0 || m != 2 {
			t.Fatalf("units after the release: %q has %d (want 0), %q has %d (want 2)", providerUsers[1], n, providerUsers[2], m)
		}
		// Reject and the not-enqueued sweep rewrite a stored result and keep
		// its user.
		for _, user := range providerUsers {
			d := model.Deduction{RequestID: newRequestID(c.ID), UserID: user, Quantity: 1}
			if r, err := s.Reject(t.Context(), d, c.ID, model.ReasonPoison); err != nil || r.UserID != user || r.Status != model.StatusRejected {
				t.Fatalf("reject of %q: got %+v, %v", user, r, err)
			}
		}
		var notEnqueued []model.AdmitRequest
		for _, user := range providerUsers {
			a := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: user, Quantity: 1, IdempotencyKey: "k-2"}
			mustAdmit(t, s, a)
			notEnqueued = append(notEnqueued, a)
		}
		passQueue(t, s, c, "closing")
		swept, err := s.SweepNotEnqueued(t.Context(), []string{c.ID}, 0, 0)
		if err != nil || len(swept) != len(notEnqueued) {
			t.Fatalf("SweepNotEnqueued: got %d results, %v; want %d", len(swept), err, len(notEnqueued))
		}
		for _, a := range notEnqueued {
			if r := mustResult(t, s, a.RequestID); r.UserID != a.UserID || r.Reason != model.ReasonNotEnqueued {
				t.Fatalf("swept result of %q: got %+v", a.UserID, r)
			}
		}
	})
}
