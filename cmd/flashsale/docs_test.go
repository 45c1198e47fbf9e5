package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocsScripts holds docs/ARCHITECTURE.md's list of Lua scripts equal
// to the scripts in the tree (testdata/ aside): a script added, renamed or
// removed must be written down there too.
func TestDocsScripts(t *testing.T) {
	root := moduleRoot(t)
	section := docSection(t, "docs/ARCHITECTURE.md", "Lua scripts")
	var listed []string
	for _, m := range scriptRow.FindAllStringSubmatch(section, -1) {
		listed = append(listed, m[1])
	}
	files := luaFiles(t, root)
	if len(files) == 0 {
		t.Fatal("found no Lua script in the tree")
	}
	slices.Sort(listed)
	slices.Sort(files)
	for _, f := range files {
		if !slices.Contains(listed, f) {
			t.Errorf("%s is not in docs/ARCHITECTURE.md's Lua scripts", f)
		}
	}
	for _, l := range listed {
		if !slices.Contains(files, l) {
			t.Errorf("docs/ARCHITECTURE.md lists %s, which does not exist", l)
		}
	}
	if len(listed) != len(slices.Compact(slices.Clone(listed))) {
		t.Errorf("docs/ARCHITECTURE.md lists a script twice: %v", listed)
	}
}

// TestDocsRoutes holds the routes docs/API.md and docs/OPERATIONS.md name
// ("`GET /api/v1/orders`") equal to the operations of the OpenAPI document,
// which TestOpenAPIRoutes holds equal to the routes the roles register.
func TestDocsRoutes(t *testing.T) {
	root := moduleRoot(t)
	documented := map[string]bool{}
	for _, doc := range []string{"docs/API.md", "docs/OPERATIONS.md"} {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docRoute.FindAllStringSubmatch(string(b), -1) {
			p, _, _ := strings.Cut(m[2], "?")
			p, _, _ = strings.Cut(p, "[")
			if strings.HasSuffix(p, "…") {
				continue // an example, not a route
			}
			documented[m[1]+" "+docParam.ReplaceAllString(p, "{}")] = true
		}
	}
	specified := map[string]bool{}
	for _, op := range documentedOps(t) {
		specified[op.method+" "+ginParam.ReplaceAllString(op.path, "{}")] = true
	}
	for r := range specified {
		if !documented[r] {
			t.Errorf("%s is in the OpenAPI document but in neither docs/API.md nor docs/OPERATIONS.md", r)
		}
	}
	for r := range documented {
		if !specified[r] {
			t.Errorf("the docs name %s, which the OpenAPI document does not have", r)
		}
	}
	if len(specified) < 30 {
		t.Fatalf("the OpenAPI document has %d operations; it was not read whole", len(specified))
	}
}

var (
	// docRoute is a route named in the docs: `METHOD /path`.
	docRoute = regexp.MustCompile("`(GET|POST|PUT|PATCH|DELETE) (/[^`\\s]*)`")
	// docParam and ginParam are a path parameter, whatever its name, as
	// the docs write it ({id}) and as documentedOps gives it (:id).
	docParam = regexp.MustCompile(`\{[^}]*\}`)
	ginParam = regexp.MustCompile(`:[^/]+`)
)

// docSection returns the text of doc's "## heading" section, up to the
// next "## " heading.
func docSection(t *testing.T, doc, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), doc))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q section", doc, "## "+heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return section
}

// luaFiles returns the Lua scripts under root, relative to it, testdata
// and hidden folders aside.
func luaFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && p != root) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".lua") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// scriptRow is a row of ARCHITECTURE's script table: | `dir/name.lua` | … |
var scriptRow = regexp.MustCompile("(?m)^\\| `([a-z/_]+\\.lua)` \\|")

// TestDocsLinks checks every relative link of README.md, docs/ and the
// README.md files beside the code: the file it names exists, and so does
// the heading its #fragment names.
func TestDocsLinks(t *testing.T) {
	root := moduleRoot(t)
	var docs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && p != root {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			docs = append(docs, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	links := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for _, target := range docLinks(string(b)) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			if err := checkLink(doc, target); err != "" {
				t.Errorf("%s links to %s: %s", rel, target, err)
			}
		}
	}
	if links < 20 {
		t.Fatalf("checked %d relative links; the docs were not found whole", links)
	}
}

// checkLink returns what is wrong with a relative link of the file doc, ""
// if nothing.
func checkLink(doc, target string) string {
	file, fragment, _ := strings.Cut(target, "#")
	linked := doc
	if file != "" {
		linked = filepath.Join(filepath.Dir(doc), filepath.FromSlash(file))
	}
	if _, err := os.Stat(linked); err != nil {
		return "it does not exist"
	}
	if fragment == "" {
		return ""
	}
	b, err := os.ReadFile(linked)
	if err != nil {
		return err.Error()
	}
	if !slices.Contains(headingAnchors(string(b)), fragment) {
		return "no heading there has the anchor #" + fragment
	}
	return ""
}

var (
	// mdLink is a Markdown link or image, [text](target); imgSrc an HTML
	// image's source.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	imgSrc = regexp.MustCompile(`<img src="([^"]+)"`)
	// codeSpan is inline code, where brackets are not links.
	codeSpan = regexp.MustCompile("`[^`\n]*`")
)

// docLinks returns the targets of a Markdown text's links, outside code.
func docLinks(text string) []string {
	var out []string
	for _, line := range proseLines(text) {
		line = codeSpan.ReplaceAllString(line, "")
		for _, re := range []*regexp.Regexp{mdLink, imgSrc} {
			for _, m := range re.FindAllStringSubmatch(line, -1) {
				out = append(out, m[1])
			}
		}
	}
	return out
}

// proseLines returns the lines of a Markdown text outside fenced code.
func proseLines(text string) []string {
	var out []string
	fenced := false
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives a Markdown text's
// headings: lower case, punctuation dropped, spaces as hyphens, and "-1",
// "-2" … after a repeated one.
func headingAnchors(text string) []string {
	var out []string
	seen := map[string]int{}
	for _, line := range proseLines(text) {
		title, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		title = strings.TrimLeft(title, "#")
		if !strings.HasPrefix(title, " ") {
			continue
		}
		var a strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(title)) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		anchor := a.String()
		if n := seen[anchor]; n > 0 {
			out = append(out, anchor+"-"+strconv.Itoa(n))
		} else {
			out = append(out, anchor)
		}
		seen[anchor]++
	}
	return out
}
