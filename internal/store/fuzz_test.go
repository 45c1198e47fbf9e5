package store

import (
	"strings"
	"testing"

	"github.com/flashsale/flashsale/model"
)

// FuzzDecodeStored: the stored-result parser never panics, and whatever it
// accepts has a known status and survives a round trip.
func FuzzDecodeStored(f *testing.F) {
	for _, s := range []string{"success|1|o1||alice", "queued|2|||bob", "rejected|1||not_loaded|u|x", "||||", "success|x|||u", "|"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r, err := decodeStored("c."+strings.Repeat("0", 32), "c", v)
		if err != nil {
			return
		}
		if !r.Status.Valid() {
			t.Fatalf("accepted unknown status %q", r.Status)
		}
		if strings.ContainsRune(r.OrderID, '|') || strings.ContainsRune(r.Reason, '|') {
			return // not produced by the scripts; the round trip cannot hold
		}
		again, err := decodeStored(r.RequestID, r.CampaignID, storedOf(r).String())
		if err != nil || again != r {
			t.Fatalf("round trip of %q: got %+v (%v), want %+v", v, again, err, r)
		}
	})
}

// FuzzParseDeductReply: the Lua reply parser never panics on any reply shape
// and accepts only final statuses, one per request.
func FuzzParseDeductReply(f *testing.F) {
	f.Add(int64(0), "success", "o1", "", uint8(1))
	f.Add(int64(1), "sold_out", "", "", uint8(2))
	f.Add(int64(0), "queued", "", "", uint8(1))
	f.Add(int64(7), "", "", "", uint8(0))
	f.Fuzz(func(t *testing.T, flag int64, status, order, reason string, n uint8) {
		batch := make([]model.Deduction, int(n%8))
		reply := []any{flag, int64(n)}
		for i := range batch {
			batch[i] = model.Deduction{RequestID: "r", UserID: "u", Quantity: 1}
			reply = append(reply, status, order, reason)
		}
		// Also try a reply one element short.
		for _, rep := range [][]any{reply, reply[:len(reply)-1]} {
			out, _, err := parseDeductReply("c", batch, rep)
			if err != nil {
				continue
			}
			if len(out.Results) != len(batch) {
				t.Fatalf("got %d results for %d requests", len(out.Results), len(batch))
			}
			for _, r := range out.Results {
				if !r.Status.Final() || r.Status == model.StatusQueued {
					t.Fatalf("accepted non-final status %q", r.Status)
				}
			}
		}
	})
}
