package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// mintedHeader is the header segment of a minted token.
var mintedHeader = strings.TrimSuffix(mintedPrefix, ".")

var mintedTestStart = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

func newMintedTestJWT() *JWT {
	j := NewJWT([]byte("minted-test-secret-0123456789abcdef012"), time.Second)
	j.now = func() time.Time { return mintedTestStart }
	return j
}

// agreesWithParse fails unless verifyMinted's answer for token is golang-jwt's:
// whatever the fast path accepts, ParseWithClaims accepts with the same
// claims. It reports whether the fast path took the token.
func agreesWithParse(t *testing.T, j *JWT, token string) bool {
	t.Helper()
	fast, ok := j.verifyMinted(token)
	full, _, err := j.parse(token)
	if ok && err != nil {
		t.Fatalf("token %q: fast path accepted it, golang-jwt refused it: %v", token, err)
	}
	if ok && !reflect.DeepEqual(fast, full) {
		t.Fatalf("token %q: fast path claims %+v, golang-jwt's %+v", token, fast, full)
	}
	return ok
}

// signHS256 returns header.payload.signature with a valid HMAC over the
// encoded header and payload, whatever they hold.
func signHS256(secret []byte, header, payload string) string {
	enc := base64.RawURLEncoding
	signed := header + "." + enc.EncodeToString([]byte(payload))
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(signed))
	return signed + "." + enc.EncodeToString(mac.Sum(nil))
}

// TestMintedHeader: the prefix is what golang-jwt writes for HS256, so every
// minted token can take the fast path.
func TestMintedHeader(t *testing.T) {
	raw, err := base64.RawURLEncoding.DecodeString(mintedHeader)
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]any
	if err := json.Unmarshal(raw, &h); err != nil || len(h) != 2 || h["alg"] != "HS256" || h["typ"] != "JWT" {
		t.Fatalf("mintedHeader %q decodes to %s (%v)", mintedHeader, raw, err)
	}
}

func TestVerifyMintedAgreesWithGolangJWT(t *testing.T) {
	j := newMintedTestJWT()
	minted, err := j.Mint("alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other := NewJWT([]byte("another-secret-0123456789abcdef0123456"), time.Second)
	other.now = j.now
	foreign, _ := other.Mint("alice", time.Hour)
	header, rest, _ := strings.Cut(minted, ".")
	payload, signature, _ := strings.Cut(rest, ".")
	exp := mintedTestStart.Add(time.Hour).Unix()
	claims := func(s string) string { return signHS256(j.secret, mintedHeader, s) }
	later := func(d time.Duration) *JWT {
		k := newMintedTestJWT()
		k.now = func() time.Time { return mintedTestStart.Add(d) }
		return k
	}

	tests := []struct {
		name  string
		j     *JWT
		token string
		fast  bool // the fast path must take it
	}{
		{name: "as minted", j: j, token: minted, fast: true},
		{name: "within the leeway after exp", j: later(time.Hour + 500*time.Millisecond), token: minted, fast: true},
		{name: "expired", j: later(time.Hour + 2*time.Second), token: minted},
		{name: "not yet valid", j: later(-time.Minute), token: minted},
		{name: "other secret", j: j, token: foreign},
		{name: "signature cut", j: j, token: minted[:len(minted)-2]},
		{name: "signature not base64", j: j, token: minted[:len(minted)-2] + "*!"},
		{name: "signature padded", j: j, token: minted + "="},
		{name: "payload changed", j: j, token: header + "." + payload[:len(payload)-1] + flip(payload[len(payload)-1]) + "." + signature},
		{name: "fourth segment", j: j, token: minted + ".x"},
		{name: "two segments", j: j, token: header + "." + payload},
		{name: "empty", j: j, token: ""},
		{name: "header only", j: j, token: mintedHeader},
		{name: "alg none", j: j, token: base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + payload + "."},
		{name: "header keys swapped", j: j, token: signHS256(j.secret,
			base64.RawURLEncoding.EncodeToString([]byte(`{"typ":"JWT","alg":"HS256"}`)), `{"sub":"alice","exp":`+jsonInt(exp)+`}`)},
		{name: "no exp", j: j, token: claims(`{"sub":"alice"}`)},
		{name: "other claims shape", j: j, token: claims(`{"iss":"x","sub":"alice","exp":` + jsonInt(exp) + `}`)},
		{name: "claims not JSON", j: j, token: claims(`{"sub":`)},
		{name: "claims null", j: j, token: claims(`null`)},
		{name: "claims array", j: j, token: claims(`[]`)},
		{name: "exp a string", j: j, token: claims(`{"sub":"alice","exp":"` + jsonInt(exp) + `"}`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if took := agreesWithParse(t, tc.j, tc.token); took != tc.fast {
				t.Fatalf("fast path took it: %v, want %v", took, tc.fast)
			}
		})
	}
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// FuzzVerifyMinted: correctly signed tokens in Mint's header with arbitrary
// claims, and arbitrary strings after that header.
func FuzzVerifyMinted(f *testing.F) {
	f.Add(`{"sub":"alice","exp":1893456000,"nbf":1893452400,"iat":1893452400}`, true, "")
	f.Add(`{"sub":"alice","exp":1893459600.5}`, true, "")
	f.Add(`{"sub":"a","exp":1e10,"nbf":null}`, true, "")
	f.Add(`e30.c2ln`, false, ".")
	f.Fuzz(func(t *testing.T, claims string, signed bool, tail string) {
		j := newMintedTestJWT()
		token := mintedHeader + "." + claims + tail
		if signed {
			token = signHS256(j.secret, mintedHeader, claims) + tail
		}
		agreesWithParse(t, j, token)
	})
}
