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

	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestREADMEWalkThrough runs README.md's walk-through as it is written,
// against `flashsale serve` (the embedded default it is written for), so
// the README cannot drift from the server: every curl must answer 2xx, and
// every answer shown under a command ("# {…}") must match the real one —
// the same keys, the same values, where "…" stands for what differs each
// run and the hex digits before it for any hex digit. A value shown with
// "…" names that value further on (a request id in the poll's URL). A line
// the test does not understand fails it: a new kind of step must be taught
// here, not skipped.
func TestREADMEWalkThrough(t *testing.T) {
	block := readmeWalkThrough(t)
	var (
		ctx    = t.Context()
		base   string // the running server's http://host:port
		vars   = map[string]string{}
		binds  = map[string]string{} // "spring-sale.0193…" -> the real id
		lines  = strings.Split(block, "\n")
		client = &http.Client{Timeout: 30 * time.Second}
	)
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
		words := shellWords(t, line, vars)
		steps++
		switch {
		case len(words) == 1 && strings.Contains(words[0], "="):
			name, value, _ := strings.Cut(words[0], "=")
			vars[name] = value
		case len(words) >= 2 && strings.Contains(words[0], "=") && words[1] == "$(":
			// NAME=$(go run ./cmd/flashsale token alice)
			name, _, _ := strings.Cut(words[0], "=")
			args := flashsaleArgs(t, words[2:len(words)-1])
			var out bytes.Buffer
			if err := run(ctx, args, &out, map[string]string{}, logTo(io.Discard)); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			vars[name] = strings.TrimSpace(out.String())
		case len(words) >= 3 && words[0] == "go" && words[len(words)-1] == "&":
			args := flashsaleArgs(t, words[:len(words)-1])
			if port := config.Default().HTTP.Addr; !strings.HasSuffix(port, ":8080") {
				t.Fatalf("the walk-through says localhost:8080; the default http.addr is %s", port)
			}
			base = startServe(t, args)
		case words[0] == "curl":
			want, next := expectations(i)
			i = next
			runCurl(t, client, base, words[1:], want, binds)
		case words[0] == "websocat" && len(words) == 2:
			if i+1 >= len(lines) || !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "{") {
				t.Fatalf("websocat without a frame to send after it")
			}
			i++
			frame := strings.TrimSpace(lines[i])
			want, next := expectations(i)
			i = next
			runWebSocket(t, base, words[1], frame, want, binds)
		default:
			t.Fatalf("walk-through line not understood (teach TestREADMEWalkThrough): %q", line)
		}
	}
	if steps < 10 || base == "" {
		t.Fatalf("ran %d steps (server started: %v); the walk-through was not found whole", steps, base != "")
	}
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
// dropped, and "$(" / ")" kept as words around a command substitution.
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
		case c == ')':
			flush()
			words = append(words, ")")
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

// runCurl sends one curl of the walk-through and compares its answer with
// want (at most one line). A read, or a purchase with an Idempotency-Key,
// is sent again until it matches (a result is queued for a moment); other
// requests must match at once.
func runCurl(t *testing.T, client *http.Client, base string, args []string, want []string, binds map[string]string) {
	t.Helper()
	method, target, body := "GET", "", ""
	header := http.Header{}
	for j := 0; j < len(args); j++ {
		switch a := args[j]; {
		case a == "-s":
		case strings.HasPrefix(a, "-X"):
			method = strings.TrimPrefix(a, "-X")
		case a == "-H" && j+1 < len(args):
			j++
			k, v, _ := strings.Cut(args[j], ":")
			header.Set(k, strings.TrimSpace(v))
		case a == "-d" && j+1 < len(args):
			j++
			body = args[j]
		case !strings.HasPrefix(a, "-") && target == "":
			target = a
		default:
			t.Fatalf("curl argument not understood: %q in %q", a, args)
		}
	}
	if len(want) > 1 {
		t.Fatalf("curl %s %s: %d answers shown, want at most one", method, target, len(want))
	}
	u := onServer(t, base, bound(t, target, binds))
	retry := method == "GET" || header.Get("Idempotency-Key") != ""
	deadline := time.Now().Add(20 * time.Second)
	for {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(bound(t, body, binds))
		}
		req, err := http.NewRequest(method, u, rd)
		if err != nil {
			t.Fatalf("curl %s %s: %v", method, target, err)
		}
		req.Header = header.Clone()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("curl %s %s: %v", method, target, err)
		}
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		mismatch := ""
		if resp.StatusCode/100 != 2 {
			mismatch = fmt.Sprintf("status %d", resp.StatusCode)
		} else if len(want) == 1 {
			mismatch = matchJSON(t, want[0], got, binds)
		}
		if mismatch == "" {
			return
		}
		if !retry || time.Now().After(deadline) {
			t.Fatalf("curl %s %s: %s\n got: %s\nwant: %v", method, target, mismatch, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runWebSocket connects as websocat would, sends frame and reads one frame
// per answer shown.
func runWebSocket(t *testing.T, base, addr, frame string, want []string, binds map[string]string) {
	t.Helper()
	conn, resp, err := websocket.DefaultDialer.Dial(onServer(t, base, addr), nil)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		t.Fatalf("websocat %s: %v", addr, err)
	}
	defer conn.Close()
	if err := conn.WriteMessage(websocket.TextMessage, []byte(bound(t, frame, binds))); err != nil {
		t.Fatalf("send %s: %v", frame, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	for _, w := range want {
		_, got, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("websocket: waiting for %s: %v", w, err)
		}
		if mismatch := matchJSON(t, w, got, binds); mismatch != "" {
			t.Fatalf("websocket frame: %s\n got: %s\nwant: %s", mismatch, got, w)
		}
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
