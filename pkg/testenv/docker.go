package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

const (
	namePrefix   = "allot-test-"
	labelKey     = "allot-test"         // every container: allot-test=1
	labelOwner   = "allot-test.owner"   // host/pid-namespace/pid/start-time of the test binary
	labelExpires = "allot-test.expires" // Unix seconds after which anyone may remove it
	labelTest    = "allot-test.test"    // the test's name, for people reading `docker ps`

	defaultBaseImage  = "allot/base:bookworm-1"
	defaultRedisImage = "redis:7"
	defaultEtcdImage  = "quay.io/coreos/etcd:v3.5.17"
	defaultTTL        = time.Hour

	readyTimeout = 60 * time.Second      // the bound on every readiness wait
	pollEvery    = 25 * time.Millisecond // readiness poll interval
	stopGrace    = 10 * time.Second      // SIGTERM, then SIGKILL
	dockerCall   = 30 * time.Second      // the bound on one Docker API call made with a context
)

// docker holds the process-wide Docker connection, made once.
var docker struct {
	once sync.Once
	pool *dockertest.Pool
	err  error // no daemon answers

	imgOnce sync.Once
	imgErr  error

	seq atomic.Int64 // container name sequence
}

// Require skips t when no Docker daemon answers (with a message that says how to get one,
// or to run make test-short); with CI=true (any value strconv.ParseBool reads as true) it
// fails t instead. It also skips under testing.Short(), whatever CI says. When Docker
// answers it makes sure the images exist, building the local base image once if needed;
// a failed build fails t. Every constructor in this package calls it.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("testenv: integration test skipped under -short (it needs Docker)")
	}
	pool, err := dockerPool()
	if err != nil {
		msg := fmt.Sprintf("testenv: no Docker daemon answers (%v); this integration test needs "+
			"Docker and the local images (make images), or run make test-short", err)
		if ciMode() {
			t.Fatal(msg + " [CI=true: failing instead of skipping]")
		}
		t.Skip(msg)
	}
	if err := ensureImages(t, pool); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

func ciMode() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

