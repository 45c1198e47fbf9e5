package store

import (
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// TestScriptNames names every script by the hash go-redis calls it by.
func TestScriptNames(t *testing.T) {
	s := New(nil)
	names := ScriptNames()
	scripts := map[string]interface{ Hash() string }{
		"deduct": s.deduct, "admit": s.admit, "withdraw": s.withdraw, "rebuild": s.rebuild,
		"paused": s.paused, "reject": s.reject, "release": s.release, "notenqueued": s.notEnqueued,
		"endearly": s.endEarly, "remove": s.remove, "take": s.take, "give": s.give,
		"settle": s.settle, "soldout": s.soldOut, "restore": s.restore, "durable": s.durable,
		"lost": s.lost,
	}
	for want, script := range scripts {
		if got := names[script.Hash()]; got != want {
			t.Errorf("script %s: got name %q", want, got)
		}
	}
	if got, want := slices.Sorted(maps.Values(names)), slices.Sorted(maps.Keys(scripts)); !slices.Equal(got, want) {
		t.Errorf("ScriptNames names %v, the Store runs %v", got, want)
	}
}

// TestScriptsLoad: Redis compiles every script as the store sends it (the
// prelude and layout before the file: a syntax error, or more than Lua's
// 200 locals in a chunk, would fail here), under the SHA1 the store calls it by.
func TestScriptsLoad(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, name := range scriptList() {
			sc := script(name)
			sha, err := sc.Load(t.Context(), s.rdb).Result()
			if err != nil {
				t.Errorf("load %s: %v", name, err)
				continue
			}
			if sha != sc.Hash() {
				t.Errorf("load %s: SHA1 %s, the store calls it %s", name, sha, sc.Hash())
			}
		}
	})
}

// localsOf returns the names a Lua source declares as locals (local x, y;
// local function f), not the fields or parameters; with top, only those of
// the chunk itself (declared at the start of a line).
func localsOf(src string, top bool) []string {
	pattern := `(?m)\blocal\s+`
	if top {
		pattern = `(?m)^local\s+`
	}
	var out []string
	for _, m := range regexp.MustCompile(pattern+`(?:function\s+)?([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)`).FindAllStringSubmatch(src, -1) {
		for name := range strings.SplitSeq(m[1], ",") {
			out = append(out, strings.TrimSpace(name))
		}
	}
	return out
}

