package store

import (
	"testing"

	"github.com/flashsale/flashsale/model"
)

// TestQueueProgress admits a line in two batches, with refusals among them,
// decides it out of order and again, and checks the sequence numbers, the
// watermark (only ever up) and each request's ahead count (never up, never
// below zero).
func TestQueueProgress(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 100, 100)
		mustLoad(t, s, c)
		var line []model.AdmitRequest
		for i := range 6 {
			line = append(line, model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID,
				UserID: "u" + string(rune('a'+i)), Quantity: 1})
		}
		// The second batch repeats line[1] (a retry) and has one request of
		// a user over the rate limit: neither takes a number.
		limits := model.RateLimits{UserRate: 1, UserBurst: 1}
		over := model.AdmitRequest{RequestID: newRequestID(c.ID), CampaignID: c.ID, UserID: "ua", Quantity: 1}
		if _, err := s.Admit(t.Context(), c.ID, line[:3], limits); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Admit(t.Context(), c.ID, append([]model.AdmitRequest{line[1], over}, line[3:]...), limits); err != nil {
			t.Fatal(err)
		}
		for i, a := range line {
			if got := mustResult(t, s, a.RequestID).Seq; got != int64(i+1) {
				t.Errorf("line[%d]: got sequence number %d, want %d", i, got, i+1)
			}
		}
		mustNoResult(t, s, over.RequestID)

		if p := mustProgress(t, s, c.ID); p != (model.QueueProgress{}) {
			t.Errorf("before any decision: got %+v, want zero", p)
		}
		last := make([]int64, len(line))
		for i := range line {
			last[i] = int64(i)
		}
		check := func(step string, wantDecided int64) {
			t.Helper()
			p := mustProgress(t, s, c.ID)
			if p.Decided != wantDecided {
				t.Errorf("%s: got decided %d, want %d", step, p.Decided, wantDecided)
			}
			if wantDecided > 0 && p.Rate <= 0 {
				t.Errorf("%s: got rate %v, want > 0", step, p.Rate)
			}
			for i := range line {
				ahead := p.Ahead(int64(i + 1))
				if ahead < 0 || ahead > last[i] {
					t.Errorf("%s: line[%d]: got ahead %d, want 0..%d", step, i, ahead, last[i])
				}
				last[i] = ahead
			}
		}
		deduct := func(reqs ...model.AdmitRequest) {
			t.Helper()
			var batch []model.Deduction
			for _, a := range reqs {
				batch = append(batch, model.Deduction{RequestID: a.RequestID, UserID: a.UserID, Quantity: a.Quantity, OrderID: "o" + a.RequestID})
			}
			mustDeduct(t, s, c.ID, batch)
		}
		deduct(line[0], line[1])
		check("first two decided", 2)
		// Another gateway's later batch is decided first.
		deduct(line[4])
		check("line[4] decided out of turn", 5)
		deduct(line[2], line[3])
		check("the overtaken batch decided", 5)
		deduct(line[0], line[1]) // redelivered
		check("redelivery", 5)
		deduct(line[5])
		check("all decided", 6)
	})
}

func mustProgress(t *testing.T, s *Store, campaignID string) model.QueueProgress {
	t.Helper()
	p, err := s.Progress(t.Context(), []string{campaignID})
	if err != nil {
		t.Fatalf("Progress(%s): %v", campaignID, err)
	}
	return p[0]
}
