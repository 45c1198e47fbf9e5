package main

import (
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/web"
)

// mountWeb serves the shopper page (package web) at / and its assets at
// /web/{file} on the public listener, the server's clock the page counts
// down with, and, in development mode with the development secret only, a
// route that mints shopper tokens.
func (s *system) mountWeb() {
	log := s.log.With("role", "gateway")
	files := web.Files()
	s.engine.GET("/", func(c *gin.Context) { serveWebFile(c, log, files, "index.html") })
	s.engine.GET("/web/:file", func(c *gin.Context) { serveWebFile(c, log, files, c.Param("file")) })
	s.engine.GET("/api/v1/time", func(c *gin.Context) {
		c.JSON(http.StatusOK, gin.H{"server_time": time.Now().UTC().Format(time.RFC3339Nano)})
	})
	if devTokens(s.cfg.Auth) {
		jwt := auth.NewJWT([]byte(s.cfg.Auth.JWTSecret), s.cfg.Auth.JWTLeeway)
		s.engine.GET(devTokenPath, func(c *gin.Context) { mintDevToken(c, log, jwt) })
	}
}

// devTokenPath mints shopper tokens in development mode.
const devTokenPath = "/api/v1/dev/token"

// devTokens reports whether the dev token route is served: like
// printDevTokens, only with the built-in development secret, which
// config.Validate refuses with real services.
func devTokens(a config.Auth) bool { return a.Dev && a.JWTSecret == config.DevJWTSecret }

func mintDevToken(c *gin.Context, log *slog.Logger, jwt *auth.JWT) {
	user := c.DefaultQuery("user", "alice")
	if reason := model.CheckUserID(user); reason != "" {
		httpapi.Abort(c, log, model.Invalid("user", reason))
		return
	}
	tok, err := jwt.Mint(user, 24*time.Hour)
	if err != nil {
		httpapi.Abort(c, log, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"token": tok, "user_id": user})
}

var webTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
}

// socketSources names the page's own host, on any port (a notifier may
// listen apart), for its WebSocket: older browsers' 'self' does not cover
// ws: and wss:, and no other host may be reached, so a link carrying
// ?ws=wss://elsewhere cannot send the shopper's token there. A Host that
// is not a plain name or IPv4 address adds nothing ('self' alone).
func socketSources(host string) string {
	name := host
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		name = host[:i]
	}
	if name == "" || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-')
	}) >= 0 {
		return ""
	}
	return " ws://" + name + ":* wss://" + name + ":*"
}

// serveWebFile writes one embedded file. The page loads only its own
// scripts: the policy keeps an injected one from running.
func serveWebFile(c *gin.Context, log *slog.Logger, files fs.FS, name string) {
	ctype, known := webTypes[path.Ext(name)]
	body, err := fs.ReadFile(files, name)
	if !known || errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
		httpapi.Abort(c, log, errNoRoute)
		return
	}
	if err != nil {
		httpapi.Abort(c, log, err)
		return
	}
	h := c.Writer.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self'"+socketSources(c.Request.Host)+"; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	// The files change with the binary: revalidating costs a round trip,
	// a stale flashsale.js after an upgrade could cost a sale.
	h.Set("Cache-Control", "no-cache")
	c.Data(http.StatusOK, ctype, body)
}
