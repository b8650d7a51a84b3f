package e2e

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The network namespace and the shell TestREADMEWalkthroughRuns runs the README's lines in.

// netns is a network namespace of the test's own: a container of the base image that
// sleeps (10 minutes at most), with --network none, so only a loopback interface. Every
// container of the run is named with prefix; all are removed at t.Cleanup, and a run
// whose test binary was killed is removed by the next run (its holder has gone).
type netns struct {
	prefix, holder string
	pid            int // the holder's process, whose namespace nsenter enters
}

const walkPrefix = "allot-test-walk-"

func newNetns(t *testing.T) *netns {
	t.Helper()
	reapWalks(t)
	n := &netns{prefix: fmt.Sprintf("%s%08x-", walkPrefix, rand.Uint32())}
	n.holder = n.prefix + "netns"
	t.Cleanup(func() {
		if t.Failed() {
			if out, err := docker("logs", "--tail", "20", n.prefix+"etcd"); err == nil {
				t.Logf("walk: etcd's last lines:\n%s", out)
			}
		}
		n.removeAll(t)
	})
	image := os.Getenv("ALLOT_BASE_IMAGE")
	if image == "" {
		image = "allot/base:bookworm-1"
	}
	if _, err := docker("run", "-d", "--name", n.holder, "--label", "allot-test=1", "--label", "allot-test.test="+t.Name(),
		"--network", "none", image, "sleep", "600"); err != nil {
		t.Fatalf("walk: the network namespace's container: %v", err)
	}
	out, err := docker("inspect", "-f", "{{.State.Pid}}", n.holder)
	if err != nil {
		t.Fatal(err)
	}
	if n.pid, err = strconv.Atoi(strings.TrimSpace(out)); err != nil || n.pid == 0 {
		t.Fatalf("walk: %s's pid: %q, %v", n.holder, out, err)
	}
	if out, err := exec.Command("nsenter", "-t", strconv.Itoa(n.pid), "-n", "--", "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("walk: entering %s's network namespace (nsenter needs root): %v\n%s", n.holder, err, out)
	}
	return n
}

// get is GET url from inside the namespace (curl, 2 s).
func (n *netns) get(url string) (code int, body string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(n.pid), "-n", "--",
		"curl", "-s", "-m", "2", "-w", "\n%{http_code}", url).Output()
	s := string(out)
	i := strings.LastIndexByte(s, '\n')
	if i < 0 {
		return 0, s, fmt.Errorf("curl %s: %q: %v", url, s, err)
	}
	code, _ = strconv.Atoi(s[i+1:])
	return code, s[:i], err
}

// containers are the run's containers other than the holder.
func (n *netns) containers(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, c := range walkContainers(t) {
		if strings.HasPrefix(c.name, n.prefix) && c.name != n.holder {
			out = append(out, c.name)
		}
	}
	return out
}

func (n *netns) removeAll(t *testing.T) {
	var names []string
	for _, c := range walkContainers(t) {
		if strings.HasPrefix(c.name, n.prefix) {
			names = append(names, c.name)
		}
	}
	if len(names) > 0 {
		if out, err := docker(append([]string{"rm", "-f"}, names...)...); err != nil {
			t.Errorf("walk: removing %v: %v\n%s", names, err, out)
		}
	}
}

type walkContainer struct{ name, state string }

// walkContainers lists every container named allot-test-walk-*, of any run.
func walkContainers(t *testing.T) []walkContainer {
	t.Helper()
	out, err := docker("ps", "-a", "--filter", "name="+walkPrefix, "--format", "{{.Names}}\t{{.State}}")
	if err != nil {
		t.Errorf("walk: listing containers: %v", err)
		return nil
	}
	var cs []walkContainer
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if name, state, ok := strings.Cut(l, "\t"); ok && strings.HasPrefix(name, walkPrefix) {
			cs = append(cs, walkContainer{name, state})
		}
	}
	return cs
}

// reapWalks removes the containers of earlier runs whose holder is no longer running (a
// test binary killed before its cleanups); runs in progress elsewhere keep theirs.
func reapWalks(t *testing.T) {
	t.Helper()
	cs := walkContainers(t)
	live := map[string]bool{}
	for _, c := range cs {
		if strings.HasSuffix(c.name, "-netns") && c.state == "running" {
			live[strings.TrimSuffix(c.name, "netns")] = true
		}
	}
	var dead []string
	for _, c := range cs {
		rest := strings.TrimPrefix(c.name, walkPrefix)
		run, _, _ := strings.Cut(rest, "-")
		if !live[walkPrefix+run+"-"] {
			dead = append(dead, c.name)
		}
	}
	if len(dead) > 0 {
		t.Logf("walk: removing containers of earlier runs: %v", dead)
		_, _ = docker(append([]string{"rm", "-f"}, dead...)...)
	}
}

