package testenv

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// NumSlots is the number of Redis Cluster hash slots.
const NumSlots = 16384

// ClusterOptions shapes a Redis Cluster. The zero value is a 3-master cluster without
// replicas, node timeout 2 s, serving partial coverage.
type ClusterOptions struct {
	// Masters is the number of masters, default 3 when zero. The slots are split evenly
	// and in order: master i serves the i-th range. Failover needs at least 3.
	Masters int
	// ReplicasPerMaster is the number of replicas of each master (default 0).
	ReplicasPerMaster int
	// NodeTimeout is cluster-node-timeout: how long a node may be silent before the others
	// flag it failing and its replica (if any) takes over. Default 2 s; at least 100 ms.
	NodeTimeout time.Duration
	// RequireFullCoverage sets cluster-require-full-coverage yes: while any slot is
	// unserved, every node refuses every query. The default (false, "no") lets the other
	// masters keep serving their slots while one is down, as allot runs in production.
	RequireFullCoverage bool
	// Persist turns on the append-only file, as allot's shipped clusters run for quota
	// counters (appendonly yes, appendfsync everysec): a node stopped and started again
	// (Stop, Kill, Start) comes back with its data, less at most the last second's writes
	// after a Kill. The default (false) persists nothing: a restarted node is empty.
	Persist bool
}

// Cluster is a running Redis Cluster whose nodes all announce 127.0.0.1:<port>. Its
// methods are safe for concurrent use.
type Cluster struct {
	// Nodes are all the nodes: first the masters in slot order (Nodes[i] was given the
	// i-th range), then the replicas of master 0, then of master 1, and so on. Roles can
	// change with failovers; this order does not.
	Nodes []*Node

	opt     ClusterOptions
	owner   testing.TB
	initial []slotRange // the layout the cluster was built with
}

// slotRange is one contiguous run of slots and the address of its master.
type slotRange struct {
	lo, hi int
	master string
}

// RedisCluster starts a Redis Cluster shaped by opt, removed at t.Cleanup. It starts
// the nodes concurrently, assigns the slots and returns once every node reports
// cluster_state:ok with all 16384 slots served, every node agrees on the slot map and
// every replica is in sync with its master. It fails t if it cannot.
func RedisCluster(t testing.TB, opt ClusterOptions) *Cluster {
	t.Helper()
	Require(t)
	if opt.Masters == 0 {
		opt.Masters = 3
	}
	if opt.NodeTimeout == 0 {
		opt.NodeTimeout = 2 * time.Second
	}
	switch {
	case opt.Masters < 1 || opt.Masters > 64:
		t.Fatalf("testenv: ClusterOptions.Masters = %d, want 1..64", opt.Masters)
	case opt.ReplicasPerMaster < 0 || opt.ReplicasPerMaster > 4:
		t.Fatalf("testenv: ClusterOptions.ReplicasPerMaster = %d, want 0..4", opt.ReplicasPerMaster)
	case opt.NodeTimeout < 100*time.Millisecond:
		t.Fatalf("testenv: ClusterOptions.NodeTimeout = %v, want at least 100ms", opt.NodeTimeout)
	}
	began := time.Now()
	c := &Cluster{opt: opt, owner: t}
	total := opt.Masters * (1 + opt.ReplicasPerMaster)
	c.Nodes = make([]*Node, total)
	errs := make([]error, total)
	var wg sync.WaitGroup
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Nodes[i], errs[i] = startRedis(t, redisConfig{
				cluster: true, nodeTimeout: opt.NodeTimeout, requireFullCoverage: opt.RequireFullCoverage,
				persist: opt.Persist,
			})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("testenv: RedisCluster: %v", err)
	}
	started := time.Since(began)
	joined, err := c.build()
	if err != nil {
		t.Fatalf("testenv: RedisCluster: %v", err)
	}
	t.Logf("testenv: Redis Cluster of %d masters × %d replicas ready in %v (servers answering after %v, joined after %v)",
		opt.Masters, opt.ReplicasPerMaster, time.Since(began).Round(time.Millisecond),
		started.Round(time.Millisecond), joined.Sub(began).Round(time.Millisecond))
	return c
}

