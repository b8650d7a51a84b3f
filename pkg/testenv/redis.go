package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startAttempts bounds how often a server is started again on fresh ports after another
// process took its port.
const startAttempts = 3

// Node is one redis-server in a container, listening on 127.0.0.1 only. Addr never
// changes, across Stop and Start too. Its methods that change the server's state (Pause,
// Unpause, Stop, Start) fail the test they are given on error and must not be called
// concurrently with each other; Client and the fields are safe for concurrent use.
type Node struct {
	Addr    string // "127.0.0.1:port"
	Port    int    // the client port
	BusPort int    // the cluster bus port; 0 for a standalone node

	c     *container
	owner testing.TB // closes the clients Client hands out
	token string     // the unique dbfilename that tells this server from any other
}

// redisConfig is what varies between a standalone node and a cluster node.
type redisConfig struct {
	cluster             bool
	nodeTimeout         time.Duration
	requireFullCoverage bool
	persist             bool // appendonly yes, appendfsync everysec
}

// Redis starts one standalone redis-server (no persistence: save "" and appendonly no),
// removed at t.Cleanup. It returns once the server answers; it fails t if it cannot.
func Redis(t testing.TB) *Node {
	t.Helper()
	Require(t)
	n, err := startRedis(t, redisConfig{})
	if err != nil {
		t.Fatalf("testenv: Redis: %v", err)
	}
	return n
}

// startRedis starts a node and waits until it answers, trying fresh ports when another
// process took the chosen ones.
func startRedis(t testing.TB, cfg redisConfig) (*Node, error) {
	var err error
	for attempt := 0; attempt < startAttempts; attempt++ {
		var n *Node
		if n, err = startRedisOnce(t, cfg); err == nil {
			return n, nil
		}
		if !retryable(err) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("after %d attempts on fresh ports: %w", startAttempts, err)
}

func startRedisOnce(t testing.TB, cfg redisConfig) (*Node, error) {
	want := 1
	if cfg.cluster {
		want = 2
	}
	p, err := freePorts(want)
	if err != nil {
		return nil, err
	}
	n := &Node{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p[0])), Port: p[0], owner: t}
	n.token = fmt.Sprintf("allot-test-%016x.rdb", rand.Uint64())
	appendonly := "no"
	if cfg.persist {
		appendonly = "yes"
	}
	argv := []string{"redis-server",
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(n.Port),
		"--save", "",
		"--appendonly", appendonly,
		"--appendfsync", "everysec",
		"--dir", "/tmp",
		"--dbfilename", n.token,
		"--repl-diskless-sync", "yes",
		"--repl-diskless-sync-delay", "0",
	}
	if cfg.cluster {
		n.BusPort = p[1]
		coverage := "no"
		if cfg.requireFullCoverage {
			coverage = "yes"
		}
		argv = append(argv,
			"--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", n.Port),
			"--cluster-port", strconv.Itoa(n.BusPort),
			"--cluster-announce-ip", "127.0.0.1",
			"--cluster-node-timeout", strconv.FormatInt(cfg.nodeTimeout.Milliseconds(), 10),
			"--cluster-require-full-coverage", coverage,
		)
	}
	n.c, err = startContainer(t, "redis", redisImage(), argv)
	if err != nil {
		return nil, err
	}
	if err := n.waitReady(); err != nil {
		n.c.remove()
		return nil, err
	}
	return n, nil
}

// probeClient is a one-connection client for readiness polls: short timeouts, no retries.
func probeClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
		MaxRetries: -1, PoolSize: 1, DialerRetries: 1, DisableIdentity: true,
	})
}

// dialable reports whether something accepts TCP connections on addr; the probes check
// it first so that go-redis does not log every refused dial while a server starts.
func dialable(ctx context.Context, addr string) error {
	conn, err := (&net.Dialer{Timeout: 500 * time.Millisecond}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// waitReady polls until the server answers and is this node's server (its dbfilename is
// n.token); errForeign when another server answers on the port.
func (n *Node) waitReady() error {
	cl := probeClient(n.Addr)
	defer cl.Close()
	return n.c.waitFor(context.Background(), "redis "+n.Addr, func(ctx context.Context) error {
		if err := dialable(ctx, n.Addr); err != nil {
			return err
		}
		v, err := cl.ConfigGet(ctx, "dbfilename").Result()
		if err != nil {
			return err
		}
		if v["dbfilename"] != n.token {
			return fmt.Errorf("%w: %s has dbfilename %q, want %q", errForeign, n.Addr, v["dbfilename"], n.token)
		}
		return nil
	})
}

// Client returns a new go-redis client for this node (DialTimeout, ReadTimeout and
// WriteTimeout 2 s, other options at go-redis defaults), closed at the cleanup of the test
// that started the node.
func (n *Node) Client() *redis.Client {
	cl := redis.NewClient(&redis.Options{
		Addr: n.Addr, DialTimeout: 2 * time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		DisableIdentity: true,
	})
	n.owner.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Pause freezes the server (docker pause): connections stay open but nothing answers,
// so callers see timeouts. This is the outage drill for a hung shard.
func (n *Node) Pause(t testing.TB) {
	t.Helper()
	if err := n.c.pause(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Unpause resumes a paused server and waits until it answers again.
func (n *Node) Unpause(t testing.TB) {
	t.Helper()
	if err := n.c.unpause(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := n.waitReady(); err != nil {
		t.Fatalf("testenv: after Unpause: %v", err)
	}
}

// Stop stops the server (SIGTERM, SIGKILL after 10 s); its connections are refused.
// A stopped server keeps its container file system, so a cluster node keeps its
// nodes.conf (identity, epoch) for Start. Data is not persisted.
func (n *Node) Stop(t testing.TB) {
	t.Helper()
	if err := n.c.stop(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Kill kills the server (SIGKILL): no shutdown, its connections are reset and then
// refused. Like Stop it keeps the container's file system for Start.
func (n *Node) Kill(t testing.TB) {
	t.Helper()
	if err := n.c.kill(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Start starts a stopped server again on the same ports and waits until it answers. It
// does not wait for a cluster node to be back in the cluster: use Cluster.WaitOK.
func (n *Node) Start(t testing.TB) {
	t.Helper()
	if err := n.c.start(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := n.waitReady(); err != nil {
		t.Fatalf("testenv: after Start: %v", err)
	}
}

// Name is the node's container name, for messages and for docker commands by hand.
func (n *Node) Name() string { return n.c.name }
