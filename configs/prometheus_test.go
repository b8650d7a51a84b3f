package configs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

const rulesFile = "prometheus/allot-rules.yaml"

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(raw, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rf
}

// recordedNames are the series the rules file records: the dashboard may use them.
func recordedNames(t *testing.T) catalogue {
	c := catalogue{}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				c[r.Record] = rulesFile
			}
		}
	}
	return c
}

// The rules' expressions name only registered metrics, and every alert says what it is
// and what to do.
func TestAlertRulesNameOnlyRegisteredMetrics(t *testing.T) {
	known := processes(t)
	for n, from := range recordedNames(t) {
		known[n] = from
	}
	exprs := map[string]string{}
	alerts := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			exprs[r.Expr] = fmt.Sprintf("group %s rule %s", g.Name, name)
			if r.Alert == "" {
				continue
			}
			alerts++
			if r.Labels["severity"] == "" {
				t.Errorf("%s: alert %s has no severity label", rulesFile, name)
			}
			if r.For == "" {
				t.Errorf("%s: alert %s has no for: (one bad scrape would page)", rulesFile, name)
			}
			if len(r.Annotations["summary"]) < 20 || len(r.Annotations["description"]) < 200 {
				t.Errorf("%s: alert %s needs a summary and a runbook-style description (what it means, what to do)", rulesFile, name)
			}
		}
	}
	if alerts == 0 {
		t.Fatalf("%s: no alerts", rulesFile)
	}
	checkExprs(t, rulesFile, exprs, known)
}

// promtool returns the path of promtool, installed by scripts/tools.sh when missing (not
// under -short: unit-test runs install nothing). Without it the test skips, except under
// CI=true where it fails.
func promtool(t *testing.T) string {
	t.Helper()
	if testing.Short() && os.Getenv("CI") != "true" {
		if p, err := exec.LookPath("promtool"); err == nil {
			return p
		}
		t.Skip("promtool is not installed; without -short the test installs it (scripts/tools.sh promtool)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", "../scripts/tools.sh", "promtool")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := fmt.Sprintf("promtool not available (scripts/tools.sh promtool: %v):\n%s", err, lastLines(stderr.String(), 20))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return strings.TrimSpace(string(out))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func runPromtool(t *testing.T, bin string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

func TestPromtoolCheck(t *testing.T) {
	bin := promtool(t)
	runPromtool(t, bin, "check", "rules", rulesFile)
	runPromtool(t, bin, "check", "config", "prometheus/prometheus.yml")
}

func TestPromtoolTestRules(t *testing.T) {
	bin := promtool(t)
	files, err := filepath.Glob("prometheus/*.test.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests under configs/prometheus (%v)", err)
	}
	rf := readRules(t)
	annotations := map[string]map[string]string{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				annotations[r.Alert] = r.Annotations
			}
		}
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	abs, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range files {
		filled, err := fillAnnotations(f, abs, annotations, fires, quiet)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		tmp := filepath.Join(dir, filepath.Base(f))
		if err := os.WriteFile(tmp, filled, 0o644); err != nil {
			t.Fatal(err)
		}
		runPromtool(t, bin, "test", "rules", tmp)
	}
	for alert := range annotations {
		if !fires[alert] || !quiet[alert] {
			t.Errorf("alert %s: promtool tests with series that fire: %v, that don't: %v; want both", alert, fires[alert], quiet[alert])
		}
	}
}

var labelRef = regexp.MustCompile(`\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// render expands an annotation template the way Prometheus does for the references it
// allows here ({{ $labels.x }}); anything else is an error, so expectations stay exact.
func render(tmpl string, labels map[string]string) (string, error) {
	var missing []string
	out := labelRef.ReplaceAllStringFunc(tmpl, func(m string) string {
		name := labelRef.FindStringSubmatch(m)[1]
		v, ok := labels[name]
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("annotation uses labels %q the alert does not have", missing)
	}
	if strings.Contains(out, "{{") {
		return "", fmt.Errorf("annotation %q uses a template other than {{ $labels.x }}", tmpl)
	}
	return out, nil
}

// fillAnnotations rewrites a promtool test file: rule_files point at rules (absolute), and
// every expected alert without exp_annotations gets its rule's annotations rendered with its
// labels. It notes which alerts have a test that fires (fires) and one that does not (quiet).
func fillAnnotations(path, rules string, annotations map[string]map[string]string, fires, quiet map[string]bool) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	root := doc.Content[0]
	if rf := mapValue(root, "rule_files"); rf != nil {
		rf.Content = []*yaml.Node{{Kind: yaml.ScalarNode, Value: rules}}
	}
	tests := mapValue(root, "tests")
	if tests == nil {
		return nil, fmt.Errorf("no tests")
	}
	for _, tc := range tests.Content {
		for _, at := range seq(mapValue(tc, "alert_rule_test")) {
			name := scalar(mapValue(at, "alertname"))
			ann, ok := annotations[name]
			if !ok {
				return nil, fmt.Errorf("test of %q: no such alert in %s", name, rules)
			}
			exp := seq(mapValue(at, "exp_alerts"))
			if len(exp) == 0 {
				quiet[name] = true
			} else {
				fires[name] = true
			}
			for _, ea := range exp {
				if mapValue(ea, "exp_annotations") != nil {
					continue
				}
				labels := map[string]string{}
				if err := mapValue(ea, "exp_labels").Decode(&labels); err != nil {
					return nil, fmt.Errorf("test of %q: exp_labels: %v", name, err)
				}
				m := &yaml.Node{Kind: yaml.MappingNode}
				for k, v := range ann {
					s, err := render(v, labels)
					if err != nil {
						return nil, fmt.Errorf("alert %s annotation %s: %v", name, k, err)
					}
					m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, &yaml.Node{Kind: yaml.ScalarNode, Value: s})
				}
				ea.Content = append(ea.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "exp_annotations"}, m)
			}
		}
	}
	return yaml.Marshal(&doc)
}

func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func seq(n *yaml.Node) []*yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	return n.Content
}

func scalar(n *yaml.Node) string {
	if n == nil {
		return ""
	}
	return n.Value
}

func TestRender(t *testing.T) {
	got, err := render("{{ $labels.instance }} in {{$labels.region}}", map[string]string{"instance": "e1", "region": "us-east"})
	if err != nil || got != "e1 in us-east" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := render("{{ $labels.shard }}", map[string]string{}); err == nil {
		t.Error("a label the alert lacks must be an error")
	}
	if _, err := render("{{ $value | humanize }}", nil); err == nil {
		t.Error("a template other than $labels must be an error")
	}
}
