package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
	balancerapp "github.com/allot-dev/allot/pkg/balancer/app"
	enforcerapp "github.com/allot-dev/allot/pkg/enforcer/app"
	"github.com/allot-dev/allot/pkg/testenv"
)

// What the walk-through's comments state, checked against what its lines print.
const (
	readmePeers  = 2                // `curl -s localhost:8080/metrics | grep '^allot_registry_peers'  # 2: …`
	readmeLeader = "127.0.0.1:9091" // `bin/balancer … -id balancer-1 &  # leads`, and the curl of its /metrics
)

// TestREADMEWalkthroughRuns (issue 28) runs the README's walk-through, the block's own
// lines in one bash as a user pastes them, and checks each number the section states: the
// check answers 200 with RateLimit headers, us-east's enforcers count 2 peers, the balancer
// on 127.0.0.1:9091 leads (1) and the other stands by (0), the dashboard URL answers,
// after `kill $(jobs -p); wait` every enforcer and balancer has logged "stopped" within its
// drain_timeout + etcd.write_timeout (each one's time is measured), and after
// `scripts/region.sh down all` no container of the run is left.
//
// The lines use fixed ports (etcd 2379, Redis 7001-7203, enforcers 8080…, balancers 9090…),
// so they run in a network namespace of the test's own: a container that only sleeps,
// with --network none; region.sh's containers join it (ALLOT_REGION_NETWORK) and the bash
// enters it with nsenter, keeping this host's filesystem and Docker. The files are a copy
// (configs/, scripts/, bin/ built here), so the certificates the walk-through writes go
// to a temporary bin/certs, not the repository's. Between the README's lines the test
// waits, bounded, for what a user pasting line by line would see: each process ready,
// balancer-1 leading before balancer-2 starts (started together either may win), the
// peer count settled before the one-shot curl of it. `make images build` is the test's
// own build. Needs root (nsenter) and Docker; skipped under -short.
func TestREADMEWalkthroughRuns(t *testing.T) {
	testenv.Require(t)
	root := stack.RepoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const heading = "## One enforcer stack per region"
	blocks := shBlocks(t, string(raw), heading)
	if len(blocks) == 0 {
		t.Fatal("README: the walk-through has no ```sh block")
	}
	dashboards := regexp.MustCompile(`http://127\.0\.0\.1:\d+/dashboard/`).FindAllString(section(t, string(raw), heading), -1)
	if len(dashboards) == 0 {
		t.Error("README: the walk-through names no dashboard URL")
	}

	dir := walkDir(t, root)
	t.Chdir(dir) // the start lines' config files, as the shell reads them
	ns := newNetns(t)
	sh := ns.shell(t, dir)
	w := &walkthrough{t: t, ns: ns, sh: sh, dashboardURLs: dashboards}
	for _, l := range blocks[0] {
		w.line(l)
	}
	if !w.dashboards {
		t.Error("README: the walk-through never curls allot_balancer_leader, after which its dashboard is checked")
	}
	if !w.killed {
		t.Error("README: the walk-through never runs `kill $(jobs -p); wait`")
	}
	if !w.down {
		t.Error("README: the walk-through never runs `scripts/region.sh down all`")
	}
}

// walkthrough runs the README's lines one by one and checks what each shows.
type walkthrough struct {
	t      *testing.T
	ns     *netns
	sh     *walkShell
	procs  []*walkProc
	leader string // HTTP address of the balancer that leads

	dashboardURLs []string // the section's http://127.0.0.1:…/dashboard/
	dashboards    bool     // checked, while the balancers run
	killed        bool     // `kill $(jobs -p); wait` ran
	down          bool     // `scripts/region.sh down all` ran
}

// walkProc is one enforcer or balancer the walk-through starts in the background.
type walkProc struct {
	kind, id, http string
	bound          time.Duration // drain_timeout + etcd.write_timeout
	pid            int
}

// stepTimeout bounds a line that is not the teardown (region.sh bounds its own waits at
// 30 s); readyTimeout a process becoming ready and the numbers settling.
const (
	stepTimeout  = 60 * time.Second
	readyTimeout = 30 * time.Second
)

