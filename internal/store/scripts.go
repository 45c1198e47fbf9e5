package store

import (
	"embed"
	"io/fs"
	"regexp"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// scriptFiles holds every Lua script of the package, each beside the Go
// file of the same name that runs it, and the prelude they share.
//
//go:embed *.lua
var scriptFiles embed.FS

// preludeFile is not a script: script puts it before each one.
const preludeFile = "prelude.lua"

// layouts holds the ARGV positions a script shares with its Go caller, by
// script name.
var layouts = map[string]luaLayout{"admit": admitLayout}

// script returns the script of file name.lua as the store sends it: the
// prelude's helpers it calls, the ARGV positions it shares with its caller
// (layouts), then the file. Its SHA1, the name EVALSHA calls it by, is of
// all of that.
func script(name string) *redis.Script {
	prelude, err1 := scriptFiles.ReadFile(preludeFile)
	src, err2 := scriptFiles.ReadFile(name + ".lua")
	if err1 != nil || err2 != nil || name+".lua" == preludeFile {
		panic("store: no script " + name) // embedded: a typo, caught by every test
	}
	return redis.NewScript(helpersFor(string(prelude), string(src)) + layouts[name].lua() + string(src))
}

var (
	helperName = regexp.MustCompile(`(?m)^local function ([A-Za-z_]\w*)`)
	luaComment = regexp.MustCompile(`--.*`)
)

// helpersFor returns the paragraphs of prelude that define a helper src
// calls, or one of those calls, in the prelude's order: every helper is a
// closure each call of the script makes, so a script gets only its own.
func helpersFor(prelude, src string) string {
	parts := strings.Split(prelude, "\n\n")
	used := make([]bool, len(parts))
	code := luaComment.ReplaceAllString(src, "")
	for added := true; added; {
		added = false
		for i, part := range parts {
			m := helperName.FindStringSubmatch(part)
			if !used[i] && m != nil && regexp.MustCompile(`\b`+m[1]+`\b`).MatchString(code) {
				used[i], added = true, true
				code += luaComment.ReplaceAllString(part, "")
			}
		}
	}
	var b strings.Builder
	for i, part := range parts {
		if used[i] {
			b.WriteString(strings.TrimSpace(part) + "\n\n")
		}
	}
	return b.String()
}

// scriptList names every script of the package.
func scriptList() []string {
	files, _ := fs.Glob(scriptFiles, "*.lua") // the pattern is valid
	names := make([]string, 0, len(files))
	for _, f := range files {
		if f != preludeFile {
			names = append(names, strings.TrimSuffix(f, ".lua"))
		}
	}
	return names
}

// ScriptNames names each of the package's Lua scripts by its SHA1 in hex,
// the name EVALSHA calls it by, so metrics can tell the script calls apart.
func ScriptNames() map[string]string {
	names := map[string]string{}
	for _, name := range scriptList() {
		names[script(name).Hash()] = name
	}
	return names
}

// A luaLayout names the ARGV positions a script and its Go caller share.
// The script gets each as a local of the name, declared before its file.
type luaLayout []struct {
	name  string
	value int
}

// lua declares l's names as Lua locals, "" when l is empty.
func (l luaLayout) lua() string {
	if len(l) == 0 {
		return ""
	}
	names, values := make([]string, len(l)), make([]string, len(l))
	for i, c := range l {
		names[i], values[i] = c.name, strconv.Itoa(c.value)
	}
	return "local " + strings.Join(names, ", ") + " = " + strings.Join(values, ", ") + "\n"
}
