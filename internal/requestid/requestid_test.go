package requestid

import (
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/model"
)

var testSecret = []byte("a secret of at least thirty-two bytes")

// flipBit returns id with bit i of its 128-bit tail flipped.
func flipBit(t *testing.T, id string, i int) string {
	t.Helper()
	tag, _ := model.TagOfRequest(id)
	b, err := hex.DecodeString(id[len(tag)+1:])
	if err != nil {
		t.Fatal(err)
	}
	b[i/8] ^= 0x80 >> (i % 8)
	return model.FormatRequestID(tag, hex.EncodeToString(b))
}

func TestIssued(t *testing.T) {
	is := NewIssuer(testSecret)
	id := is.New("spring-sale:3", "alice")
	tail := id[len("spring-sale:3."):]
	unsigned := uuid.Must(uuid.NewV7()) // as the gateway made ids before
	tests := []struct {
		name      string
		issuer    *Issuer
		requestID string
		userID    string
		want      bool
	}{
		{"round trip", is, id, "alice", true},
		{"another issuer, same secret", NewIssuer(testSecret), id, "alice", true},
		{"another user", is, id, "bob", false},
		{"user a prefix", is, id, "alic", false},
		{"another tag", is, model.FormatRequestID("spring-sale:2", tail), "alice", false},
		{"another campaign", is, model.FormatRequestID("spring-sal", tail), "alice", false},
		{"another key", NewIssuer([]byte("another secret of thirty-two bytes")), id, "alice", false},
		{"unsigned", is, model.FormatRequestID("spring-sale:3", hex.EncodeToString(unsigned[:])), "alice", false},
		{"upper-case tail", is, strings.ToUpper(id), "alice", false},
		{"short tail", is, id[:len(id)-1], "alice", false},
		{"no tag", is, tail, "alice", false},
		{"empty", is, "", "alice", false},
		{"not hex", is, "spring-sale:3." + strings.Repeat("g", 32), "alice", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.issuer.Issued(tt.requestID, tt.userID); got != tt.want {
				t.Fatalf("Issued(%q, %q): got %v, want %v", tt.requestID, tt.userID, got, tt.want)
			}
		})
	}
	for i := range 128 {
		if forged := flipBit(t, id, i); is.Issued(forged, "alice") {
			t.Errorf("bit %d flipped: Issued(%s) got true, want false", i, forged)
		}
	}
}

// TestNewIsUUIDv7: an id's tail is a UUIDv7 of now, one issuer's ids
// increase, and their order ids keep the admission's time bits.
func TestNewIsUUIDv7(t *testing.T) {
	is := NewIssuer(testSecret)
	before := time.Now().Truncate(time.Millisecond)
	var prev string
	for range 1000 {
		id := is.New("c", "alice")
		u, err := uuid.Parse(strings.TrimPrefix(id, "c."))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("%s: got version %d variant %v, want 7 %v", id, u.Version(), u.Variant(), uuid.RFC4122)
		}
		if at, ok := model.AdmittedAt(id); !ok || at.Before(before) || at.After(time.Now()) {
			t.Fatalf("AdmittedAt(%s): got %v, %v; want between %v and now", id, at, ok, before)
		}
		if id <= prev {
			t.Fatalf("ids out of order: %s after %s", id, prev)
		}
		// The 60 time bits: all but the version digit of the first 16.
		order, tail := strings.ReplaceAll(model.OrderIDOf(id), "-", ""), id[len("c."):]
		if got, want := order[:12]+order[13:16], tail[:12]+tail[13:16]; got != want {
			t.Fatalf("OrderIDOf(%s): got time bits %s, want %s", id, got, want)
		}
		prev = id
	}
}

// TestSignKeepsHead: Sign replaces the last 6 bytes of the UUID alone,
// and what it returns is issued.
func TestSignKeepsHead(t *testing.T) {
	is := NewIssuer(testSecret)
	u := uuid.Must(uuid.NewV7())
	id := is.Sign("c", "alice", u)
	if got, want := id[:len("c.")+2*headLen], "c."+hex.EncodeToString(u[:headLen]); got != want {
		t.Fatalf("Sign: got head %s, want %s", got, want)
	}
	if !is.Issued(id, "alice") {
		t.Fatalf("Issued(%s, alice): got false, want true", id)
	}
	if again := is.Sign("c", "alice", u); again != id {
		t.Fatalf("Sign again: got %s, want %s", again, id)
	}
}

// TestIssuedConcurrently: the pooled HMACs are shared safely (run with
// -race).
func TestIssuedConcurrently(t *testing.T) {
	is := NewIssuer(testSecret)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			user := strings.Repeat("u", g+1)
			for range 200 {
				id := is.New("c", user)
				if !is.Issued(id, user) || is.Issued(id, user+"x") {
					t.Errorf("%s: not recognised as %s's alone", id, user)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkNew(b *testing.B) {
	is := NewIssuer(testSecret)
	b.ReportAllocs()
	for b.Loop() {
		is.New("spring-sale:3", "auth0|5f7c8ec7b4a1d2006b1f0e3a")
	}
}

func BenchmarkIssued(b *testing.B) {
	is := NewIssuer(testSecret)
	id := is.New("spring-sale:3", "auth0|5f7c8ec7b4a1d2006b1f0e3a")
	b.ReportAllocs()
	for b.Loop() {
		is.Issued(id, "auth0|5f7c8ec7b4a1d2006b1f0e3a")
	}
}