func (w *walkthrough) line(l string) {
	t := w.t
	args := strings.Fields(strings.TrimSuffix(l, "&"))
	switch {
	case strings.HasPrefix(l, "make "):
		if l != "make images build" {
			t.Fatalf("README: the walk-through runs %q; the test knows `make images build` (it builds bin/ itself and testenv.Require the image)", l)
		}
		t.Logf("walk: %s: done by the test (go build into bin/, and the base image)", l)
	case strings.HasPrefix(l, "kill $(jobs -p)"):
		w.teardown(l)
	case len(args) > 0 && (args[0] == "bin/enforcer" || args[0] == "bin/balancer") && strings.HasSuffix(l, "&"):
		p := w.parse(l, args)
		w.run(l, stepTimeout)
		w.procs = append(w.procs, p)
		w.ready(p)
	case strings.Contains(l, "/v1/check"):
		out := w.run(l, stepTimeout)
		for _, want := range []string{`(?m)^HTTP/1\.1 200 `, `(?mi)^RateLimit: `, `(?mi)^RateLimit-Policy: `, `"allowed":true`} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("walk: %s: no %s in\n%s", l, want, out)
			}
		}
	case strings.Contains(l, "allot_registry_peers"):
		addr := w.curlAddr(l)
		want := fmt.Sprintf("allot_registry_peers %d", readmePeers)
		w.settle(addr, want)
		if out := w.run(l, stepTimeout); !hasLine(out, want) {
			t.Errorf("walk: %s printed %q, the README says %d", l, out, readmePeers)
		}
	case strings.Contains(l, "allot_balancer_leader"):
		addr := w.curlAddr(l)
		if addr != w.leader {
			t.Errorf("walk: %s asks %s; the balancer that leads is %s", l, addr, w.leader)
		}
		if out := w.run(l, stepTimeout); !hasLine(out, "allot_balancer_leader 1") {
			t.Errorf("walk: %s printed %q, the README says 1 on the leader", l, out)
		}
		for _, p := range w.procs {
			if p.kind == "balancer" && p.http != w.leader {
				w.settle(p.http, "allot_balancer_leader 0")
			}
		}
		for _, u := range w.dashboardURLs { // "its dashboard: http://127.0.0.1:9091/dashboard/"
			code, body, err := w.ns.get(u)
			if err != nil || code != 200 || !strings.Contains(body, "<title>allot balancer") || strings.Contains(body, "standby</title>") {
				t.Errorf("walk: the README's dashboard %s: %d, %v, %.200q (want the leader's page)", u, code, err, body)
			}
		}
		w.dashboards = true
	case strings.HasPrefix(l, "scripts/region.sh down all"):
		w.run(l, stepTimeout)
		w.down = true
		if left := w.ns.containers(t); len(left) > 0 {
			t.Errorf("walk: after %s these containers of the run are left: %v", l, left)
		}
	default:
		w.run(l, stepTimeout)
	}
}

// run runs one line and fails t unless it exits 0; it returns what it printed.
func (w *walkthrough) run(l string, timeout time.Duration) string {
	w.t.Helper()
	out, status, took := w.sh.step(w.t, l, timeout)
	w.t.Logf("walk: %5.1fs  %s", took.Seconds(), l)
	if out != "" {
		w.t.Logf("walk:         %s", strings.ReplaceAll(out, "\n", "\n\t\t"))
	}
	if status != 0 {
		w.t.Fatalf("walk: %s exited %d:\n%s\n%s", l, status, out, w.sh.logTail(40))
	}
	return out
}

// parse reads a start line as the binary will (and as TestREADMEWalkthrough does).
func (w *walkthrough) parse(l string, args []string) *walkProc {
	t := w.t
	t.Helper()
	p := &walkProc{kind: strings.TrimPrefix(args[0], "bin/")}
	none := func(string) string { return "" }
	switch p.kind {
	case "enforcer":
		c, err := enforcerapp.Parse(args[1:], none, io.Discard)
		if err != nil {
			t.Fatalf("walk: %s: %v", l, err)
		}
		p.id, p.http, p.bound = c.ID, c.Listen.HTTP, c.DrainTimeout
	case "balancer":
		c, err := balancerapp.Parse(args[1:], none, io.Discard)
		if err != nil {
			t.Fatalf("walk: %s: %v", l, err)
		}
		p.id, p.http, p.bound = c.ID, c.Listen.HTTP, c.DrainTimeout+c.Etcd.WriteTimeout
	}
	if p.http == "" {
		t.Fatalf("walk: %s has no HTTP address to find it ready by", l)
	}
	return p
}

// ready waits, bounded, for p's /readyz; the first balancer also to lead ("# leads").
func (w *walkthrough) ready(p *walkProc) {
	t := w.t
	t.Helper()
	want := "ready"
	if p.kind == "balancer" && w.leader == "" {
		want = "ready: leader"
	}
	start := time.Now()
	ok, last := poll(readyTimeout, func() (bool, string) {
		code, body, err := w.ns.get("http://" + p.http + "/readyz")
		return err == nil && code == 200 && strings.HasPrefix(body, want), fmt.Sprintf("%d %q %v", code, body, err)
	})
	if !ok {
		t.Fatalf("walk: %s %s not %q within %v: /readyz %s\n%s", p.kind, p.id, want, readyTimeout, last, w.sh.logTail(40))
	}
	if want == "ready: leader" {
		w.leader = p.http
		if p.http != readmeLeader {
			t.Errorf("walk: the first balancer (%s) serves on %s, the README's leader is %s", p.id, p.http, readmeLeader)
		}
	}
	t.Logf("walk: %5.1fs  (%s %s %s)", time.Since(start).Seconds(), p.kind, p.id, strings.TrimSpace(last))
}

