// Package web holds the shopper page, the browser client (flashsale.js)
// and the admin console (admin/), embedded in the binary so the gateway serves them with nothing to deploy
// beside it.
package web

import (
	"embed"
	"io/fs"
)

//go:embed *.html *.js *.css admin/*.html admin/*.js admin/*.css
var files embed.FS

// Files returns the page and its assets at the top level (index.html,
// flashsale.js, app.js, …), the console's under admin/.
func Files() fs.FS { return files }
