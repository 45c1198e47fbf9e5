// Package openapi holds the OpenAPI 3.1 document of flashsale's HTTP API:
// the gateway's and the notifier's routes and every role's operations
// endpoints, embedded in the binary. Both the gateway and the notifier serve
// the whole document (cmd/flashsale mounts Serve at Path); each operation
// names the roles that serve it in x-flashsale-roles. cmd/flashsale's
// TestOpenAPIRoutes and TestOpenAPIResponses keep it equal to the server.
package openapi

import (
	_ "embed"
	"net/http"

	"github.com/gin-gonic/gin"
)

// Path is where the document is served.
const Path = "/openapi.json"

// document is a string so that nothing can change it once embedded.
//
//go:embed openapi.json
var document string

// Document returns the document's JSON.
func Document() []byte { return []byte(document) }

// Serve answers with the document.
func Serve(c *gin.Context) {
	c.Header("Content-Type", "application/json")
	c.Status(http.StatusOK)
	_, _ = c.Writer.WriteString(document)
}