// TestPreludeNames: no script declares a local of a name the prelude or
// its layout defines, which would hide the shared one from the rest of it,
// and each paragraph of the prelude defines one helper, as helpersFor
// takes them.
func TestPreludeNames(t *testing.T) {
	prelude, err := scriptFiles.ReadFile(preludeFile)
	if err != nil {
		t.Fatal(err)
	}
	shared := localsOf(string(prelude), true)
	if len(shared) < 5 {
		t.Fatalf("prelude defines %v: the pattern reads no locals", shared)
	}
	// A script gets the paragraphs whose helper it calls (helpersFor).
	for part := range strings.SplitSeq(string(prelude), "\n\n") {
		if defs := localsOf(part, true); len(defs) > 1 {
			t.Errorf("a prelude paragraph defines %v: one helper each", defs)
		}
	}
	for _, name := range scriptList() {
		src, err := scriptFiles.ReadFile(name + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		names := slices.Clone(shared)
		for _, l := range layouts[name] {
			names = append(names, l.name)
		}
		for _, local := range localsOf(string(src), false) {
			if slices.Contains(names, local) {
				t.Errorf("%s.lua declares local %s, which the prelude or its layout defines", name, local)
			}
		}
	}
}

// storedCases are stored results as the results hash keeps them today: a
// running sale's keys must read the same after any change of the codec.
var storedCases = []struct {
	value string
	v     storedResult
}{
	{"success|2|o1||u1", storedResult{Status: model.StatusSuccess, Quantity: 2, OrderID: "o1", UserID: "u1"}}, // durable by definition
	{"success|1|o2|7|a|b", storedResult{Status: model.StatusSuccess, Quantity: 1, OrderID: "o2", Made: 7, UserID: "a|b"}},
	{"rejected|3||insufficient_stock|u1", storedResult{Status: model.StatusRejected, Quantity: 3, Reason: "insufficient_stock", UserID: "u1"}},
	{"sold_out|1|||auth0|x", storedResult{Status: model.StatusSoldOut, Quantity: 1, UserID: "auth0|x"}},
	{"queued|2||17|u|x", storedResult{Status: model.StatusQueued, Quantity: 2, Seq: 17, UserID: "u|x"}},
	{"queued|1|||u1", storedResult{Status: model.StatusQueued, Quantity: 1, UserID: "u1"}}, // before sequence numbers
}

// storedProbe builds each case's value from its fields with the prelude's
// helpers, and parses the value back, and shows it under a durable mark:
// ARGV status, qty, order, reason (a success's decision number), seq (""
// for none), user, value, durable mark.
const storedProbe = `
local built
if ARGV[1] == 'queued' then
  built = stored_queued(ARGV[2], ARGV[5], ARGV[6])
else
  built = stored_result(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6])
end
local status, qty, order, reason, seq = parse_stored(ARGV[7])
return { built, status, qty, order, reason, tostring(seq or ''), stored_user(ARGV[7]), is_queued(ARGV[7]) and 1 or 0,
  stored_shown(ARGV[7], tonumber(ARGV[8])) }
`

// TestStoredFormat pins the stored result's format on both sides of the
// codec: Go's storedResult and the prelude's helpers build and read the
// same strings.
func TestStoredFormat(t *testing.T) {
	for _, tc := range storedCases {
		if got := tc.v.String(); got != tc.value {
			t.Errorf("%+v: Go builds %q, want %q", tc.v, got, tc.value)
		}
		if got, err := parseStored(tc.value); err != nil || got != tc.v {
			t.Errorf("%q: Go reads (%+v, %v), want %+v", tc.value, got, err, tc.v)
		}
	}
	prelude, err := scriptFiles.ReadFile(preludeFile)
	if err != nil {
		t.Fatal(err)
	}
	probe := redis.NewScript(string(prelude) + storedProbe)
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tc := range storedCases {
			seq, reason := numberField(tc.v.Seq), tc.v.Reason
			if tc.v.Status == model.StatusSuccess {
				reason = numberField(tc.v.Made)
			}
			// Below, at and above the case's decision number.
			for _, durable := range []int64{tc.v.Made - 1, tc.v.Made, tc.v.Made + 1} {
				got, err := probe.Run(t.Context(), s.rdb, nil, string(tc.v.Status), tc.v.Quantity, tc.v.OrderID,
					reason, seq, tc.v.UserID, tc.value, durable).Slice()
				if err != nil {
					t.Fatalf("probe %q: %v", tc.value, err)
				}
				want := []any{tc.value, string(tc.v.Status), strconv.FormatInt(tc.v.Quantity, 10), tc.v.OrderID, reason,
					seq, tc.v.UserID, int64(0), tc.v.shown(durable).String()}
				if tc.v.Status == model.StatusQueued {
					want[7] = int64(1)
				}
				if !slices.Equal(got, want) {
					t.Errorf("%q, durable %d: Lua builds, reads and shows %q, want %q", tc.value, durable, got, want)
				}
			}
		}
	})
}

