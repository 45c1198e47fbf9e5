// Package web holds the shopper page and the browser client (flashsale.js),
// embedded in the binary so the gateway serves them with nothing to deploy
// beside it.
package web

import (
	"embed"
	"io/fs"
)

//go:embed *.html *.js *.css
var files embed.FS

// Files returns the page and its assets, each at the top level
// (index.html, flashsale.js, app.js, …).
func Files() fs.FS { return files }
