package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestREADMEWalkThrough runs README.md's walk-through as it is written,
// against `flashsale serve` (the embedded default it is written for), so
// the README cannot drift from the server: every curl must answer 2xx, and
// every answer shown under a command ("# {…}") must match the real one —
// the same keys, the same values, where "…" stands for what differs each
// run and the hex digits before it for any hex digit. A value shown with
// "…" names that value in the answers further on. A value kept in a shell
// variable (NAME=$(curl … | jq -r .field)) is the answer's field, which
// must be a string. A line the test does not understand fails it: a new
// kind of step must be taught here, not skipped.
func TestREADMEWalkThrough(t *testing.T) {
	block := readmeWalkThrough(t)
	w := &walk{t: t, vars: map[string]string{}, binds: map[string]string{},
		client: &http.Client{Timeout: 30 * time.Second}}
	lines := strings.Split(block, "\n")
	// expectations returns the "# {…}" lines that follow line i.
	expectations := func(i int) ([]string, int) {
		var out []string
		for i+1 < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i+1]), "# {") {
			i++
			out = append(out, strings.TrimPrefix(strings.TrimSpace(lines[i]), "# "))
		}
		return out, i
	}
	steps := 0
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// A command goes on over a trailing backslash and an open quote.
		for strings.HasSuffix(line, `\`) || strings.Count(line, "'")%2 == 1 {
			if i+1 >= len(lines) {
				t.Fatalf("walk-through ends inside a command: %q", line)
			}
			i++
			if strings.HasSuffix(line, `\`) {
				line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(lines[i])
			} else {
				line += "\n" + lines[i]
			}
		}
		steps++
		want, next := expectations(i)
		i = next
		w.step(line, shellWords(t, line, w.vars), want)
	}
	if steps < 10 || w.base == "" {
		t.Fatalf("ran %d steps (server started: %v); the walk-through was not found whole", steps, w.base != "")
	}
}

// walk is the state of a walk-through run: the server, the shell's
// variables and the values the answers named.
type walk struct {
	t      *testing.T
	base   string            // the running server's http://host:port
	vars   map[string]string // the shell's variables
	binds  map[string]string // "spring-sale.0193…" -> the real id
	client *http.Client
}

// step runs one command of the walk-through; want are the answers shown
// under it.
func (w *walk) step(line string, words, want []string) {
	t := w.t
	t.Helper()
	noAnswer := func() {
		if len(want) > 0 {
			t.Fatalf("an answer shown under a command that prints none: %q", line)
		}
	}
	switch {
	case len(words) == 1 && strings.Contains(words[0], "="):
		noAnswer()
		name, value, _ := strings.Cut(words[0], "=")
		w.vars[name] = value
	case isCapture(words) && words[2] == "go":
		// NAME=$(go run ./cmd/flashsale token alice)
		noAnswer()
		args := flashsaleArgs(t, words[2:len(words)-1])
		var out bytes.Buffer
		if err := run(t.Context(), args, &out, map[string]string{}, logTo(io.Discard)); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		w.vars[captureName(words)] = strings.TrimSpace(out.String())
	case isCapture(words) && words[2] == "curl":
		// NAME=$(curl … | jq -r .field)
		req, field := curlToField(t, words[3:len(words)-1], "-r")
		body := runCurl(t, w.client, w.base, req, want, w.binds, req.retried(), nil)
		value, ok := stringField(body, field)
		if !ok {
			t.Fatalf("%s: the answer has no string %q: %s", line, field, body)
		}
		w.vars[captureName(words)] = value
	case words[0] == "until":
		w.until(line, untilCondition(t, words), want)
	case len(words) >= 3 && words[0] == "go" && words[len(words)-1] == "&":
		noAnswer()
		args := flashsaleArgs(t, words[:len(words)-1])
		if port := config.Default().HTTP.Addr; !strings.HasSuffix(port, ":8080") {
			t.Fatalf("the walk-through says localhost:8080; the default http.addr is %s", port)
		}
		w.base = startServe(t, args)
	case words[0] == "curl":
		req := parseCurl(t, words[1:])
		runCurl(t, w.client, w.base, req, want, w.binds, req.retried(), nil)
	default:
		t.Fatalf("walk-through line not understood (teach TestREADMEWalkThrough): %q", line)
	}
}

// until runs "until CONDITION; do sleep N; done", where CONDITION is a curl
// or NAME=$(curl … | jq -er .field): sent again until it holds.
func (w *walk) until(line string, cond, want []string) {
	t := w.t
	t.Helper()
	switch {
	case isCapture(cond) && cond[2] == "curl":
		req, field := curlToField(t, cond[3:len(cond)-1], "-er")
		body := runCurl(t, w.client, w.base, req, want, w.binds, true, func(b []byte) bool {
			_, ok := stringField(b, field)
			return ok
		})
		w.vars[captureName(cond)], _ = stringField(body, field)
	case cond[0] == "curl":
		runCurl(t, w.client, w.base, parseCurl(t, cond[1:]), want, w.binds, true, nil)
	default:
		t.Fatalf("until-condition not understood: %q", line)
	}
}

// isCapture tells whether words are NAME=$( … ).
func isCapture(words []string) bool {
	return len(words) >= 4 && strings.HasSuffix(words[0], "=") && !strings.Contains(strings.TrimSuffix(words[0], "="), "=") &&
		words[1] == "$(" && words[len(words)-1] == ")"
}

// captureName is NAME of NAME=$( … ).
func captureName(words []string) string { return strings.TrimSuffix(words[0], "=") }

// untilCondition returns CONDITION of "until CONDITION ; do sleep N ; done".
func untilCondition(t *testing.T, words []string) []string {
	t.Helper()
	n := len(words)
	if n < 7 || words[n-6] != ";" || words[n-5] != "do" || words[n-4] != "sleep" || words[n-2] != ";" || words[n-1] != "done" {
		t.Fatalf("until loop not understood (want: until CONDITION; do sleep N; done): %q", words)
	}
	if d, err := time.ParseDuration(words[n-3] + "s"); err != nil || d <= 0 || d > 5*time.Second {
		t.Fatalf("until loop sleeps %q: want a few tenths of a second", words[n-3])
	}
	return words[1 : n-6]
}

// curlToField splits "curl … | jq FLAGS .field" into the curl and the field.
func curlToField(t *testing.T, words []string, flags string) (curlRequest, string) {
	t.Helper()
	n := len(words)
	if n < 5 || words[n-4] != "|" || words[n-3] != "jq" || words[n-2] != flags || !jqField.MatchString(words[n-1]) {
		t.Fatalf("want curl … | jq %s .field, got %q", flags, words)
	}
	return parseCurl(t, words[1:n-4]), strings.TrimPrefix(words[n-1], ".")
}

// jqField is the one jq filter the walk-through uses: a top-level field.
var jqField = regexp.MustCompile(`^\.[a-z_]+$`)

// stringField returns the answer's top-level field as jq -er prints it: a
// string, present and not null.
func stringField(body []byte, field string) (string, bool) {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return "", false
	}
	s, ok := m[field].(string)
	return s, ok
}

// readmeWalkThrough returns the first sh block under the README's
// walk-through heading.
func readmeWalkThrough(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatalf("read README: %v", err)
	}
	_, section, ok := strings.Cut(string(b), "\n## A five-minute walk-through\n")
	if !ok {
		t.Fatalf("README has no walk-through section")
	}
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatalf("walk-through has no sh block")
	}
	block, _, ok = strings.Cut(block, "\n```")
	if !ok {
		t.Fatalf("walk-through's sh block does not end")
	}
	return block
}

