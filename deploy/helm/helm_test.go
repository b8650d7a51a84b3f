package helm

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.yaml from helm template")

// chartDir is the chart, relative to this package.
const chartDir = "allot"

// regions are the regions the chart ships a values file for (configs/regions/ has a config
// for each: TestChartRegionsAreTheShippedOnes).
var regions = []string{"us-east", "eu-west", "ap-south"}

// renderCase is one `helm template` of the chart: a region's values file, and more --set.
type renderCase struct {
	name   string // testdata/<name>.yaml
	region string
	set    []string
}

// renderCases are each region as shipped, and us-east with everything optional turned on
// (the monitoring objects, the admin API, explain, the dashboard's tokens).
var renderCases = func() []renderCase {
	var cs []renderCase
	for _, r := range regions {
		cs = append(cs, renderCase{name: r, region: r})
	}
	return append(cs, renderCase{name: "us-east-all-on", region: "us-east", set: []string{
		"metrics.serviceMonitor.enabled=true",
		"metrics.prometheusRule.enabled=true",
		"grafanaDashboard.enabled=true",
		"enforcer.autoscaling.enabled=false",
		"enforcer.replicas=3",
		"enforcer.config.explain.enabled=true",
		"enforcer.secretEnv.ALLOT_ADMIN_TOKENS.name=allot-admin-tokens",
		"enforcer.secretEnv.ALLOT_ADMIN_TOKENS.key=tokens",
		"balancer.config.admin.enabled=true",
		"balancer.secretEnv.ALLOT_ADMIN_TOKENS.name=allot-admin-tokens",
		"balancer.secretEnv.ALLOT_ADMIN_TOKENS.key=tokens",
		"balancer.replicas=3",
	}})
}()

func (c renderCase) args() []string {
	a := []string{"template", "allot-" + c.region, chartDir, "--namespace", "allot",
		"-f", filepath.Join(chartDir, "values-"+c.region+".yaml")}
	for _, s := range c.set {
		a = append(a, "--set", s)
	}
	return a
}

var helmOnce struct {
	sync.Once
	path string
	err  error
	log  string
}

// helm returns the path of helm, built by scripts/helm.sh when missing (not under -short:
// unit-test runs build nothing). Without it the test skips, except under CI=true where it
// fails.
func helm(t *testing.T) string {
	t.Helper()
	ci := os.Getenv("CI") == "true"
	if testing.Short() && !ci {
		if p := "../../bin/tools/helm"; fileExists(p) {
			return p
		}
		t.Skip("helm is not built; without -short the test builds it (scripts/helm.sh)")
	}
	helmOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "bash", "../../scripts/helm.sh")
		cmd.Stderr = &stderr
		start := time.Now()
		out, err := cmd.Output()
		helmOnce.path, helmOnce.err = strings.TrimSpace(string(out)), err
		helmOnce.log = fmt.Sprintf("scripts/helm.sh (%v): %s", time.Since(start).Round(time.Second), lastLines(stderr.String(), 20))
	})
	if helmOnce.err != nil {
		msg := fmt.Sprintf("helm not available (%v): %s", helmOnce.err, helmOnce.log)
		if ci {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return helmOnce.path
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runHelm runs helm with args in this directory and returns its standard output.
func runHelm(t *testing.T, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, helm(t), args...)
	cmd.Stderr = &stderr
	// Helm keeps no state of its own here: its caches and config go to a temporary home.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// render is `helm template` of c.
func render(t *testing.T, c renderCase) []byte {
	t.Helper()
	return runHelm(t, c.args()...)
}

// The chart passes helm lint, strict (warnings fail), with every region's values.
func TestChartLint(t *testing.T) {
	for _, c := range renderCases {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir, "-f", filepath.Join(chartDir, "values-"+c.region+".yaml")}
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			out := runHelm(t, args...)
			if !bytes.Contains(out, []byte("1 chart(s) linted, 0 chart(s) failed")) {
				t.Errorf("helm lint: %s", out)
			}
		})
	}
}

// Without a region's values the chart refuses to render, naming what is missing.
func TestChartNeedsARegion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, helm(t), "template", "allot", chartDir).CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("enforcer.config.region is required")) {
		t.Fatalf("helm template without a region: %v\n%s", err, out)
	}
}

// helm template of each case equals its golden file (-update rewrites them).
func TestTemplateGolden(t *testing.T) {
	for _, c := range renderCases {
		t.Run(c.name, func(t *testing.T) {
			got := render(t, c)
			golden := filepath.Join("testdata", c.name+".yaml")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./deploy/helm/ -run TestTemplateGolden -update writes it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("helm %s differs from %s (-update rewrites it after a deliberate change):\n%s",
					strings.Join(c.args(), " "), golden, firstDiff(string(want), string(got)))
			}
		})
	}
}

// firstDiff shows the first line where want and got differ, with a little context.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  golden:   %q\n  rendered: %q", i+1, wl, gl)
		}
	}
	return "(no line differs)"
}
