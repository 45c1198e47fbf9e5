package deploycheck

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const (
	alertsFile    = "../../deploy/prometheus/alerts.yml"
	dashboardFile = "../../deploy/grafana/flashsale.json"
)

// TestAlertRules: the rules file loads as Prometheus loads it (unknown keys
// refused, every expression parsed, every template checked), and has at
// least one alert.
func TestAlertRules(t *testing.T) {
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, err := range errs {
		t.Errorf("%v", err)
	}
	if groups == nil {
		return
	}
	alerts := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts++
				if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
					t.Errorf("alert %s: want a severity label and a summary", r.Alert)
				}
			}
		}
	}
	if alerts == 0 {
		t.Errorf("%s: no alert", alertsFile)
	}
}

// grafanaVariable is a dashboard variable reference: $name or ${name}.
var grafanaVariable = regexp.MustCompile(`\$\{?(\w+)\}?`)

// promQL replaces the dashboard's variables with what Grafana would put
// there: a duration for the intervals, a value for the rest (they only
// appear inside label matchers).
func promQL(expr string) string {
	return grafanaVariable.ReplaceAllStringFunc(expr, func(v string) string {
		switch strings.Trim(v, "${}") {
		case "__rate_interval", "__interval", "__range":
			return "5m"
		}
		return "x"
	})
}

// TestDashboardQueries: every panel query of the dashboard, and every
// variable's label_values query, is valid PromQL.
func TestDashboardQueries(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	p := parser.NewParser(parser.Options{})
	n := 0
	for _, panel := range d.Panels {
		for _, q := range panel.Targets {
			n++
			if _, err := p.ParseExpr(promQL(q.Expr)); err != nil {
				t.Errorf("panel %q: %q: %v", panel.Title, q.Expr, err)
			}
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, v.Definition)
			continue
		}
		if _, err := p.ParseExpr(promQL(m[1])); err != nil {
			t.Errorf("variable %s: %q: %v", v.Name, m[1], err)
		}
	}
	if n == 0 {
		t.Errorf("%s: no query", dashboardFile)
	}
}
