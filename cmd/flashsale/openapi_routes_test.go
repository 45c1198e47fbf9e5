package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/openapi"
)

// documentedOp is one operation of the OpenAPI document: its method and
// path (gin's form, :param), the roles that serve it and its listener.
type documentedOp struct {
	method, path string
	roles        []string
	listener     string // public, admin or both
	// devOnly: served only in development mode with the development
	// secret (x-flashsale-dev-only), which real services refuse.
	devOnly bool
}

func (o documentedOp) route() string { return o.method + " " + o.path }

var pathParam = regexp.MustCompile(`\{([^}]+)\}`)

// documentedOps reads the operations of the embedded document.
func documentedOps(t *testing.T) []documentedOp {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openapi.Document(), &doc); err != nil {
		t.Fatalf("decode the document: %v", err)
	}
	var ops []documentedOp
	for path, item := range doc.Paths {
		for method, raw := range item {
			if method == "parameters" {
				continue
			}
			var op struct {
				Roles    []string `json:"x-flashsale-roles"`
				Listener string   `json:"x-flashsale-listener"`
				DevOnly  bool     `json:"x-flashsale-dev-only"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			if len(op.Roles) == 0 || !slices.Contains([]string{"public", "admin", "both"}, op.Listener) {
				t.Errorf("%s %s: x-flashsale-roles %v, x-flashsale-listener %q: want roles and public, admin or both",
					method, path, op.Roles, op.Listener)
			}
			ops = append(ops, documentedOp{method: strings.ToUpper(method), path: pathParam.ReplaceAllString(path, ":$1"),
				roles: op.Roles, listener: op.Listener, devOnly: op.DevOnly})
		}
	}
	return ops
}

// TestOpenAPIRoutes compares the document with the routes each role
// registers: every route gin serves is documented, and every documented
// operation is served, by the roles it names, on the listener it names
// (with http.admin_addr set; without it one listener serves them all).
func TestOpenAPIRoutes(t *testing.T) {
	ops := documentedOps(t)
	layouts := []struct {
		name      string
		roles     roleSet
		adminAddr bool
	}{
		{"serve", roleSet{gateway: true, worker: true, notifier: true}, false},
		{"serve with admin listener", roleSet{gateway: true, worker: true, notifier: true}, true},
		{"gateway", roleSet{gateway: true}, true},
		{"notifier", roleSet{notifier: true}, true},
		{"worker", roleSet{worker: true}, true},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			cfg := realConfig(t, "redisstream")
			if l.adminAddr {
				cfg.HTTP.AdminAddr = "127.0.0.1:0"
			}
			ctx, cancel := context.WithCancel(context.Background())
			sys, err := start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), l.roles)
			if err != nil {
				cancel()
				t.Fatalf("start: %v", err)
			}
			t.Cleanup(func() {
				cancel()
				if err := sys.Wait(); err != nil {
					t.Errorf("shutdown: %v", err)
				}
			})
			served := func(op documentedOp, listener string) bool {
				if op.devOnly && !devTokens(cfg.Auth) {
					return false
				}
				if !slices.ContainsFunc(op.roles, func(r string) bool { return runs(l.roles, r) }) {
					return false
				}
				return !l.adminAddr || op.listener == "both" || op.listener == listener
			}
			compareRoutes(t, "public listener", sys.engine, ops, func(op documentedOp) bool { return served(op, "public") })
			if l.adminAddr {
				compareRoutes(t, "admin listener", sys.adminEngine, ops, func(op documentedOp) bool { return served(op, "admin") })
			}
		})
	}
}

// compareRoutes checks that e serves exactly the operations of ops that
// want says it should.
func compareRoutes(t *testing.T, name string, e *gin.Engine, ops []documentedOp, want func(documentedOp) bool) {
	t.Helper()
	var got, wantRoutes []string
	for _, r := range e.Routes() {
		got = append(got, r.Method+" "+r.Path)
	}
	for _, op := range ops {
		if want(op) {
			wantRoutes = append(wantRoutes, op.route())
		}
	}
	slices.Sort(got)
	slices.Sort(wantRoutes)
	for _, r := range got {
		if !slices.Contains(wantRoutes, r) {
			t.Errorf("%s: %s is served but the OpenAPI document does not say so here", name, r)
		}
	}
	for _, r := range wantRoutes {
		if !slices.Contains(got, r) {
			t.Errorf("%s: %s is documented here but not served", name, r)
		}
	}
	if len(wantRoutes) == 0 {
		t.Errorf("%s: no route to compare", name)
	}
}

// runs reports whether roles include the role named name.
func runs(roles roleSet, name string) bool {
	return name == "gateway" && roles.gateway || name == "worker" && roles.worker || name == "notifier" && roles.notifier
}
