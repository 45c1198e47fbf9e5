package gateway

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/challenge"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
)

var testGateSecret = []byte("challenge-test-secret-of-32-bytes!!")

// newGatedService returns a Service whose open, preloaded campaign asks for
// bits of proof of work, under limits.
func newGatedService(t *testing.T, bits int, limits model.RateLimits) (*Service, *store.Store, model.Campaign) {
	t.Helper()
	return newGatedServiceOn(t, bits, limits, newGatePublisher(false), Options{})
}

// newGatedServiceOn is newGatedService publishing to pub, with opts's
// admit settings.
func newGatedServiceOn(t *testing.T, bits int, limits model.RateLimits, pub queue.Publisher, opts Options) (*Service, *store.Store, model.Campaign) {
	t.Helper()
	st := store.New(testenv.Redis(t))
	campaigns := &memCampaigns{c: model.Campaign{ID: testenv.Name(t, "gate"), Name: "t", Stock: 100, PerUserLimit: 2,
		ChallengeBits: bits, StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}}
	c := mustLoad(t, campaigns, st)
	opts.Topic, opts.CampaignCacheTTL, opts.RateLimits = testenv.Topic(t), time.Hour, limits
	opts.Gate = challenge.NewPoW(testGateSecret, 0, nil)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return New(log, st, campaigns, pub, metrics.New(), opts), st, c
}

// solve finds a nonce for token the slow way, as a browser does; tooFew
// instead returns a solution with fewer than bits leading zero bits.
func solve(token string, bits int, tooFew bool) string {
	for n := 0; ; n++ {
		s := token + "." + strconv.Itoa(n)
		sum := sha256.Sum256([]byte(s))
		if z := challenge.LeadingZeroBits(sum[:]); z >= bits != tooFew {
			return s
		}
	}
}

func mustChallenge(t *testing.T, g Gate, user string, c model.Campaign) model.Challenge {
	t.Helper()
	ch, err := g.Challenge(user, c)
	if err != nil {
		t.Fatalf("challenge: %v", err)
	}
	return ch
}

func TestPurchaseChallenge(t *testing.T) {
	const bits = 8
	// A per-user burst of one: any budget a refusal spent would show on
	// the user's next purchase.
	svc, st, c := newGatedService(t, bits, model.RateLimits{UserRate: 1, UserBurst: 1})
	gate := svc.opts.Gate
	other := c
	other.ID = c.ID + "x"
	expiredGate := challenge.NewPoW(testGateSecret, time.Second, func() time.Time { return time.Now().Add(-time.Minute) })
	easy := c
	easy.ChallengeBits = bits - 4
	spent := solve(mustChallenge(t, gate, "spender", c).Token, bits, false)
	if _, err := svc.Purchase(t.Context(), Purchase{UserID: "spender", CampaignID: c.ID, Quantity: 1, Challenge: spent}, nil); err != nil {
		t.Fatalf("first use of a solution: %v", err)
	}
	tampered := solve(mustChallenge(t, gate, "u", c).Token, bits, false)
	cut := len(tampered) - len("0") - 3 // a character of the MAC
	if tampered[cut] == 'A' {
		tampered = tampered[:cut] + "B" + tampered[cut+1:]
	} else {
		tampered = tampered[:cut] + "A" + tampered[cut+1:]
	}
	cases := []struct {
		name     string
		solution func(user string) string
	}{
		{"missing", func(string) string { return "" }},
		{"garbage", func(string) string { return "not.a.challenge" }},
		{"wrong user", func(string) string { return solve(mustChallenge(t, gate, "someone-else", c).Token, bits, false) }},
		{"wrong campaign", func(u string) string { return solve(mustChallenge(t, gate, u, other).Token, bits, false) }},
		{"expired", func(u string) string { return solve(mustChallenge(t, expiredGate, u, c).Token, bits, false) }},
		{"too few bits", func(u string) string { return solve(mustChallenge(t, gate, u, c).Token, bits, true) }},
		{"issued easier", func(u string) string { return solve(mustChallenge(t, gate, u, easy).Token, bits-4, false) }},
		{"tampered HMAC", func(string) string { return tampered }},
		// Refused by Verify (another user's); a solution reused by its own
		// user is refused by admit.lua: TestPurchaseChallengeReplay.
		{"another user's spent solution", func(string) string { return spent }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			user := "u" + strconv.Itoa(i)
			if tc.name == "tampered HMAC" {
				user = "u"
			}
			before := mustStats(t, st, c.ID)
			_, err := svc.Purchase(t.Context(), Purchase{UserID: user, CampaignID: c.ID, Quantity: 1, Challenge: tc.solution(user)}, nil)
			if !errors.Is(err, model.ErrChallengeFailed) {
				t.Fatalf("got %v, want %v", err, model.ErrChallengeFailed)
			}
			if after := mustStats(t, st, c.ID); after.Admitted != before.Admitted || after.Remaining != before.Remaining {
				t.Fatalf("stats: got %+v, want %+v", after, before)
			}
			// The refusal spent none of the user's burst of one.
			good := solve(mustChallenge(t, gate, user, c).Token, bits, false)
			if _, err := svc.Purchase(t.Context(), Purchase{UserID: user, CampaignID: c.ID, Quantity: 1, Challenge: good}, nil); err != nil {
				t.Fatalf("valid purchase after the refusal: got %v, want admitted", err)
			}
		})
	}
}

