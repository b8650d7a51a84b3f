package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// layers is the house's structure, bottom up (docs/design.md §4 draws the same table): a
// package imports only packages of a lower layer, so no import runs back up, and the two
// sides stay apart — nothing under pkg/enforcer imports pkg/balancer, nor the reverse;
// only regionsim, the in-process stack and the commands hold both. A new package must be
// given a layer here and a line in README.md's package table and docs/design.md §4.
var layers = [][]string{
	// 0: leaves: time, certificates, the contract between the processes, the pure policy.
	{"pkg/clock", "pkg/certs", "pkg/tlsfiles", "pkg/adminauth", "pkg/contract", "pkg/share",
		"proto/allot/v1", "pkg/sim/scenario", "pkg/loadgen", "pkg/routine", "pkg/testenv/poll", "pkg/version",
		"pkg/tracing"},
	// 1: primitives over the leaves.
	{"pkg/bucket", "pkg/cliconf", "pkg/appkit", "pkg/etcdwatch", "pkg/testenv", "pkg/envoyrl"},
	// 2: mechanisms: the rules, the layers over a bucket store, membership.
	{"pkg/rules", "pkg/quota", "pkg/lease", "pkg/fallback", "pkg/registry", "pkg/bucket/buckettest", "pkg/envoyrl/xds"},
	// 3: each side's core.
	{"pkg/enforcer", "pkg/enforcer/overrides", "pkg/enforcer/report", "pkg/balancer"},
	// 4: what is built on a core: the node's composition, front ends, admin, dashboard.
	{"pkg/aggregator", "pkg/enforcer/node", "pkg/enforcer/grpcapi", "pkg/enforcer/httpapi", "pkg/enforcer/enforcertest",
		"pkg/balancer/admin", "pkg/balancer/dashboard"},
	// 5: processes and the simulator.
	{"pkg/enforcer/app", "pkg/balancer/app", "pkg/sim"},
	// 6: a whole deployment in one process; the test stacks.
	{"pkg/inprocess", "e2e/stack"},
	// 7: commands and whole-house tests.
	{"cmd/enforcer", "cmd/balancer", "cmd/regionsim", "e2e/stackup", "configs", "e2e", "deploy/helm"},
}

func TestImportsRunDown(t *testing.T) {
	const mod = "github.com/allot-dev/allot/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	layer := map[string]int{}
	for i, ps := range layers {
		for _, p := range ps {
			layer[p] = i
		}
	}
	side := func(p string) string {
		switch {
		case strings.HasPrefix(p, "pkg/enforcer"):
			return "enforcer"
		case strings.HasPrefix(p, "pkg/balancer"):
			return "balancer"
		}
		return ""
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	design, err := os.ReadFile("../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		p := strings.TrimPrefix(f[0], mod)
		seen[p] = true
		for doc, text := range map[string][]byte{"README.md's package table": readme, "docs/design.md §4": design} {
			if !strings.Contains(string(text), "`"+p+"`") {
				t.Errorf("%s does not list %s", doc, p)
			}
		}
		lp, ok := layer[p]
		if !ok {
			t.Errorf("%s has no layer: add it to layers (and to docs/design.md §4)", p)
			continue
		}
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			q := strings.TrimPrefix(imp, mod)
			lq, ok := layer[q]
			if ok && lq >= lp {
				t.Errorf("%s (layer %d) imports %s (layer %d): imports must run down", p, lp, q, lq)
			}
			if s, r := side(p), side(q); s != "" && r != "" && s != r {
				t.Errorf("%s imports %s: the enforcer and the balancer sides do not import each other", p, q)
			}
		}
	}
	for p := range layer {
		if !seen[p] {
			t.Errorf("layers names %s, which is not a package", p)
		}
	}
}