// build joins the started nodes into a cluster, as redis-cli --cluster create does:
// distinct config epochs, slots to the masters, MEET, REPLICATE, then wait until healthy.
// It returns when the replicas were attached.
func (c *Cluster) build() (joined time.Time, err error) {
	m := c.opt.Masters
	cls := make([]*redis.Client, len(c.Nodes))
	for i, n := range c.Nodes {
		cls[i] = probeClient(n.Addr)
		defer cls[i].Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	ids := make([]string, len(c.Nodes))
	for i, cl := range cls {
		id, err := cl.ClusterMyID(ctx).Result()
		if err != nil {
			return time.Time{}, fmt.Errorf("while reading the id of %s: %w", c.Nodes[i].Addr, err)
		}
		ids[i] = id
		if err := cl.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return time.Time{}, fmt.Errorf("while setting the config epoch of %s: %w", c.Nodes[i].Addr, err)
		}
	}
	for i := range m {
		lo, hi := i*NumSlots/m, (i+1)*NumSlots/m-1
		c.initial = append(c.initial, slotRange{lo: lo, hi: hi, master: c.Nodes[i].Addr})
		if err := cls[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return time.Time{}, fmt.Errorf("while giving slots %d-%d to %s: %w", lo, hi, c.Nodes[i].Addr, err)
		}
	}
	for _, n := range c.Nodes[1:] {
		if err := cls[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.Port, n.BusPort).Err(); err != nil {
			return time.Time{}, fmt.Errorf("while introducing %s to %s: %w", n.Addr, c.Nodes[0].Addr, err)
		}
	}
	// A replica can only follow a master it knows; poll until the gossip has reached it.
	for r := m; r < len(c.Nodes); r++ {
		master := (r - m) / c.opt.ReplicasPerMaster
		err := poll(ctx, func(ctx context.Context) error {
			return cls[r].Do(ctx, "CLUSTER", "REPLICATE", ids[master]).Err()
		})
		if err != nil {
			return time.Time{}, fmt.Errorf("while making %s a replica of %s: %w", c.Nodes[r].Addr, c.Nodes[master].Addr, err)
		}
	}
	joined = time.Now()
	return joined, poll(ctx, func(ctx context.Context) error { return c.healthy(ctx, c.Nodes, len(c.Nodes)) })
}

// WaitOK waits until the cluster is healthy among its live nodes (not paused, not
// stopped): each reports cluster_state:ok with all slots served, all agree on the slot
// map, every slot's master is live, and every live replica is in sync. Use it after a
// failover drill or a Start. It fails t after a minute; with a master down and no replica
// to replace it, that is what happens.
func (c *Cluster) WaitOK(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var live []*Node
	for _, n := range c.Nodes {
		if n.c.live() {
			live = append(live, n)
		}
	}
	if err := poll(ctx, func(ctx context.Context) error { return c.healthy(ctx, live, 0) }); err != nil {
		t.Fatalf("testenv: Cluster.WaitOK: %v", err)
	}
}

// healthy checks the nodes given; knownNodes > 0 also requires each to know that many.
func (c *Cluster) healthy(ctx context.Context, nodes []*Node, knownNodes int) error {
	isLive := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		isLive[n.Addr] = true
	}
	var first []slotRange
	for _, n := range nodes {
		cl := probeClient(n.Addr)
		err := nodeHealthy(ctx, cl, n.Addr, knownNodes)
		var view []slotRange
		if err == nil {
			view, err = slotMap(ctx, cl)
		}
		cl.Close()
		if err != nil {
			return err
		}
		for _, r := range view {
			if !isLive[r.master] {
				return fmt.Errorf("%s: slots %d-%d still served by %s, which is down", n.Addr, r.lo, r.hi, r.master)
			}
		}
		if first == nil {
			first = view
		} else if !equalViews(first, view) {
			return fmt.Errorf("%s sees slot map %v, %s sees %v", nodes[0].Addr, first, n.Addr, view)
		}
	}
	return nil
}

