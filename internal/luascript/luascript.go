// Package luascript names embedded Lua scripts by the SHA1 that EVALSHA
// calls them by, so a go-redis hook can tell script calls apart.
package luascript

import (
	"crypto/sha1"
	"encoding/hex"
	"io/fs"
	"strings"
)

// Names maps the SHA1 in hex of each *.lua file at the root of fsys to its
// name without the extension (deduct.lua is "deduct").
func Names(fsys fs.FS) map[string]string {
	names := map[string]string{}
	files, _ := fs.Glob(fsys, "*.lua") // the pattern is valid
	for _, f := range files {
		src, err := fs.ReadFile(fsys, f)
		if err != nil {
			continue // an embedded file cannot fail to read
		}
		sum := sha1.Sum(src)
		names[hex.EncodeToString(sum[:])] = strings.TrimSuffix(f, ".lua")
	}
	return names
}
