// Command benchhello is the ceiling of .ci/bench.sh: a bare gin handler
// answering "hello", served like the gateway (gin release mode, net/http),
// with no middleware. Every gateway stage is reported as a share of what this
// reaches on the same machine under the same load generator.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/gin-gonic/gin"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18090", "listen address")
	flag.Parse()
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	hello := func(c *gin.Context) { c.String(http.StatusOK, "hello") }
	// The load generator sends the gateway's purchase request to the same
	// route shape, so the ceiling parses and routes the same bytes.
	e.POST("/api/v1/campaigns/:id/purchases", hello)
	log.Fatal(http.ListenAndServe(*addr, e))
}