// settle waits, bounded, until addr's /metrics has the line want.
func (w *walkthrough) settle(addr, want string) {
	w.t.Helper()
	ok, last := poll(readyTimeout, func() (bool, string) {
		code, body, err := w.ns.get("http://" + addr + "/metrics")
		return err == nil && code == 200 && hasLine(body, want), fmt.Sprintf("%d %v %q", code, err, metricLines(body, strings.Fields(want)[0]))
	})
	if !ok {
		w.t.Errorf("walk: %s/metrics has no %q within %v: %s", addr, want, readyTimeout, last)
	}
}

// curlAddr is the host:port a curl line asks, in the started processes' terms.
func (w *walkthrough) curlAddr(l string) string {
	w.t.Helper()
	m := regexp.MustCompile(`(localhost|127\.0\.0\.1):(\d+)/`).FindStringSubmatch(l)
	if m == nil {
		w.t.Fatalf("walk: %s: no address", l)
	}
	return "127.0.0.1:" + m[2]
}

// teardown runs the README's `kill $(jobs -p); wait` and measures when each process
// exited: all must have been running, each must log "stopped" and go within its bound.
func (w *walkthrough) teardown(l string) {
	t := w.t
	t.Helper()
	jobs := w.run("jobs -l", stepTimeout) // the test's, not the README's: which pid is which
	var bound time.Duration
	for _, p := range w.procs {
		for _, m := range jobLine.FindAllStringSubmatch(jobs, -1) { // [1]+ 4242 Running   bin/enforcer …
			f := strings.Fields(m[3])
			if i := slices.Index(f, "-id"); m[2] == "Running" && i >= 0 && i+1 < len(f) && f[i+1] == p.id {
				p.pid, _ = strconv.Atoi(m[1])
			}
		}
		if p.pid == 0 {
			t.Errorf("walk: %s %s is not running before the teardown (jobs -l:\n%s)", p.kind, p.id, jobs)
		}
		bound = max(bound, p.bound)
	}
	stopped := make(chan map[int]time.Duration, 1)
	start := time.Now()
	go func() { stopped <- watchExits(w.procs, start, bound+15*time.Second) }()
	w.run(l, bound+15*time.Second)
	took := <-stopped
	w.killed = true
	log := w.sh.logTail(0)
	for _, p := range w.procs {
		if p.pid == 0 {
			continue
		}
		d, ok := took[p.pid]
		switch {
		case !ok:
			t.Errorf("walk: %s %s (pid %d) still running after %s", p.kind, p.id, p.pid, l)
		case d > p.bound:
			t.Errorf("walk: %s %s stopped %.1fs after the kill, the README says within %v", p.kind, p.id, d.Seconds(), p.bound)
		default:
			t.Logf("walk: %s %s stopped %.2fs after the kill (bound %v)", p.kind, p.id, d.Seconds(), p.bound)
		}
		if !regexp.MustCompile(`(?m)\bstopped: .*\bid=` + regexp.QuoteMeta(p.id) + `$`).MatchString(log) {
			t.Errorf("walk: %s %s never logged \"stopped\" (a clean stop)", p.kind, p.id)
		}
	}
	if strings.Contains(log, "drain cut short") {
		t.Errorf("walk: a drain was cut short:\n%s", w.sh.logTail(40))
	}
}

var jobLine = regexp.MustCompile(`(?m)^\[\d+\][+-]?\s+(\d+)\s+(\S+)\s+(.*)$`)

// watchExits polls until every process has exited (gone from /proc, or a zombie its
// shell has not reaped yet) or limit has passed, and returns when each was seen gone.
func watchExits(procs []*walkProc, start time.Time, limit time.Duration) map[int]time.Duration {
	gone := map[int]time.Duration{}
	for time.Since(start) < limit {
		for _, p := range procs {
			if _, ok := gone[p.pid]; ok || p.pid == 0 {
				continue
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
			if s := string(b); err != nil || strings.HasPrefix(s[strings.LastIndexByte(s, ')')+1:], " Z") {
				gone[p.pid] = time.Since(start)
			}
		}
		running := 0
		for _, p := range procs {
			if _, ok := gone[p.pid]; !ok && p.pid != 0 {
				running++
			}
		}
		if running == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return gone
}

// walkDir is a temporary copy of what the walk-through reads (configs/, scripts/) with
// bin/enforcer and bin/balancer built into it: its bin/certs is the test's own.
func walkDir(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"configs", "scripts"} {
		if err := os.CopyFS(filepath.Join(dir, d), os.DirFS(filepath.Join(root, d))); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "bin")+"/", "./cmd/enforcer", "./cmd/balancer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("walk: go build: %v\n%s", err, out)
	}
	return dir
}

func hasLine(text, line string) bool {
	return slices.Contains(strings.Split(text, "\n"), line)
}

// metricLines are text's lines that start with name (for messages).
func metricLines(text, name string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, name) {
			out = append(out, l)
		}
	}
	return out
}

// poll calls probe every 100 ms until it says done or d has passed, and returns its last
// answer.
func poll(d time.Duration, probe func() (bool, string)) (bool, string) {
	deadline := time.Now().Add(d)
	for {
		ok, last := probe()
		if ok || time.Now().After(deadline) {
			return ok, last
		}
		time.Sleep(100 * time.Millisecond)
	}
}
