package challenge

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/model"
)

var (
	testSecret   = []byte("challenge-test-secret-of-32-bytes!!")
	testCampaign = model.Campaign{ID: "spring", ChallengeBits: 12}
)

func mustIssue(t testing.TB, p *PoW, user string, c model.Campaign) model.Challenge {
	t.Helper()
	ch, err := p.Challenge(user, c)
	if err != nil {
		t.Fatalf("challenge: %v", err)
	}
	return ch
}

// goSolve is Solve for a test: the campaigns here ask for at most 20 bits.
func goSolve(token string, bits int) string {
	s, err := Solve(context.Background(), token, bits)
	if err != nil {
		panic(err)
	}
	return s
}

// TestPowJSSolves runs web/pow.js under node on a challenge issued here and
// checks its answer with Verify: the browser and the gateway apply the same
// rule. Without node the test skips, except under CI=true.
func TestPowJSSolves(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node not found (needed to test web/pow.js): %v", err)
		}
		t.Skip("node not found; install it to test web/pow.js")
	}
	powJS, err := filepath.Abs(filepath.Join("..", "..", "web", "pow.js"))
	if err != nil {
		t.Fatal(err)
	}
	p := NewPoW(testSecret, time.Minute, nil)
	ch := mustIssue(t, p, "alice", testCampaign)
	script := `const { solve } = await import(process.argv[1]); process.stdout.write(await solve(process.argv[2], Number(process.argv[3])));`
	out, err := exec.CommandContext(t.Context(), node, "--input-type=module", "-e", script, "file://"+powJS, ch.Token, strconv.Itoa(ch.Bits)).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v: %s", err, out)
	}
	nonce := strings.TrimSpace(string(out))
	if _, err := p.Verify(ch.Token+"."+nonce, "alice", testCampaign); err != nil {
		t.Fatalf("pow.js nonce %q: got %v, want valid", nonce, err)
	}
}

func TestVerify(t *testing.T) {
	now := time.Now()
	p := NewPoW(testSecret, time.Minute, func() time.Time { return now })
	ch := mustIssue(t, p, "alice", testCampaign)
	good := goSolve(ch.Token, ch.Bits)
	pass, err := p.Verify(good, "alice", testCampaign)
	if err != nil || pass.ID == "" || !pass.ExpiresAt.Equal(ch.ExpiresAt) {
		t.Fatalf("valid: got %+v, %v; want a pass expiring %v", pass, err, ch.ExpiresAt)
	}
	if other := mustIssue(t, p, "alice", testCampaign); other.Token == ch.Token {
		t.Fatalf("two challenges alike: %s", ch.Token)
	}
	harder := testCampaign
	harder.ChallengeBits = 20
	otherKey := NewPoW([]byte("another-secret-of-at-least-32-bytes"), time.Minute, func() time.Time { return now })
	later := NewPoW(testSecret, time.Minute, func() time.Time { return now.Add(2 * time.Minute) })
	cases := []struct {
		name     string
		p        *PoW
		solution string
		user     string
		c        model.Campaign
	}{
		{"wrong user", p, good, "bob", testCampaign},
		{"wrong campaign", p, good, "alice", model.Campaign{ID: "autumn", ChallengeBits: 12}},
		{"expired", later, good, "alice", testCampaign},
		{"other key", otherKey, good, "alice", testCampaign},
		{"campaign made harder", p, good, "alice", harder},
		{"no nonce", p, ch.Token, "alice", testCampaign},
		{"empty nonce", p, ch.Token + ".", "alice", testCampaign},
		{"nonce too long", p, ch.Token + "." + strings.Repeat("a", MaxNonce+1), "alice", testCampaign},
		{"bits lowered", p, "0" + good[strings.IndexByte(good, '.'):], "alice", testCampaign},
		{"empty", p, "", "alice", testCampaign},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.p.Verify(tc.solution, tc.user, tc.c); !errors.Is(err, model.ErrChallengeFailed) {
				t.Fatalf("got %v, want %v", err, model.ErrChallengeFailed)
			}
		})
	}
	t.Run("too little work", func(t *testing.T) {
		for n := 0; ; n++ {
			s := ch.Token + "." + strconv.Itoa(n)
			if sum := sha256.Sum256([]byte(s)); LeadingZeroBits(sum[:]) < ch.Bits {
				if _, err := p.Verify(s, "alice", testCampaign); !errors.Is(err, model.ErrChallengeFailed) {
					t.Fatalf("got %v, want %v", err, model.ErrChallengeFailed)
				}
				return
			}
		}
	})
}

// TestSolve: Solve's answers pass Verify at every difficulty a load test
// uses, with a nonce of the shape Verify takes, and a search the context
// ends stops with its error.
func TestSolve(t *testing.T) {
	now := time.Now()
	p := NewPoW(testSecret, time.Minute, func() time.Time { return now })
	for _, bits := range []int{0, 1, 4, 12} {
		t.Run(strconv.Itoa(bits), func(t *testing.T) {
			c := model.Campaign{ID: "spring", ChallengeBits: bits}
			ch := mustIssue(t, p, "alice", c)
			sol, err := Solve(t.Context(), ch.Token, ch.Bits)
			if err != nil {
				t.Fatalf("Solve: %v", err)
			}
			if !strings.HasPrefix(sol, ch.Token+".") {
				t.Fatalf("got %q, want the token, \".\" and a nonce", sol)
			}
			if _, err := p.Verify(sol, "alice", c); err != nil {
				t.Fatalf("Verify(Solve): got %v, want valid", err)
			}
		})
	}
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		ch := mustIssue(t, p, "alice", model.Campaign{ID: "spring", ChallengeBits: model.MaxChallengeBits})
		if _, err := Solve(ctx, ch.Token, ch.Bits); !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want %v", err, context.Canceled)
		}
	})
	t.Run("too hard", func(t *testing.T) {
		if _, err := Solve(t.Context(), "x", model.MaxChallengeBits+1); err == nil {
			t.Fatal("got nil, want an error")
		}
	})
}

func TestLeadingZeroBits(t *testing.T) {
	tests := []struct {
		b    []byte
		want int
	}{{[]byte{0x80}, 0}, {[]byte{0x01}, 7}, {[]byte{0, 0x10}, 11}, {[]byte{0, 0}, 16}}
	for _, tc := range tests {
		if got := LeadingZeroBits(tc.b); got != tc.want {
			t.Errorf("LeadingZeroBits(%x): got %d, want %d", tc.b, got, tc.want)
		}
	}
}

// BenchmarkVerify is the gate's cost on a gated purchase's accept path:
// parse, one HMAC, one SHA-256.
func BenchmarkVerify(b *testing.B) {
	p := NewPoW(testSecret, time.Hour, nil)
	ch := mustIssue(b, p, "user-123456", testCampaign)
	sol := goSolve(ch.Token, ch.Bits)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Verify(sol, "user-123456", testCampaign); err != nil {
			b.Fatal(err)
		}
	}
}