// shellWords splits a command as sh would for the walk-through's needs:
// single quotes literal, double quotes expanding $NAME, a trailing comment
// dropped, "$(" / ")" kept as words around a command substitution, and ";"
// and "|" as words of their own.
func shellWords(t *testing.T, line string, vars map[string]string) []string {
	t.Helper()
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
	)
	expand := func(s string, j int) (string, int) {
		k := j + 1
		for k < len(s) && (s[k] == '_' || s[k] >= 'A' && s[k] <= 'Z') {
			k++
		}
		v, ok := vars[s[j+1:k]]
		if !ok {
			t.Fatalf("walk-through uses $%s before setting it", s[j+1:k])
		}
		return v, k
	}
	flush := func() {
		if in {
			words = append(words, cur.String())
			cur.Reset()
			in = false
		}
	}
	for j := 0; j < len(line); {
		switch c := line[j]; {
		case c == ' ' || c == '\t':
			flush()
			j++
		case c == '#' && !in:
			return words
		case c == '\'':
			end := strings.IndexByte(line[j+1:], '\'')
			cur.WriteString(line[j+1 : j+1+end])
			in, j = true, j+end+2
		case c == '"':
			j++
			for j < len(line) && line[j] != '"' {
				if line[j] == '$' {
					v, k := expand(line, j)
					cur.WriteString(v)
					j = k
					continue
				}
				cur.WriteByte(line[j])
				j++
			}
			in, j = true, j+1
		case c == '$' && j+1 < len(line) && line[j+1] == '(':
			flush()
			words = append(words, "$(")
			j += 2
		case c == ')' || c == ';' || c == '|':
			flush()
			words = append(words, string(c))
			j++
		case c == '$':
			v, k := expand(line, j)
			cur.WriteString(v)
			in, j = true, k
		default:
			cur.WriteByte(c)
			in, j = true, j+1
		}
	}
	flush()
	return words
}