func upstreamMode() bool {
	up, _ := strconv.ParseBool(os.Getenv("ALLOT_UPSTREAM_IMAGES"))
	return up
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// redisImage and etcdImage are the images servers run from, by mode.
func redisImage() string {
	if upstreamMode() {
		return envOr("ALLOT_REDIS_IMAGE", defaultRedisImage)
	}
	return envOr("ALLOT_BASE_IMAGE", defaultBaseImage)
}

func etcdImage() string {
	if upstreamMode() {
		return envOr("ALLOT_ETCD_IMAGE", defaultEtcdImage)
	}
	return envOr("ALLOT_BASE_IMAGE", defaultBaseImage)
}

// etcdBinary is the etcd executable inside etcdImage.
func etcdBinary() string {
	if upstreamMode() {
		return "/usr/local/bin/etcd"
	}
	return "etcd"
}

func containerTTL() time.Duration {
	if v := os.Getenv("ALLOT_TEST_CONTAINER_TTL"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
	}
	return defaultTTL
}

// dockerPool connects to Docker once per process. The client speaks the daemon's own API
// version (dockertest's client sends unversioned requests), so Docker Engine 20.10 (API
// 1.41) works. On success it also removes leftovers of killed test binaries.
func dockerPool() (*dockertest.Pool, error) {
	docker.once.Do(func() {
		pool, err := dockertest.NewPool("")
		if err != nil {
			docker.err = fmt.Errorf("while connecting to Docker: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := pool.Client.PingWithContext(ctx); err != nil {
			docker.err = fmt.Errorf("while pinging Docker at %s: %w", pool.Client.Endpoint(), err)
			return
		}
		pool.MaxWait = readyTimeout
		docker.pool = pool
		reapLeftovers(pool)
	})
	return docker.pool, docker.err
}

// ensureImages makes sure the images exist. Local mode builds the base image with
// scripts/images.sh when it is missing; upstream mode leaves pulling to dockertest.
func ensureImages(t testing.TB, pool *dockertest.Pool) error {
	if upstreamMode() {
		return nil
	}
	docker.imgOnce.Do(func() {
		img := envOr("ALLOT_BASE_IMAGE", defaultBaseImage)
		if _, err := pool.Client.InspectImage(img); err == nil {
			return
		}
		t.Logf("testenv: image %s is missing; building it with scripts/images.sh (a few minutes, once)", img)
		docker.imgErr = buildBaseImage(pool, img)
	})
	return docker.imgErr
}

// container is one Docker container running one server.
type container struct {
	name string
	id   string

	mu    sync.Mutex // mu guards state
	state containerState
}

type containerState int

const (
	running containerState = iota
	paused
	stopped
	removed
)

// live reports whether the server can answer: running and not paused.
func (c *container) live() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == running
}

func (c *container) setState(s containerState) {
	c.mu.Lock()
	c.state = s
	c.mu.Unlock()
}

func (c *container) getState() containerState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// startContainer creates and starts a container of kind ("redis", "etcd") from image
// running argv, with host networking and allot-test labels, and registers its removal
// at t.Cleanup. In local mode argv runs under timeout(1) so it ends at the expiry.
func startContainer(t testing.TB, kind, image string, argv []string) (*container, error) {
	return startContainerSpec(t, containerSpec{kind: kind, image: image, argv: argv})
}

// containerSpec is what a container runs: kind names it ("redis", "etcd", "proc"), binds
// are Docker bind mounts ("host:container[:ro]"), env is KEY=value pairs.
type containerSpec struct {
	kind, image string
	argv        []string
	binds, env  []string
}

// startContainerSpec is startContainer with bind mounts and environment.
func startContainerSpec(t testing.TB, spec containerSpec) (*container, error) {
	kind, image, argv := spec.kind, spec.image, spec.argv
	pool, err := dockerPool()
	if err != nil {
		return nil, err
	}
	// The random suffix keeps names unique across pid namespaces and reused pids.
	name := fmt.Sprintf("%s%s-%d-%d-%04x", namePrefix, kind, os.Getpid(), docker.seq.Add(1), rand.IntN(1<<16))
	ttl := containerTTL()
	if !upstreamMode() {
		argv = append([]string{"timeout", strconv.Itoa(int(ttl.Seconds())) + "s"}, argv...)
	}
	repo, tag := splitImage(image)
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Name:       name,
		Repository: repo,
		Tag:        tag,
		Entrypoint: argv[:1],
		Cmd:        argv[1:],
		Env:        spec.env,
		Labels: map[string]string{
			labelKey:     "1",
			labelOwner:   ownerID(),
			labelExpires: strconv.FormatInt(time.Now().Add(ttl).Unix(), 10),
			labelTest:    t.Name(),
		},
	}, func(hc *dc.HostConfig) {
		hc.NetworkMode = "host"
		hc.PublishAllPorts = false
		hc.AutoRemove = false
		hc.RestartPolicy = dc.NeverRestart()
		hc.Binds = spec.binds
	})
	if err != nil {
		_ = pool.RemoveContainerByName(name) // created but not started
		return nil, fmt.Errorf("while starting container %s from %s: %w", name, image, err)
	}
	c := &container{name: name, id: res.Container.ID}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testenv: last log lines of %s:\n%s", c.name, c.logs(40))
		}
		c.remove()
	})
	return c, nil
}

// splitImage splits "repo/name:tag" into repository and tag (default "latest").
func splitImage(image string) (repo, tag string) {
	slash := strings.LastIndex(image, "/")
	if colon := strings.LastIndex(image, ":"); colon > slash {
		return image[:colon], image[colon+1:]
	}
	return image, "latest"
}

// remove force-removes the container; a container already gone is not an error.
func (c *container) remove() {
	if c.getState() == removed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dockerCall)
	defer cancel()
	err := docker.pool.Client.RemoveContainer(dc.RemoveContainerOptions{
		ID: c.id, Force: true, RemoveVolumes: true, Context: ctx,
	})
	var nsc *dc.NoSuchContainer
	if err == nil || errors.As(err, &nsc) {
		c.setState(removed)
	}
}

// logs returns the last n lines of the container's output, or why they could not be read.
func (c *container) logs(n int) string {
	var buf bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := docker.pool.Client.Logs(dc.LogsOptions{
		Context: ctx, Container: c.id, OutputStream: &buf, ErrorStream: &buf,
		Stdout: true, Stderr: true, Tail: strconv.Itoa(n),
	})
	if err != nil {
		fmt.Fprintf(&buf, "(while reading logs: %v)", err)
	}
	return buf.String()
}

// inspect returns Docker's view of the container's state.
func (c *container) inspect() (*dc.State, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dockerCall)
	defer cancel()
	ct, err := docker.pool.Client.InspectContainerWithContext(c.id, ctx)
	if err != nil {
		return nil, fmt.Errorf("while inspecting %s: %w", c.name, err)
	}
	return &ct.State, nil
}