func TestPurchaseChallengeReplay(t *testing.T) {
	svc, st, c := newGatedService(t, 4, model.RateLimits{})
	sol := solve(mustChallenge(t, svc.opts.Gate, "u1", c).Token, 4, false)
	p := Purchase{UserID: "u1", CampaignID: c.ID, Quantity: 1, IdempotencyKey: "k1", Challenge: sol}
	first, err := svc.Purchase(t.Context(), p, nil)
	if err != nil || first.Existing {
		t.Fatalf("first: got %+v, %v; want a new request", first, err)
	}
	again, err := svc.Purchase(t.Context(), p, nil)
	if err != nil || !again.Existing || again.RequestID != first.RequestID {
		t.Fatalf("replay: got %+v, %v; want request %s back", again, err, first.RequestID)
	}
	p.IdempotencyKey = "k2"
	if _, err := svc.Purchase(t.Context(), p, nil); !errors.Is(err, model.ErrChallengeFailed) {
		t.Fatalf("same solution, new key: got %v, want %v", err, model.ErrChallengeFailed)
	}
	// The refusal kept nothing of k2: with a fresh solution it is new.
	if s := mustStats(t, st, c.ID); s.Admitted != 1 {
		t.Fatalf("admitted after the refusal: got %d, want 1", s.Admitted)
	}
	p.Challenge = solve(mustChallenge(t, svc.opts.Gate, "u1", c).Token, 4, false)
	if adm, err := svc.Purchase(t.Context(), p, nil); err != nil || adm.Existing {
		t.Fatalf("new key, fresh solution: got %+v, %v; want a new request", adm, err)
	}
}

// TestPurchaseChallengeSameBatch: purchases carrying one solution can
// share an admit.lua call now that it spends the challenge; the first
// admits, another purchase is refused, a repeat of the same keyed purchase
// gets its request.
func TestPurchaseChallengeSameBatch(t *testing.T) {
	const bits = 4
	pub := newGatePublisher(true)
	svc, st, c := newGatedServiceOn(t, bits, model.RateLimits{}, pub, Options{AdmitConcurrency: 1})
	sol := func(user string) string { return solve(mustChallenge(t, svc.opts.Gate, user, c).Token, bits, false) }
	one, keyed := sol("u1"), sol("u2")
	buy := func(user, key, solution string) Purchase {
		return Purchase{UserID: user, CampaignID: c.ID, Quantity: 1, IdempotencyKey: key, Challenge: solution}
	}
	ps := []Purchase{buy("u1", "", one), buy("u1", "", one), buy("u2", "k", keyed), buy("u2", "k", keyed)}
	out := purchaseBehindGate(t, svc, pub, buy("u0", "", sol("u0")), ps)

	if got := pub.sizes(); len(got) != 2 || got[1] != 2 {
		t.Fatalf("publish sizes: got %v, want [1 2] (u1's and u2's new requests in one publish)", got)
	}
	// The batch is decided in arrival order, which is not the order above.
	var admitted, spent int
	for _, o := range out[:2] {
		switch {
		case o.err == nil && !o.adm.Existing:
			admitted++
		case errors.Is(o.err, model.ErrChallengeFailed):
			spent++
		default:
			t.Errorf("u1: got %+v, %v; want admitted or %v", o.adm, o.err, model.ErrChallengeFailed)
		}
	}
	if admitted != 1 || spent != 1 {
		t.Errorf("u1's two purchases of one solution: got %d admitted, %d refused; want 1, 1", admitted, spent)
	}
	a, b := out[2], out[3]
	if a.err != nil || b.err != nil || a.adm.RequestID != b.adm.RequestID || a.adm.Existing == b.adm.Existing {
		t.Errorf("u2's keyed purchase twice: got %+v, %v and %+v, %v; want one request, new then existing", a.adm, a.err, b.adm, b.err)
	}
	if s := mustStats(t, st, c.ID); s.Admitted != 3 {
		t.Errorf("admitted: got %d, want 3 (u0's, u1's and u2's)", s.Admitted)
	}
}