// flashsaleArgs returns the arguments of "go run ./cmd/flashsale …".
func flashsaleArgs(t *testing.T, words []string) []string {
	t.Helper()
	if len(words) < 3 || words[0] != "go" || words[1] != "run" || words[2] != "./cmd/flashsale" {
		t.Fatalf("walk-through command not understood: %q", words)
	}
	return words[3:]
}

// startServe runs the command the walk-through starts the server with, on
// a free port, and returns its base URL once it is ready.
func startServe(t *testing.T, args []string) string {
	t.Helper()
	base, _ := serveInProcess(t, args, map[string]string{})
	testenv.Eventually(t, 20*time.Second, "serve ready", func() (bool, string) {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return base
}

// onServer points a walk-through address (localhost:8080) at the server.
func onServer(t *testing.T, base, addr string) string {
	t.Helper()
	host := strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://")
	for _, scheme := range []string{"", "http://", "ws://"} {
		if rest, ok := strings.CutPrefix(addr, scheme+"localhost:8080"); ok {
			if scheme == "" {
				scheme = "http://"
			}
			return scheme + host + rest
		}
	}
	t.Fatalf("walk-through address %q is not on localhost:8080", addr)
	return ""
}

// bound replaces the placeholders named so far with their values.
func bound(t *testing.T, s string, binds map[string]string) string {
	t.Helper()
	keys := make([]string, 0, len(binds))
	for k := range binds {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for _, k := range keys {
		s = strings.ReplaceAll(s, k, binds[k])
	}
	if strings.Contains(s, "…") {
		t.Fatalf("walk-through uses a value no earlier answer named: %q", s)
	}
	return s
}

// curlRequest is one curl command of the walk-through.
type curlRequest struct {
	method, target, body string
	header               http.Header
	discard              bool // >/dev/null: the answer is not shown
}

// retried tells whether the request may be sent again until its answer
// matches: a read, or a purchase with an Idempotency-Key (a result is
// queued for a moment).
func (c curlRequest) retried() bool {
	return c.method == "GET" || c.header.Get("Idempotency-Key") != ""
}

// parseCurl reads curl's arguments: -s and -f (the answer must be 2xx in
// any case), -X, -H, -d, the URL and >/dev/null.
func parseCurl(t *testing.T, args []string) curlRequest {
	t.Helper()
	req := curlRequest{method: "GET", header: http.Header{}}
	for j := 0; j < len(args); j++ {
		switch a := args[j]; {
		case a == "-s" || a == "-f" || a == "-sf" || a == "-fs":
		case a == ">/dev/null":
			req.discard = true
		case strings.HasPrefix(a, "-X"):
			req.method = strings.TrimPrefix(a, "-X")
		case a == "-H" && j+1 < len(args):
			j++
			k, v, _ := strings.Cut(args[j], ":")
			req.header.Set(k, strings.TrimSpace(v))
		case a == "-d" && j+1 < len(args):
			j++
			req.body = args[j]
		case !strings.HasPrefix(a, "-") && req.target == "":
			req.target = a
		default:
			t.Fatalf("curl argument not understood: %q in %q", a, args)
		}
	}
	return req
}

// runCurl sends one curl of the walk-through, compares its answer with
// want (at most one line) and returns it. With retry it is sent again until
// it is 2xx, matches, and ready (when not nil) holds, for 20 s at most;
// otherwise it must do so at once.
func runCurl(t *testing.T, client *http.Client, base string, c curlRequest, want []string, binds map[string]string, retry bool, ready func([]byte) bool) []byte {
	t.Helper()
	if len(want) > 1 {
		t.Fatalf("curl %s %s: %d answers shown, want at most one", c.method, c.target, len(want))
	}
	if c.discard && len(want) > 0 {
		t.Fatalf("curl %s %s >/dev/null: an answer is shown under it", c.method, c.target)
	}
	u := onServer(t, base, bound(t, c.target, binds))
	deadline := time.Now().Add(20 * time.Second)
	for {
		var rd io.Reader
		if c.body != "" {
			rd = strings.NewReader(bound(t, c.body, binds))
		}
		req, err := http.NewRequest(c.method, u, rd)
		if err != nil {
			t.Fatalf("curl %s %s: %v", c.method, c.target, err)
		}
		req.Header = c.header.Clone()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("curl %s %s: %v", c.method, c.target, err)
		}
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		mismatch := ""
		switch {
		case resp.StatusCode/100 != 2:
			mismatch = fmt.Sprintf("status %d", resp.StatusCode)
		case ready != nil && !ready(got):
			mismatch = "not yet what the loop waits for"
		case len(want) == 1:
			mismatch = matchJSON(t, want[0], got, binds)
		}
		if mismatch == "" {
			return got
		}
		if !retry || time.Now().After(deadline) {
			t.Fatalf("curl %s %s: %s\n got: %s\nwant: %v", c.method, c.target, mismatch, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// matchJSON compares an answer with the README's line; on a match, the
// placeholders it named are added to binds. It returns what differs, "" if
// nothing.
func matchJSON(t *testing.T, want string, got []byte, binds map[string]string) string {
	t.Helper()
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("README answer is not JSON: %v: %s", err, want)
	}
	if err := json.Unmarshal(got, &g); err != nil {
		return "answer is not JSON: " + err.Error()
	}
	named := map[string]string{}
	if d := matchValue("", w, g, binds, named); d != "" {
		return d
	}
	for k, v := range named {
		binds[k] = v
	}
	return ""
}

// hexDigit is one illustrative hex digit in a README value.
var hexDigit = regexp.MustCompile(`[0-9a-f]`)

func matchValue(path string, want, got any, binds, named map[string]string) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: got %v, want an object", path, got)
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				return fmt.Sprintf("%s.%s: in the answer, not in the README", path, k)
			}
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Sprintf("%s.%s: in the README, not in the answer", path, k)
			}
			if d := matchValue(path+"."+k, wv, gv, binds, named); d != "" {
				return d
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s: got %v, want %d elements", path, got, len(w))
		}
		for i := range w {
			if d := matchValue(fmt.Sprintf("%s[%d]", path, i), w[i], g[i], binds, named); d != "" {
				return d
			}
		}
		return ""
	case string:
		g, ok := got.(string)
		if !ok {
			return fmt.Sprintf("%s: got %v, want a string", path, got)
		}
		prefix, _, elided := strings.Cut(w, "…")
		if !elided {
			if g != w {
				return fmt.Sprintf("%s: got %q, want %q", path, g, w)
			}
			return ""
		}
		pattern := "^" + hexDigit.ReplaceAllLiteralString(regexp.QuoteMeta(prefix), "[0-9a-f]") + ".+$"
		if !regexp.MustCompile(pattern).MatchString(g) {
			return fmt.Sprintf("%s: got %q, want the form %q", path, g, w)
		}
		if prefix == "" {
			return "" // "…" alone names nothing
		}
		if v, ok := binds[w]; ok && v != g {
			return fmt.Sprintf("%s: got %q, want %q (named %q before)", path, g, v, w)
		}
		if v, ok := named[w]; ok && v != g {
			return fmt.Sprintf("%s: got %q, want %q (named %q in this answer)", path, g, v, w)
		}
		named[w] = g
		return ""
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) {
			return fmt.Sprintf("%s: got %v, want %v", path, got, want)
		}
		return ""
	}
}
