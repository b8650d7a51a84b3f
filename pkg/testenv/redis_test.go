package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestRedisPing(t *testing.T) {
	t.Parallel()
	began := time.Now()
	n := Redis(t)
	t.Logf("single Redis ready in %v", time.Since(began).Round(time.Millisecond))
	if !strings.HasPrefix(n.Addr, "127.0.0.1:") || !strings.HasPrefix(n.Name(), namePrefix) {
		t.Errorf("Addr %q, Name %q: want 127.0.0.1 and the %q prefix", n.Addr, n.Name(), namePrefix)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl := n.Client()
	if got, err := cl.Ping(ctx).Result(); err != nil || got != "PONG" {
		t.Fatalf("PING = %q, %v; want PONG", got, err)
	}
	// No persistence, loopback only.
	want := map[string]string{"save": "", "appendonly": "no", "bind": "127.0.0.1", "cluster-enabled": "no"}
	for k, v := range want {
		if got, err := cl.ConfigGet(ctx, k).Result(); err != nil || got[k] != v {
			t.Errorf("CONFIG GET %s = %v, %v; want %q", k, got, err, v)
		}
	}
}

// TestRedisOutages drills Pause/Unpause and Stop/Start on one node.
func TestRedisOutages(t *testing.T) {
	t.Parallel()
	n := Redis(t)
	cl := n.Client()
	ping := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return cl.Ping(ctx).Err()
	}
	if err := ping(5 * time.Second); err != nil {
		t.Fatalf("PING before the drill: %v", err)
	}

	began := time.Now()
	n.Pause(t)
	t.Logf("Pause took %v", time.Since(began).Round(time.Millisecond))
	if err := ping(300 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Fatalf("PING to a paused node = %v, want a timeout", err)
	}
	began = time.Now()
	n.Unpause(t)
	t.Logf("Unpause took %v", time.Since(began).Round(time.Millisecond))
	if err := ping(5 * time.Second); err != nil {
		t.Fatalf("PING after Unpause: %v", err)
	}

	addr := n.Addr
	began = time.Now()
	n.Stop(t)
	t.Logf("Stop took %v", time.Since(began).Round(time.Millisecond))
	if err := ping(time.Second); err == nil {
		t.Fatal("PING to a stopped node succeeded")
	}
	began = time.Now()
	n.Start(t)
	t.Logf("Start after Stop ready in %v", time.Since(began).Round(time.Millisecond))
	if n.Addr != addr {
		t.Errorf("Addr after Start = %s, want %s", n.Addr, addr)
	}
	if err := ping(5 * time.Second); err != nil {
		t.Fatalf("PING after Start: %v", err)
	}
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

func TestRedisClusterThreeMasters(t *testing.T) {
	t.Parallel()
	c := RedisCluster(t, ClusterOptions{})
	if len(c.Nodes) != 3 || len(c.Masters()) != 3 || len(c.Addrs()) != 3 {
		t.Fatalf("got %d nodes, %d masters, %d addrs; want 3 each", len(c.Nodes), len(c.Masters()), len(c.Addrs()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := c.Client()
	owners := map[string]bool{}
	for i := range 30 {
		key := fmt.Sprintf("key-%d", i)
		if err := cl.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s through the cluster client: %v", key, err)
		}
		m := c.MasterFor(key)
		owners[m.Addr] = true
		// The owner answers directly; the server's own KEYSLOT agrees with Slot.
		direct := m.Client()
		if got, err := direct.Get(ctx, key).Int(); err != nil || got != i {
			t.Errorf("GET %s on MasterFor's %s = %d, %v; want %d", key, m.Addr, got, err, i)
		}
		if slot, err := direct.ClusterKeySlot(ctx, key).Result(); err != nil || int(slot) != Slot(key) {
			t.Errorf("CLUSTER KEYSLOT %s = %d, %v; Slot says %d", key, slot, err, Slot(key))
		}
		// Any other master redirects.
		for _, other := range c.Masters() {
			if other == m {
				continue
			}
			err := other.Client().Get(ctx, key).Err()
			if err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
				t.Errorf("GET %s on non-owner %s = %v, want MOVED", key, other.Addr, err)
			}
			break
		}
	}
	if len(owners) != 3 {
		t.Errorf("30 keys landed on %d masters, want all 3", len(owners))
	}

	// A master without replicas stopped and started again rejoins with its slots (its
	// nodes.conf survives) but not its data (no persistence).
	m := c.MasterFor("key-0")
	began := time.Now()
	m.Stop(t)
	m.Start(t)
	c.WaitOK(t)
	t.Logf("a stopped master is back in the cluster %v after Stop", time.Since(began).Round(time.Millisecond))
	if got := c.MasterFor("key-0"); got != m {
		t.Errorf("MasterFor(key-0) after restart = %s, want %s", got.Addr, m.Addr)
	}
	var err error
	for attempt := 0; attempt < 20; attempt++ { // bounded: the client may first hit a stale connection
		if err = cl.Set(ctx, "key-0", "again", 0).Err(); err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("SET key-0 after the restart: %v", err)
	}
}

// TestRedisClusterFailover starts 3 masters with a replica each, pauses the master of a
// key and measures how long the cluster and a go-redis client take to move on.
func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	c := RedisCluster(t, ClusterOptions{ReplicasPerMaster: 1})
	if len(c.Nodes) != 6 || len(c.Masters()) != 3 {
		t.Fatalf("got %d nodes and %d masters, want 6 and 3", len(c.Nodes), len(c.Masters()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	for _, n := range c.Nodes[3:] {
		if role := roleOf(ctx, t, n); role != "slave" {
			t.Fatalf("%s (a replica by construction) has role %q", n.Addr, role)
		}
	}
	cl := c.Client()
	const key = "failover-key"
	if err := cl.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	old := c.MasterFor(key)

	began := time.Now()
	old.Pause(t)
	c.WaitOK(t)
	promoted := c.MasterFor(key)
	t.Logf("failover of a paused master: the cluster is OK again after %v", time.Since(began).Round(time.Millisecond))
	if promoted == old {
		t.Fatalf("MasterFor(%q) is still the paused %s", key, old.Addr)
	}
	// The existing client finds the new master by itself.
	var err error
	for attempt := 0; attempt < 20; attempt++ { // bounded: each try gives up within about 10 s
		if err = cl.Set(ctx, key, "after", 0).Err(); err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("SET after failover: %v", err)
	}
	t.Logf("failover: the go-redis cluster client writes again %v after the pause", time.Since(began).Round(time.Millisecond))

	old.Unpause(t)
	c.WaitOK(t)
	if role := roleOf(ctx, t, old); role != "slave" {
		t.Errorf("the old master after Unpause has role %q, want slave", role)
	}
	if got, err := cl.Get(ctx, key).Result(); err != nil || got != "after" {
		t.Errorf("GET after the old master returned = %q, %v; want after", got, err)
	}
}

func roleOf(ctx context.Context, t *testing.T, n *Node) string {
	t.Helper()
	raw, err := n.Client().Info(ctx, "replication").Result()
	if err != nil {
		t.Fatalf("INFO replication on %s: %v", n.Addr, err)
	}
	return parseInfo(raw)["role"]
}
