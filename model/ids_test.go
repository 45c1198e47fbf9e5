package model

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// The regular expressions the hand-written id checks replaced: the checks
// must accept exactly what these accept.
var (
	refCampaignID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	refHexTail    = regexp.MustCompile(`^[0-9a-f]{32}$`)
	// A bucket's tag: the campaign id, ':' and 0..63 without a leading zero.
	refBucketTag = regexp.MustCompile(`^([A-Za-z0-9_-]{1,64}):([0-9]|[1-5][0-9]|6[0-3])$`)
)

// refValidUserID is CheckUserID's rule the plain way: 1 to 255 bytes of
// valid UTF-8, every rune printable.
func refValidUserID(s string) bool {
	return len(s) >= 1 && len(s) <= 255 && utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) })
}

func refCampaignOfRequest(id string) (string, bool) {
	i := strings.LastIndexByte(id, '.')
	if i < 0 || !refHexTail.MatchString(id[i+1:]) {
		return "", false
	}
	if m := refBucketTag.FindStringSubmatch(id[:i]); m != nil {
		return m[1], true
	}
	if !refCampaignID.MatchString(id[:i]) {
		return "", false
	}
	return id[:i], true
}

func checkIDsMatchRegexps(t *testing.T, s string) {
	t.Helper()
	if got, want := ValidCampaignID(s), refCampaignID.MatchString(s); got != want {
		t.Errorf("ValidCampaignID(%q) = %v, want %v", s, got, want)
	}
	if got, want := ValidUserID(s), refValidUserID(s); got != want {
		t.Errorf("ValidUserID(%q) = %v, want %v", s, got, want)
	}
	gotC, gotOK := CampaignOfRequest(s)
	if wantC, wantOK := refCampaignOfRequest(s); gotC != wantC || gotOK != wantOK {
		t.Errorf("CampaignOfRequest(%q) = %q, %v; want %q, %v", s, gotC, gotOK, wantC, wantOK)
	}
}

func TestIDsMatchRegexps(t *testing.T) {
	hex := strings.Repeat("0a", 16)
	cases := []string{"", "a", "A-z_9", "a b", "a.b", "user@example.com:1", "\x00", "é", "a\n", "\xff",
		strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("u", 255), strings.Repeat("u", 256),
		"auth0|5f7c8ec7b4a1d2006b1f0e3a", "google-oauth2|1234", "Zoë|ünïcødé", "日本語の利用者", strings.Repeat("é", 127) + "a",
		strings.Repeat("é", 128), "\u200b", "a\u202eb", "a\u00a0b", "\ufffd", "\x7f", "\xc3\x28",
		"c." + hex, "c." + strings.ToUpper(hex), "c." + hex + "0", ".c" + hex, "c.d." + hex, "{c}." + hex}
	// Every single byte, alone and inside an otherwise valid id.
	for c := range 256 {
		cases = append(cases, string([]byte{byte(c)}), "ab"+string([]byte{byte(c)})+"cd", "c."+hex[:31]+string([]byte{byte(c)}))
	}
	for _, s := range cases {
		checkIDsMatchRegexps(t, s)
	}
}

func FuzzIDsMatchRegexps(f *testing.F) {
	f.Add("spring-sale." + strings.Repeat("ab", 16))
	f.Add("alice@example.com")
	f.Add("a b")
	f.Fuzz(checkIDsMatchRegexps)
}

// TestCheckUserID: the subjects identity providers issue are user ids; an
// empty, oversized or unprintable one is refused with the reason.
func TestCheckUserID(t *testing.T) {
	tests := []struct {
		name, id, want string // want "" = accepted
	}{
		{"auth0", "auth0|5f7c8ec7b4a1d2006b1f0e3a", ""},
		{"google", "google-oauth2|1234", ""},
		{"non-ASCII", "Zoë|日本語", ""},
		{"separators", `a|b:c"d\e{f}g h`, ""},
		{"255 bytes", strings.Repeat("é", 127) + "a", ""},
		{"empty", "", "empty"},
		{"256 bytes", strings.Repeat("é", 128), "longer than 255 bytes"},
		{"invalid UTF-8", "a\xffb", "not valid UTF-8"},
		{"newline", "a\nb", "holds the unprintable character U+000A"},
		{"bidi override", "a\u202eb", "holds the unprintable character U+202E"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CheckUserID(tt.id); got != tt.want {
				t.Fatalf("CheckUserID(%q) = %q, want %q", tt.id, got, tt.want)
			}
		})
	}
}

func TestAdmittedAt(t *testing.T) {
	at := time.UnixMilli(1_790_000_123_456)
	id := FormatRequestID("c:3", fmt.Sprintf("%012x", at.UnixMilli())+"7abc8def0123456789ab")
	if got, ok := AdmittedAt(id); !ok || !got.Equal(at) {
		t.Fatalf("AdmittedAt(%s): got %v, %v; want %v", id, got, ok, at)
	}
	if _, ok := AdmittedAt("c.xyz"); ok {
		t.Fatal("AdmittedAt of a malformed id: ok")
	}
}