func (c *container) pause() error {
	if err := docker.pool.Client.PauseContainer(c.id); err != nil {
		return fmt.Errorf("while pausing %s: %w", c.name, err)
	}
	c.setState(paused)
	return nil
}

func (c *container) unpause() error {
	if err := docker.pool.Client.UnpauseContainer(c.id); err != nil {
		return fmt.Errorf("while unpausing %s: %w", c.name, err)
	}
	c.setState(running)
	return nil
}

// stop sends SIGTERM (unpausing first: a paused process cannot take a signal), waits up
// to stopGrace for the container to exit, then SIGKILLs it.
func (c *container) stop() error {
	if c.getState() == paused {
		if err := c.unpause(); err != nil {
			return err
		}
	}
	cl := docker.pool.Client
	if err := cl.KillContainer(dc.KillContainerOptions{ID: c.id, Signal: dc.SIGTERM}); err != nil {
		var nr *dc.ContainerNotRunning
		if !errors.As(err, &nr) {
			return fmt.Errorf("while stopping %s: %w", c.name, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	defer cancel()
	if _, err := cl.WaitContainerWithContext(c.id, ctx); err != nil {
		if err := cl.KillContainer(dc.KillContainerOptions{ID: c.id, Signal: dc.SIGKILL}); err != nil {
			return fmt.Errorf("while killing %s after %v: %w", c.name, stopGrace, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), dockerCall)
		defer cancel()
		if _, err := cl.WaitContainerWithContext(c.id, ctx); err != nil {
			return fmt.Errorf("while waiting for %s to exit: %w", c.name, err)
		}
	}
	c.setState(stopped)
	return nil
}

// kill sends SIGKILL (unpausing first) and waits for the container to exit: the crash
// drill, no chance to clean up.
func (c *container) kill() error {
	if c.getState() == paused {
		if err := c.unpause(); err != nil {
			return err
		}
	}
	cl := docker.pool.Client
	if err := cl.KillContainer(dc.KillContainerOptions{ID: c.id, Signal: dc.SIGKILL}); err != nil {
		var nr *dc.ContainerNotRunning
		if !errors.As(err, &nr) {
			return fmt.Errorf("while killing %s: %w", c.name, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), dockerCall)
	defer cancel()
	if _, err := cl.WaitContainerWithContext(c.id, ctx); err != nil {
		return fmt.Errorf("while waiting for %s to exit: %w", c.name, err)
	}
	c.setState(stopped)
	return nil
}

func (c *container) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), dockerCall)
	defer cancel()
	if err := docker.pool.Client.StartContainerWithContext(c.id, nil, ctx); err != nil {
		return fmt.Errorf("while starting %s again: %w", c.name, err)
	}
	c.setState(running)
	return nil
}

// errExited says the server's container exited while the harness waited for it.
type errExited struct {
	name string
	code int
	logs string
}

func (e *errExited) Error() string {
	return fmt.Sprintf("container %s exited with code %d; last log lines:\n%s", e.name, e.code, e.logs)
}

// portTaken reports whether the server could not bind its port: the harness then starts
// it again on other ports.
func (e *errExited) portTaken() bool {
	return strings.Contains(strings.ToLower(e.logs), "address already in use")
}

// errForeign says a server answered on the chosen port but it is not the one this
// container runs: another process took the port first.
var errForeign = errors.New("testenv: another server answers on the chosen port")

// retryable reports whether starting on fresh ports may succeed where err failed.
func retryable(err error) bool {
	var ex *errExited
	return errors.Is(err, errForeign) || (errors.As(err, &ex) && ex.portTaken())
}

// waitFor polls probe every pollEvery until it succeeds, the container exits, or
// readyTimeout passes, or ctx ends. probe gets a context bounded to one second per try.
func (c *container) waitFor(ctx context.Context, what string, probe func(ctx context.Context) error) error {
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	var last error
	for i := 0; ; i++ {
		tryCtx, cancel := context.WithTimeout(ctx, time.Second)
		last = probe(tryCtx)
		cancel()
		if last == nil || errors.Is(last, errForeign) {
			return last
		}
		if i%10 == 9 { // about every quarter second: did it die?
			st, err := c.inspect()
			if err != nil {
				return err
			}
			if !st.Running {
				return &errExited{name: c.name, code: st.ExitCode, logs: c.logs(20)}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s not ready after %v: %w; last log lines:\n%s",
				c.name, what, readyTimeout, last, c.logs(20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %s: %w (last probe: %v)", c.name, what, ctx.Err(), last)
		case <-tick.C:
		}
	}
}
