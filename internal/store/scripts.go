package store

import (
	"embed"

	"github.com/flashsale/flashsale/internal/luascript"
)

// scriptFiles holds every Lua script of the package, for ScriptNames; each
// is also embedded on its own beside the Go that runs it.
//
//go:embed *.lua
var scriptFiles embed.FS

// ScriptNames names each of the package's Lua scripts by its SHA1 in hex,
// the name EVALSHA calls it by, so metrics can tell the script calls apart.
func ScriptNames() map[string]string { return luascript.Names(scriptFiles) }
