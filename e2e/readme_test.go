package e2e

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/allot-dev/allot/e2e/stack"
	balancerapp "github.com/allot-dev/allot/pkg/balancer/app"
	"github.com/allot-dev/allot/pkg/certs"
	enforcerapp "github.com/allot-dev/allot/pkg/enforcer/app"
)

// shBlocks returns the ```sh blocks of the README section that starts with heading, each
// as its command lines: continuation lines joined, comments and blank lines dropped.
func shBlocks(t *testing.T, readme, heading string) [][]string {
	t.Helper()
	var blocks [][]string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section(t, readme, heading), -1) {
		var lines []string
		joined := strings.ReplaceAll(m[1], "\\\n", " ")
		for _, l := range strings.Split(joined, "\n") {
			if k := strings.Index(l, " #"); k >= 0 {
				l = l[:k]
			}
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		blocks = append(blocks, lines)
	}
	return blocks
}

// section is the README's text under heading, to the next "## ".
func section(t *testing.T, readme, heading string) string {
	t.Helper()
	_, sec, ok := strings.Cut(readme, heading)
	if !ok {
		t.Fatalf("README has no %q", heading)
	}
	if j := strings.Index(sec, "\n## "); j >= 0 {
		sec = sec[:j]
	}
	return sec
}

// TestREADMEWalkthrough (issue 28, items 2 and 3) reads the README's walk-through as a
// user pastes it: every enforcer and balancer it starts parses (flags and config files
// valid), the admin/explain block's commands parse too, and the teardown stops what the
// walk-through started — every background process (they left six running) and every
// region's Redis Cluster and the etcd (they left eu-west's). It runs nothing (fast, and
// under -short too); TestREADMEWalkthroughRuns runs the walk-through's block.
func TestREADMEWalkthrough(t *testing.T) {
	root := stack.RepoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
	readme := string(raw)
	walk := shBlocks(t, readme, "## One enforcer stack per region")
	admin := shBlocks(t, readme, "## Changing limits: the admin CLI")
	if len(walk) == 0 || len(admin) == 0 {
		t.Fatalf("README: %d walk-through blocks, %d admin blocks", len(walk), len(admin))
	}
	started, lastStart, killAt := 0, -1, -1
	up, ever := map[string]bool{}, map[string]bool{}
	etcdUp, downAll := false, false
	var certs *certsLine // the walk-through's `bin/balancer certs` (issue 27 §1)
	for n, l := range walk[0] {
		args := strings.Fields(strings.TrimSuffix(l, "&"))
		switch {
		case len(args) > 1 && args[0] == "bin/balancer" && args[1] == "certs":
			certs = parseCerts(t, args[2:])
		case len(args) > 0 && (args[0] == "bin/enforcer" || args[0] == "bin/balancer"):
			files := parseStart(t, args)
			if certs == nil {
				t.Errorf("README: %s starts before `bin/balancer certs` made the certificates it names (%v)", l, files)
			} else {
				certs.check(t, l, files)
			}
			if strings.HasSuffix(l, "&") {
				started++
				lastStart = n
			}
		case strings.HasPrefix(l, "scripts/region.sh"):
			for _, cmd := range strings.Split(l, ";") {
				f := strings.Fields(cmd)
				switch {
				case len(f) >= 2 && f[1] == "etcd-up":
					etcdUp = true
				case len(f) >= 3 && f[1] == "up":
					up[f[2]], ever[f[2]] = true, true
				case len(f) >= 3 && f[1] == "down" && f[2] == "all":
					downAll = true
				case len(f) >= 3 && f[1] == "down":
					delete(up, f[2])
				case len(f) >= 2 && f[1] == "etcd-down":
					etcdUp = false
				}
			}
		case strings.HasPrefix(l, "kill $(jobs -p)"):
			killAt = n
		}
	}
	if started == 0 {
		t.Fatal("the walk-through starts no process")
	}
	if killAt < lastStart {
		t.Errorf("the walk-through starts %d processes in the background and its teardown does not stop them (kill $(jobs -p) after the last)", started)
	}
	// Every region the configs list is started: a listed region that never reports keeps
	// its default split of every limit (issue 28 item 1).
	for _, r := range []string{"us-east", "eu-west", "ap-south"} {
		if !ever[r] {
			t.Errorf("the walk-through does not start %s, which every configs/regions/*.yaml lists under regions:", r)
		}
	}
	if !downAll && (len(up) > 0 || etcdUp) {
		t.Errorf("the walk-through's teardown leaves regions %v (and etcd: %v) running", up, etcdUp)
	}
	adminStarts := 0
	for _, l := range admin[0] {
		if args := strings.Fields(strings.TrimSuffix(l, "&")); len(args) > 0 && (args[0] == "bin/enforcer" || args[0] == "bin/balancer") {
			if files := parseStart(t, args); certs != nil {
				certs.check(t, l, files)
			}
			adminStarts++
			if !strings.Contains(l, "-admin ") && !strings.Contains(l, "-explain ") {
				t.Errorf("the admin block starts %q without -admin or -explain", l)
			}
		}
	}
	if adminStarts < 2 {
		t.Errorf("the admin block shows how to start %d processes with the admin API or explain on, want the balancer and an enforcer", adminStarts)
	}
}

// parseStart parses a README command line that starts an enforcer or a balancer, as the
// binary would (config file, flags; no environment), and returns the report API's
// certificate files it names.
func parseStart(t *testing.T, args []string) []string {
	t.Helper()
	none := func(string) string { return "" }
	var err error
	var files []string
	switch args[0] {
	case "bin/enforcer":
		var c enforcerapp.Config
		c, err = enforcerapp.Parse(args[1:], none, io.Discard)
		files = []string{c.Balancer.TLS.CAFile, c.Balancer.TLS.CertFile, c.Balancer.TLS.KeyFile}
	case "bin/balancer":
		var c balancerapp.Config
		c, err = balancerapp.Parse(args[1:], none, io.Discard)
		files = []string{c.Listen.TLS.CertFile, c.Listen.TLS.KeyFile, c.Listen.TLS.ClientCAFile}
	}
	if err != nil {
		t.Errorf("README: %s: %v", strings.Join(args, " "), err)
	}
	return files
}

// certsLine is what a README `bin/balancer certs` line writes.
type certsLine struct {
	files map[string]bool
}

func parseCerts(t *testing.T, args []string) *certsLine {
	t.Helper()
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	dir := fs.String("dir", "bin/certs", "")
	regions := fs.String("regions", "us-east,eu-west,ap-south", "")
	fs.String("hosts", "", "")
	fs.Duration("validity", 0, "")
	fs.Bool("force", false, "")
	if err := fs.Parse(args); err != nil {
		t.Fatalf("README: bin/balancer certs %v: %v", args, err)
	}
	f := certs.Files{Dir: *dir}
	c := &certsLine{files: map[string]bool{f.CA(): true, f.Balancer(): true, f.BalancerKey(): true}}
	for _, r := range strings.Split(*regions, ",") {
		c.files[f.Enforcer(r)], c.files[f.EnforcerKey(r)] = true, true
	}
	return c
}

// check fails t unless every file is one the certs line wrote.
func (c *certsLine) check(t *testing.T, line string, files []string) {
	t.Helper()
	for _, f := range files {
		if !c.files[filepath.Clean(f)] {
			t.Errorf("README: %s names %q, which `bin/balancer certs` in the walk-through does not write", line, f)
		}
	}
}
