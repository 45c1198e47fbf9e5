package main

import (
	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/web"
)

// mountConsole serves the admin console (web/admin) at /admin/ wherever the
// admin API is: the admin listener when http.admin_addr is set. The page
// itself is public; everything it shows comes from the admin API, with the
// token the operator signs in with.
func (s *system) mountConsole() {
	log := s.log.With("role", "gateway")
	files := web.Files()
	s.adminEngine.GET("/admin/", func(c *gin.Context) { serveWebFile(c, log, files, "admin/index.html") })
	s.adminEngine.GET("/admin/:file", func(c *gin.Context) { serveWebFile(c, log, files, "admin/"+c.Param("file")) })
}
