package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proc is any one process in a container of its own, with host networking: allot's own
// binaries (enforcer, balancer), nginx and Caddy, run from the stack image. The harness
// knows nothing of its protocol: the caller waits for it to be ready (WaitHTTP or its own
// probe). Its state-changing methods (Stop, Kill, Start, Pause, Unpause) fail the test on
// error and must not be called concurrently with each other; the rest is safe for
// concurrent use.
type Proc struct {
	c *container
}

// ProcOptions says what a Proc runs.
type ProcOptions struct {
	// Kind is a short word for the container name ("enforcer", "nginx"); default "proc".
	Kind string
	// Image defaults to StackImage(t).
	Image string
	// Argv is the command and its arguments; required.
	Argv []string
	// Env is KEY=value pairs. Nothing of the caller's environment is passed on.
	Env []string
	// Binds are Docker bind mounts, "host-path:container-path[:ro]". Mounting a
	// t.TempDir() at the same path keeps file names identical inside and out.
	Binds []string
}

// Run starts a process in a container, removed at t.Cleanup (its last log lines are
// logged first when t failed). It returns once Docker reports the container started; it
// fails t if it cannot.
func Run(t testing.TB, opt ProcOptions) *Proc {
	t.Helper()
	Require(t)
	if len(opt.Argv) == 0 {
		t.Fatal("testenv: Run: ProcOptions.Argv is empty")
	}
	if opt.Kind == "" {
		opt.Kind = "proc"
	}
	if opt.Image == "" {
		opt.Image = StackImage(t)
	}
	c, err := startContainerSpec(t, containerSpec{kind: opt.Kind, image: opt.Image, argv: opt.Argv, binds: opt.Binds, env: opt.Env})
	if err != nil {
		t.Fatalf("testenv: Run: %v", err)
	}
	return &Proc{c: c}
}

// Name is the container's name.
func (p *Proc) Name() string { return p.c.name }

// Logs returns the last n lines of the process's stdout and stderr.
func (p *Proc) Logs(n int) string { return p.c.logs(n) }

// ProcStatus is Docker's view of a Proc.
type ProcStatus struct {
	Running   bool
	Paused    bool
	ExitCode  int
	StartedAt time.Time // the last start: a restarted process has a later one
	Restarts  int       // Docker's restart count (the harness never restarts by itself)
}

// Status asks Docker for the process's state.
func (p *Proc) Status(t testing.TB) ProcStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dockerCall)
	defer cancel()
	ct, err := docker.pool.Client.InspectContainerWithContext(p.c.id, ctx)
	if err != nil {
		t.Fatalf("testenv: while inspecting %s: %v", p.c.name, err)
	}
	return ProcStatus{Running: ct.State.Running, Paused: ct.State.Paused, ExitCode: ct.State.ExitCode,
		StartedAt: ct.State.StartedAt, Restarts: ct.RestartCount}
}

// Stop sends SIGTERM (the process's graceful shutdown), SIGKILL after 10 s.
func (p *Proc) Stop(t testing.TB) {
	t.Helper()
	if err := p.c.stop(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Kill sends SIGKILL: the crash drill.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	if err := p.c.kill(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Start starts a stopped process again with the same command.
func (p *Proc) Start(t testing.TB) {
	t.Helper()
	if err := p.c.start(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Pause freezes the process (docker pause).
func (p *Proc) Pause(t testing.TB) {
	t.Helper()
	if err := p.c.pause(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Unpause resumes a paused process.
func (p *Proc) Unpause(t testing.TB) {
	t.Helper()
	if err := p.c.unpause(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// WaitReady polls probe every 25 ms until it returns nil, the container exits, or
// timeout passes; it fails t (with the process's last log lines) otherwise.
func (p *Proc) WaitReady(t testing.TB, what string, timeout time.Duration, probe func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := p.c.waitFor(ctx, what, probe); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Ports returns n distinct loopback ports free right now (see freePorts), never handed out
// twice in this process.
func Ports(t testing.TB, n int) []int {
	t.Helper()
	p, err := freePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// stackImage is the image StackImage built, once per test binary.
var stackImage struct {
	once sync.Once
	tag  string
	err  error
}

// StackImage returns the tag of the local image holding allot's own static binaries
// (/usr/local/bin/enforcer and every other ./cmd/... main) on top of the gateway image
// (the base plus Debian's nginx and caddy), building what is missing with
// `scripts/images.sh stack` once per test binary. The tag is a content hash of the
// binaries, so an unchanged tree reuses the image (a rerun costs the go build's cache
// check, a few seconds). It fails t when the build fails. In upstream mode (ALLOT_UPSTREAM_IMAGES) the stack image is
// still built locally, from ALLOT_BASE_IMAGE.
func StackImage(t testing.TB) string {
	t.Helper()
	Require(t)
	stackImage.once.Do(func() {
		began := time.Now()
		stackImage.tag, stackImage.err = buildStackImage()
		if stackImage.err == nil {
			t.Logf("testenv: stack image %s ready in %v", stackImage.tag, time.Since(began).Round(time.Millisecond))
		}
	})
	if stackImage.err != nil {
		t.Fatalf("testenv: %v", stackImage.err)
	}
	return stackImage.tag
}

func buildStackImage() (string, error) {
	unlock, err := lockFile(filepath.Join(os.TempDir(), "allot-testenv-images.lock"))
	if err != nil {
		return "", fmt.Errorf("while locking the image build: %w", err)
	}
	defer unlock()
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "images.sh"), "stack")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("while building the stack image with scripts/images.sh stack: %w\n%s", err, stderr.String())
	}
	var tag string
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			tag = line
		}
	}
	if !strings.HasPrefix(tag, "allot/stack:") {
		return "", fmt.Errorf("scripts/images.sh stack printed %q, want an allot/stack:<hash> tag last\n%s", out, stderr.String())
	}
	return tag, nil
}
