package model

import (
	"regexp"
	"strings"
	"testing"
)

// The regular expressions the hand-written id checks replaced: the checks
// must accept exactly what these accept.
var (
	refCampaignID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	refUserID     = regexp.MustCompile(`^[A-Za-z0-9_.@:-]{1,128}$`)
	refHexTail    = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

func refCampaignOfRequest(id string) (string, bool) {
	i := strings.LastIndexByte(id, '.')
	if i < 0 || !refCampaignID.MatchString(id[:i]) || !refHexTail.MatchString(id[i+1:]) {
		return "", false
	}
	return id[:i], true
}

func checkIDsMatchRegexps(t *testing.T, s string) {
	t.Helper()
	if got, want := ValidCampaignID(s), refCampaignID.MatchString(s); got != want {
		t.Errorf("ValidCampaignID(%q) = %v, want %v", s, got, want)
	}
	if got, want := ValidUserID(s), refUserID.MatchString(s); got != want {
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
		strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("u", 128), strings.Repeat("u", 129),
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
