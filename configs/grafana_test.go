package configs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dashboardExprs returns every PromQL expression of a Grafana dashboard, each with where it
// is (panel title, variable name): panel targets (rows' nested panels included) and query
// variables (label_values(metric, label) and query_result(expr) are unwrapped).
func dashboardExprs(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string                           `json:"uid"`
		Title      string                           `json:"title"`
		Panels     []grafanaPanel                   `json:"panels"`
		Templating struct{ List []grafanaVariable } `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Fatalf("%s: uid %q title %q: both are needed for provisioning", path, d.UID, d.Title)
	}
	out := map[string]string{}
	ids := map[int]string{}
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if other, dup := ids[p.ID]; dup {
				t.Errorf("%s: panels %q and %q share id %d", path, other, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", path, p.Title)
			}
			if p.Description == "" {
				t.Errorf("%s: panel %q has no description (say what it shows and what is healthy)", path, p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: panel %q: target %s has no expr", path, p.Title, tg.RefID)
					continue
				}
				out[tg.Expr] = fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := v.queryString()
		expr, ok := variableExpr(q)
		if !ok {
			t.Errorf("%s: variable %q: query %q is neither label_values(...) nor query_result(...)", path, v.Name, q)
			continue
		}
		if expr != "" {
			out[expr] = fmt.Sprintf("variable %q", v.Name)
		}
	}
	return out
}

type grafanaPanel struct {
	ID          int            `json:"id"`
	Type        string         `json:"type"`
	Title       string         `json:"title"`
	Description string         `json:"description"`
	Panels      []grafanaPanel `json:"panels"`
	Targets     []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

type grafanaVariable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"` // a string, or {"query": "...", ...}
}

func (v grafanaVariable) queryString() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct{ Query string }
	_ = json.Unmarshal(v.Query, &o)
	return o.Query
}

var (
	labelValuesRE = regexp.MustCompile(`^\s*label_values\(\s*(?:(.*),)?\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)
	queryResultRE = regexp.MustCompile(`^\s*query_result\((.*)\)\s*$`)
)

// variableExpr is the PromQL inside a Grafana variable query ("" for label_values(label)).
func variableExpr(q string) (string, bool) {
	if m := labelValuesRE.FindStringSubmatch(q); m != nil {
		return strings.TrimSpace(m[1]), true
	}
	if m := queryResultRE.FindStringSubmatch(q); m != nil {
		return m[1], true
	}
	return "", false
}

func TestVariableExpr(t *testing.T) {
	for q, want := range map[string]string{
		`label_values(allot_enforcer_rules, region)`:                      "allot_enforcer_rules",
		`label_values(allot_enforcer_rules{region=~"$region"}, instance)`: `allot_enforcer_rules{region=~"$region"}`,
		`label_values(region)`:                                            "",
		`query_result(topk(5, m))`:                                        "topk(5, m)",
	} {
		if got, ok := variableExpr(q); !ok || got != want {
			t.Errorf("%s: got %q %v, want %q", q, got, ok, want)
		}
	}
	if _, ok := variableExpr(`up`); ok {
		t.Error("a bare expression is not a variable query")
	}
}

// checkExprs fails for every expression that names no metric, or one the catalogue lacks.
func checkExprs(t *testing.T, file string, exprs map[string]string, known catalogue) {
	t.Helper()
	for expr, where := range exprs {
		names, err := metricNames(expr)
		if err != nil {
			t.Errorf("%s: %s: %v", file, where, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: %s: %q names no metric", file, where, expr)
		}
		for _, n := range names {
			if _, ok := known[n]; !ok {
				t.Errorf("%s: %s: %q is not a metric any process registers (nor a recorded rule)\n  expr: %s",
					file, where, n, expr)
			}
		}
	}
}

func TestDashboardNamesOnlyRegisteredMetrics(t *testing.T) {
	known := processes(t)
	for n, from := range recordedNames(t) {
		known[n] = from
	}
	files, err := filepath.Glob("grafana/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards under configs/grafana (%v)", err)
	}
	for _, f := range files {
		exprs := dashboardExprs(t, f)
		if len(exprs) < 10 {
			t.Errorf("%s: only %d expressions found; is the dashboard read right?", f, len(exprs))
		}
		checkExprs(t, f, exprs, known)
	}
}