// TestPurchaseChallengeRateLimited: a purchase the rate limit refuses
// leaves its challenge to a retry.
func TestPurchaseChallengeRateLimited(t *testing.T) {
	const bits = 4
	svc, _, c := newGatedService(t, bits, model.RateLimits{UserRate: 1, UserBurst: 1})
	sol := func() string { return solve(mustChallenge(t, svc.opts.Gate, "u1", c).Token, bits, false) }
	if _, err := svc.Purchase(t.Context(), Purchase{UserID: "u1", CampaignID: c.ID, Quantity: 1, Challenge: sol()}, nil); err != nil {
		t.Fatalf("first purchase: %v", err)
	}
	p := Purchase{UserID: "u1", CampaignID: c.ID, Quantity: 1, Challenge: sol()}
	var rl *model.RateLimitError
	if _, err := svc.Purchase(t.Context(), p, nil); !errors.As(err, &rl) {
		t.Fatalf("second purchase at once: got %v, want rate limited", err)
	}
	// The burst of one comes back within a second; wait for it generously.
	testenv.Eventually(t, 30*time.Second, "the retry with the same solution admitted", func() (bool, string) {
		_, err := svc.Purchase(t.Context(), p, nil)
		if err != nil && !errors.As(err, &rl) {
			t.Fatalf("retry with the same solution: got %v, want admitted", err)
		}
		return err == nil, fmt.Sprintf("got %v", err)
	})
}

func TestPurchaseUngatedIgnoresChallenge(t *testing.T) {
	svc, _, c := newGatedService(t, 0, model.RateLimits{})
	for i, sol := range []string{"", "junk"} {
		if _, err := svc.Purchase(t.Context(), Purchase{UserID: "u" + strconv.Itoa(i), CampaignID: c.ID, Quantity: 1, Challenge: sol}, nil); err != nil {
			t.Fatalf("challenge %q: got %v, want admitted", sol, err)
		}
	}
}

func TestChallengeWindow(t *testing.T) {
	svc, _, c := newGatedService(t, 4, model.RateLimits{})
	ch, err := svc.Challenge(t.Context(), "u", c.ID)
	if err != nil || ch.Bits != 4 || !ch.ExpiresAt.After(time.Now()) {
		t.Fatalf("open sale: got %+v, %v", ch, err)
	}
	if _, err := svc.Challenge(t.Context(), "u", c.ID+"-none"); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("unknown campaign: got %v, want %v", err, model.ErrNotFound)
	}
	svc.opts.Now = func() time.Time { return c.StartAt.Add(-time.Second) }
	if _, err := svc.Challenge(t.Context(), "u", c.ID); !errors.Is(err, model.ErrNotStarted) {
		t.Fatalf("before the start: got %v, want %v", err, model.ErrNotStarted)
	}
}

func mustStats(t *testing.T, st *store.Store, campaignID string) model.Stats {
	t.Helper()
	s, err := st.Stats(t.Context(), campaignID)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	return s
}
