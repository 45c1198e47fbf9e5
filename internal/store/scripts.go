package store

import (
	"embed"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/luascript"
)

// scriptFiles holds every Lua script of the package, each beside the Go
// file of the same name that runs it.
//
//go:embed *.lua
var scriptFiles embed.FS

// script returns the script of file name.lua.
func script(name string) *redis.Script {
	src, err := scriptFiles.ReadFile(name + ".lua")
	if err != nil {
		panic("store: no script " + name) // embedded: a typo, caught by every test
	}
	return redis.NewScript(string(src))
}

// ScriptNames names each of the package's Lua scripts by its SHA1 in hex,
// the name EVALSHA calls it by, so metrics can tell the script calls apart.
func ScriptNames() map[string]string { return luascript.Names(scriptFiles) }