// TestAdmitLayout: admit.lua reads its ARGV only at the positions admit.go
// names (it counts none of its own, and uses every one), and reads each
// value where admitArgs put it: every field of a request and of its
// challenge comes back from what the script stored.
func TestAdmitLayout(t *testing.T) {
	src, err := scriptFiles.ReadFile("admit.lua")
	if err != nil {
		t.Fatal(err)
	}
	var code strings.Builder
	for line := range strings.SplitSeq(string(src), "\n") {
		line, _, _ = strings.Cut(line, "--")
		code.WriteString(line + "\n")
	}
	if m := regexp.MustCompile(`(?i)\bargv\[\s*[0-9]`).FindString(code.String()); m != "" {
		t.Errorf("admit.lua reads ARGV at a position of its own: %q", m)
	}
	used := map[string]bool{}
	for _, name := range regexp.MustCompile(`\bADMIT_[A-Z_]+\b`).FindAllString(code.String(), -1) {
		used[name] = true
	}
	declared := map[string]bool{}
	for _, l := range admitLayout {
		declared[l.name] = true
	}
	if !maps.Equal(used, declared) {
		t.Errorf("admit.lua uses %v, admit.go declares %v", slices.Sorted(maps.Keys(used)), slices.Sorted(maps.Keys(declared)))
	}

	forEachBackend(t, func(t *testing.T, s *Store) {
		c := newCampaign(t, 10, 10)
		mustLoad(t, s, c)
		l := newLabels(c.ID)
		expires := time.Now().Add(time.Hour)
		a := model.AdmitRequest{RequestID: l.rid("r1"), CampaignID: c.ID, UserID: "u|layout", Quantity: 3,
			IdempotencyKey: "key-1", ClientIP: "203.0.113.9",
			Challenge: model.ChallengePass{ID: "ch-1", ExpiresAt: expires}}
		limits := model.RateLimits{UserRate: 1000, UserBurst: 10, IPRate: 1000, IPBurst: 10}
		got, err := s.Admit(t.Context(), c.ID, []model.AdmitRequest{a}, limits)
		if err != nil || got[0].Code != model.Admitted || got[0].RequestID != a.RequestID {
			t.Fatalf("Admit: got (%+v, %v), want it admitted", got, err)
		}
		k := campaignKeys(c.ID)
		marker, err := s.rdb.HGet(t.Context(), k.results, a.RequestID).Result()
		if err != nil || !regexp.MustCompile(`^queued\|3\|\|[1-9][0-9]*\|u\|layout$`).MatchString(marker) {
			t.Errorf("queued marker: got (%q, %v), want queued|3||<seq>|u|layout", marker, err)
		}
		if v, err := s.rdb.HGet(t.Context(), k.idem, idemField(a.UserID, a.IdempotencyKey)).Result(); err != nil || v != a.RequestID+"|3" {
			t.Errorf("idempotency key: got (%q, %v), want %q", v, err, a.RequestID+"|3")
		}
		for key, field := range map[string]string{k.userLimits: a.UserID, k.ipLimits: a.ClientIP} {
			if ok, err := s.rdb.HExists(t.Context(), key, field).Result(); err != nil || !ok {
				t.Errorf("%s: no rate-limit state for %q (%v)", key, field, err)
			}
		}
		ch := challengeKey(c.ID, a.Challenge.ID)
		if v, err := s.rdb.Get(t.Context(), ch).Result(); err != nil || v != challengeHolder(a.IdempotencyKey) {
			t.Errorf("challenge holder: got (%q, %v), want %q", v, err, challengeHolder(a.IdempotencyKey))
		}
		if at, err := s.rdb.ExpireTime(t.Context(), ch).Result(); err != nil || strconv.FormatInt(int64(at/time.Second), 10) != challengeExpiry(expires) {
			t.Errorf("challenge expiry: got (%v, %v), want %s", at, err, challengeExpiry(expires))
		}
	})
}

// TestIdemFormat pins an Idempotency-Key's value in the idem hash on both
// sides: the prelude's idem_value and parse_idem, and Go's parseIdemValue.
func TestIdemFormat(t *testing.T) {
	cases := []struct {
		value, rid, fp string
		hasFP          bool
	}{
		{"c.1|3", "c.1", "3", true},
		{"c.1|", "c.1", "", true},
		{"c.1", "c.1", "", false}, // before fingerprints: matches any
	}
	for _, tc := range cases {
		if rid, fp, hasFP := parseIdemValue(tc.value); rid != tc.rid || fp != tc.fp || hasFP != tc.hasFP {
			t.Errorf("%q: Go reads (%q, %q, %v), want (%q, %q, %v)", tc.value, rid, fp, hasFP, tc.rid, tc.fp, tc.hasFP)
		}
	}
	prelude, err := scriptFiles.ReadFile(preludeFile)
	if err != nil {
		t.Fatal(err)
	}
	probe := redis.NewScript(string(prelude) + `
local rid, fp = parse_idem(ARGV[1])
return { idem_value(ARGV[2], ARGV[3]), rid, fp or 'none' }`)
	forEachBackend(t, func(t *testing.T, s *Store) {
		for _, tc := range cases {
			got, err := probe.Run(t.Context(), s.rdb, nil, tc.value, tc.rid, tc.fp).StringSlice()
			if err != nil {
				t.Fatalf("probe %q: %v", tc.value, err)
			}
			want := []string{tc.rid + "|" + tc.fp, tc.rid, tc.fp}
			if !tc.hasFP {
				want[2] = "none"
			}
			if !slices.Equal(got, want) {
				t.Errorf("%q: Lua builds and reads %q, want %q", tc.value, got, want)
			}
		}
	})
}