// nodeHealthy checks one node's CLUSTER INFO and, for a replica, its replication link.
func nodeHealthy(ctx context.Context, cl *redis.Client, addr string, knownNodes int) error {
	raw, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("while reading CLUSTER INFO of %s: %w", addr, err)
	}
	info := parseInfo(raw)
	if info["cluster_state"] != "ok" || info["cluster_slots_ok"] != strconv.Itoa(NumSlots) {
		return fmt.Errorf("%s: cluster_state %s, cluster_slots_ok %s", addr, info["cluster_state"], info["cluster_slots_ok"])
	}
	if knownNodes > 0 && info["cluster_known_nodes"] != strconv.Itoa(knownNodes) {
		return fmt.Errorf("%s: knows %s nodes, want %d", addr, info["cluster_known_nodes"], knownNodes)
	}
	raw, err = cl.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("while reading INFO replication of %s: %w", addr, err)
	}
	repl := parseInfo(raw)
	if repl["role"] == "slave" && repl["master_link_status"] != "up" {
		return fmt.Errorf("%s: replica link to its master is %s", addr, repl["master_link_status"])
	}
	return nil
}

func parseInfo(raw string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(raw, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// slotMap is the node's CLUSTER SLOTS answer as sorted ranges with their master address.
func slotMap(ctx context.Context, cl *redis.Client) ([]slotRange, error) {
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("while reading CLUSTER SLOTS of %s: %w", cl.Options().Addr, err)
	}
	view := make([]slotRange, 0, len(slots))
	covered := 0
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		view = append(view, slotRange{lo: int(s.Start), hi: int(s.End), master: s.Nodes[0].Addr})
		covered += int(s.End-s.Start) + 1
	}
	if covered != NumSlots {
		return nil, fmt.Errorf("%s: CLUSTER SLOTS covers %d slots, want %d", cl.Options().Addr, covered, NumSlots)
	}
	sort.Slice(view, func(i, j int) bool { return view[i].lo < view[j].lo })
	return view, nil
}

func equalViews(a, b []slotRange) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// poll calls probe every pollEvery until it succeeds or ctx ends; it returns the last error.
func poll(ctx context.Context, probe func(ctx context.Context) error) error {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		tryCtx, cancel := context.WithTimeout(ctx, time.Second)
		err := probe(tryCtx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v: %w", readyTimeout, err)
		case <-tick.C:
		}
	}
}

// currentView asks the live nodes, in order, for the slot map and returns the first
// answer; when none answers within half a second each, the layout the cluster was built
// with.
func (c *Cluster) currentView() []slotRange {
	for _, n := range c.Nodes {
		if !n.c.live() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		cl := probeClient(n.Addr)
		view, err := slotMap(ctx, cl)
		cl.Close()
		cancel()
		if err == nil {
			return view
		}
	}
	return c.initial
}

func (c *Cluster) byAddr(addr string) *Node {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// Addrs returns every node's "127.0.0.1:port", in Nodes order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// Masters returns the nodes that serve slots now, in slot order, as the first live node
// that answers sees it (after a failover, the promoted replica; a paused master stays in
// the list until the others have replaced it). If no node answers, the masters the
// cluster was built with.
func (c *Cluster) Masters() []*Node {
	var out []*Node
	seen := make(map[string]bool)
	for _, r := range c.currentView() {
		if !seen[r.master] {
			seen[r.master] = true
			out = append(out, c.byAddr(r.master))
		}
	}
	return out
}

// MasterFor returns the master serving key's slot now (see Masters for whose view).
func (c *Cluster) MasterFor(key string) *Node {
	s := Slot(key)
	for _, r := range c.currentView() {
		if s >= r.lo && s <= r.hi {
			return c.byAddr(r.master)
		}
	}
	return nil // unreachable: views cover every slot
}

// Client returns a new go-redis cluster client seeded with every node, closed at the
// cleanup of the test that started the cluster. Options: DialTimeout, ReadTimeout and
// WriteTimeout 2 s, ClusterStateReloadInterval 1 s, the rest at go-redis defaults.
//
// The reload interval matters in outage drills: go-redis reloads its slot map only on a
// MOVED/ASK answer or when the map is older than ClusterStateReloadInterval (default
// 60 s). A paused master answers nothing, so with the default a client keeps sending
// that master's slots to it, timing out, for up to a minute after its replica took over.
func (c *Cluster) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs(), DialTimeout: 2 * time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		ClusterStateReloadInterval: time.Second,
		DisableIdentity:            true,
	})
	c.owner.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key, or of the
// part between the first "{" and the next "}" when that part is not empty, mod 16384.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % NumSlots
}