// docker runs the docker CLI, bounded.
func docker(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// walkShell is one bash inside the namespace that reads the lines it is given from a
// pipe (fd 3, so nothing it runs can read them), as a terminal would give them: the
// background jobs are its own, so `kill $(jobs -p)` means what it says. Its stdout is read
// line by line up to a marker echoed after each line; its stderr (and every process's
// log) goes to walk.log.
type walkShell struct {
	cmd    *exec.Cmd
	script *os.File
	lines  chan string
	marker string
	log    string
	n      int
}

func (n *netns) shell(t *testing.T, dir string) *walkShell {
	t.Helper()
	scriptR, scriptW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	sh := &walkShell{script: scriptW, lines: make(chan string, 1024), marker: "@@" + n.prefix, log: filepath.Join(dir, "walk.log")}
	logF, err := os.Create(sh.log)
	if err != nil {
		t.Fatal(err)
	}
	sh.cmd = exec.Command("nsenter", "-t", strconv.Itoa(n.pid), "-n", "--", "bash", "/dev/fd/3")
	sh.cmd.Dir = dir
	sh.cmd.Env = walkEnv(n)
	sh.cmd.Stdout, sh.cmd.Stderr = outW, logF
	sh.cmd.ExtraFiles = []*os.File{scriptR}
	sh.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its background jobs too: no job control
	err = sh.cmd.Start()
	scriptR.Close()
	outW.Close()
	logF.Close()
	if err != nil {
		scriptW.Close()
		outR.Close()
		t.Fatal(err)
	}
	done, read := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			select {
			case sh.lines <- sc.Text():
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() {
		// Whatever is still running (the test failed before the teardown) goes with the shell.
		scriptW.Close()
		_ = syscall.Kill(-sh.cmd.Process.Pid, syscall.SIGKILL)
		exited := make(chan struct{})
		go func() { _ = sh.cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("walk: the shell (pid %d) did not exit 10 s after SIGKILL", sh.cmd.Process.Pid)
		}
		close(done)
		outR.Close()
		<-read
		if t.Failed() {
			t.Logf("walk: the shell's stderr and the processes' logs (last lines):\n%s", sh.logTail(60))
		}
	})
	if _, err := fmt.Fprintln(scriptW, "exec 3<&-"); err != nil { // the children do not get the script
		t.Fatal(err)
	}
	return sh
}

// walkEnv is this process's environment for the shell, without ALLOT_* settings (the
// walk-through's processes read them) but for the base image, and with region.sh's
// containers put in the namespace, named with the run's prefix.
func walkEnv(n *netns) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "ALLOT_") && k != "ALLOT_BASE_IMAGE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "ALLOT_REGION_NETWORK=container:"+n.holder, "ALLOT_REGION_PREFIX="+n.prefix)
}

// step runs line in the shell and returns what it printed, its exit status and how long
// it took; past timeout it fails t.
func (sh *walkShell) step(t *testing.T, line string, timeout time.Duration) (string, int, time.Duration) {
	t.Helper()
	sh.n++
	mark := fmt.Sprintf("%s %d ", sh.marker, sh.n)
	start := time.Now()
	if _, err := fmt.Fprintf(sh.script, "%s\necho \"%s$?\"\n", line, mark); err != nil {
		t.Fatalf("walk: writing %q to the shell: %v", line, err)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var out []string
	for {
		select {
		case l, ok := <-sh.lines:
			if !ok {
				t.Fatalf("walk: the shell ended during %q:\n%s\n%s", line, strings.Join(out, "\n"), sh.logTail(40))
			}
			if before, status, found := strings.Cut(l, mark); found {
				if before != "" {
					out = append(out, before)
				}
				code, _ := strconv.Atoi(status)
				return strings.Join(out, "\n"), code, time.Since(start)
			}
			out = append(out, l)
		case <-timer.C:
			t.Fatalf("walk: %q did not finish within %v:\n%s\n%s", line, timeout, strings.Join(out, "\n"), sh.logTail(40))
		}
	}
}

// logTail is the last n lines of walk.log (all of it for n = 0).
func (sh *walkShell) logTail(n int) string {
	b, err := os.ReadFile(sh.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if n > 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
