package node

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/prometheus/client_golang/prometheus"
)

var start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeTransport keeps the ReporterConfig Build hands it.
type fakeTransport struct {
	rc           report.ReporterConfig
	closed, left int
}

func (f *fakeTransport) start(rc report.ReporterConfig) (Reporter, error) { f.rc = rc; return f, nil }
func (f *fakeTransport) Close() error                                     { f.closed++; return nil }
func (f *fakeTransport) Leave() error                                     { f.left++; return nil }

// rig is a us-east node of two equal regions, one rule of 100/s, on a fake clock.
func rig(t *testing.T, mod func(*Config)) (*Node, *fakeTransport, *clock.Fake, *rules.Holder) {
	t.Helper()
	clk := clock.NewFake(start)
	return rigOn(t, bucket.NewMemory(clk, 0), clk, mod)
}

// rigOn is rig over store st (a region's store several nodes share) on clk.
func rigOn(t *testing.T, st bucket.Store, clk *clock.Fake, mod func(*Config)) (*Node, *fakeTransport, *clock.Fake, *rules.Holder) {
	t.Helper()
	set, err := rules.ParseYAML([]byte("rules:\n  - id: default\n    limits: [{name: second, rate: 100, per: 1s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := rules.Compile(set, rules.CompileOptions{Region: "us-east", Regions: map[string]float64{"us-east": 1, "eu-west": 1}, Now: start})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Region, cfg.ID = "us-east", "us-east-1"
	cfg.Layers, cfg.Balanced, cfg.Reports = true, true, true
	cfg.Lease.SyncRefill = true // a dependency: Build sets it from Deps.Inline
	if mod != nil {
		mod(&cfg)
	}
	tr := &fakeTransport{}
	holder := rules.NewHolder(snap)
	n, err := Build(cfg, Deps{Rules: holder, Store: st, Clock: clk, Inline: true,
		Registerer: prometheus.NewRegistry(), Transport: tr.start})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, tr, clk, holder
}

// regionOfTwo is two nodes of us-east over one store (us-east-1 and us-east-2).
func regionOfTwo(t *testing.T) (clk *clock.Fake, a *Node, ta *fakeTransport, b *Node, tb *fakeTransport, holder *rules.Holder) {
	t.Helper()
	clk = clock.NewFake(start)
	st := bucket.NewMemory(clk, 0)
	a, ta, _, holder = rigOn(t, st, clk, nil)
	b, tb, _, _ = rigOn(t, st, clk, func(c *Config) { c.ID = "us-east-2" })
	return clk, a, ta, b, tb, holder
}

func TestBuildWiresTheNode(t *testing.T) {
	n, tr, clk, holder := rig(t, nil)
	c := n.Config()
	if !c.Shares.WaitForSet || !c.Shares.Reports || c.Shares.Region != "us-east" || c.Lease.SyncRefill || c.Check.Region != "us-east" {
		t.Fatalf("effective config: shares %+v, lease sync %v, check region %q", c.Shares, c.Lease.SyncRefill, c.Check.Region)
	}
	if n.Fallback() == nil || n.Lease() == nil || n.Store() != n.Fallback() {
		t.Fatal("layers: want fallback → lease over the store")
	}
	if tr.rc.Table != n.Usage() || tr.rc.Region != "us-east" || tr.rc.EnforcerID != "us-east-1" || tr.rc.AckGap != c.AckGap ||
		tr.rc.Shares == nil || tr.rc.Accepted == nil || tr.rc.SharesChanged != n.Shares().Changed() {
		t.Fatalf("the transport's config misses the node's wiring: %+v", tr.rc)
	}

	// The share table waits for its first set: min(default 0.5, floor 0.01).
	rule := holder.Current().Rule("default")
	if s := n.Shares().Share(rule, "key:k", clk.Now()); s != 0.01 {
		t.Fatalf("share before the set is read: %v, want the floor 0.01", s)
	}
	head := contract.Head{LeaderRev: 1, Version: 1, PublishedAt: clk.Now(), Entries: 1}
	entries := []contract.Entry{{Rule: "default", Identity: "key:k", Shares: map[string]float64{"us-east": 0.9, "eu-west": 0.1}}}
	n.Shares().Apply(head, entries, clk.Now())
	if rev, v := tr.rc.Shares(); rev != 1 || v != 1 {
		t.Fatalf("the reports' Shares hook: %d, %d, want the applied 1, 1", rev, v)
	}

	// The check core enforces the share, and the usage table judges pressure by it.
	d, err := n.Enforcer().Check(context.Background(), &enforcer.Request{Attrs: rules.Attrs{APIKey: "k"}})
	if err != nil || !d.Allowed {
		t.Fatalf("check: %+v, %v", d, err)
	}
	if u := n.Usage().Report(clk.Now()).Usage; len(u) != 1 || math.Abs(u[0].RegionalRate-90) > 1e-9 {
		t.Fatalf("report %v, want one entry at regional_rate 90 (100/s × 0.9)", u)
	}

	// Stale when reports go unheard: the set is refreshed, but no report was accepted
	// for Stale, so the share falls back to min(0.9, default 0.5).
	clk.Advance(c.Shares.Stale)
	head.PublishedAt = clk.Now()
	n.Shares().Apply(head, nil, clk.Now())
	if s := n.Shares().Share(rule, "key:k", clk.Now()); s != 0.5 {
		t.Fatalf("share with reports unheard for Stale: %v, want min(0.9, 0.5)", s)
	}
	tr.rc.Accepted(report.Acceptance{At: clk.Now(), Seq: 1})
	if s := n.Shares().Share(rule, "key:k", clk.Now()); s != 0.9 {
		t.Fatalf("share once a report is accepted: %v, want 0.9", s)
	}

	// A new process's share table: no set read.
	if err := n.ResetShares(); err != nil {
		t.Fatal(err)
	}
	if s := n.Shares().Share(rule, "key:k", clk.Now()); s != 0.01 {
		t.Fatalf("share after ResetShares: %v, want the floor", s)
	}
	if err := n.Leave(); err != nil || tr.left != 1 {
		t.Fatalf("Leave: %v, left %d", err, tr.left)
	}
	if err := errors.Join(n.Close(), n.Close()); err != nil || tr.closed != 1 {
		t.Fatalf("Close twice: %v, transport closed %d times", err, tr.closed)
	}
}

// An enforcer cut off from the balancer marks itself fenced in its region's store once its
// shares are stale, at every report it tries, and every enforcer of the region counts the
// marks in its reports (fenced_seen): the balancer keeps the region's default share
// reserved while it serves. Its mark is forgotten FenceTTL intervals after it stops.
func TestFencedEnforcerIsSeenByItsRegion(t *testing.T) {
	clk, a, ta, b, tb, _ := regionOfTwo(t)
	ctx := context.Background()
	var seq uint64
	next := func() uint64 { seq++; return seq }
	if ta.rc.Fences == nil || tb.rc.Fences == nil {
		t.Fatal("the reports' Fences hook is not wired over a store that keeps fences")
	}
	// Before its first set (a restart while etcd is unreachable) a node enforces
	// min(default, floor) and marks itself too: the balancer may have left its region less
	// than the floor (when the regions it holds leave no room for floors), never more than
	// its default share beside it.
	if n := ta.rc.Fences(ctx, clk.Now(), 0).Seen; n != 1 {
		t.Fatalf("fenced_seen %d before any set is loaded, want 1 (itself)", n)
	}
	head := contract.Head{LeaderRev: 1, Version: 1, PublishedAt: clk.Now()}
	a.Shares().Apply(head, nil, clk.Now())
	b.Shares().MarkLoaded() // etcd listed: nothing published
	ta.rc.Accepted(report.Acceptance{At: clk.Now(), Seq: next()})
	tb.rc.Accepted(report.Acceptance{At: clk.Now(), Seq: next()})
	if n := ta.rc.Fences(ctx, clk.Now(), 0).Seen; n != 0 {
		t.Fatalf("fenced_seen %d with every share table fresh, want 0", n)
	}
	// a is heard no more; b is (and its set is refreshed).
	stale := a.Config().Shares.Stale
	clk.Advance(stale - time.Second)
	tb.rc.Accepted(report.Acceptance{At: clk.Now(), Seq: next()})
	if n := ta.rc.Fences(ctx, clk.Now(), 0).Seen; n != 0 {
		t.Fatalf("fenced_seen %d before a's shares are stale, want 0", n)
	}
	clk.Advance(time.Second)
	if !a.Shares().Stale(clk.Now()) {
		t.Fatal("a's shares are not stale after Stale unheard")
	}
	if n := ta.rc.Fences(ctx, clk.Now(), 0).Seen; n != 1 {
		t.Fatalf("a's own count: fenced_seen %d, want 1 (itself)", n)
	}
	clk.Advance(5 * time.Second)
	if n := tb.rc.Fences(ctx, clk.Now(), 0).Seen; n != 1 {
		t.Fatalf("b's count: fenced_seen %d, want 1 (a)", n)
	}
	// a is heard again and reads a fresh set: its next report takes its mark back.
	ta.rc.Accepted(report.Acceptance{At: clk.Now(), Seq: next()})
	head.Version, head.PublishedAt = 2, clk.Now()
	a.Shares().Apply(head, nil, clk.Now())
	if n := ta.rc.Fences(ctx, clk.Now(), 0).Seen; n != 0 {
		t.Fatalf("fenced_seen %d once a is heard again, want 0", n)
	}
	// Cut off again; then it crashes: it marks nothing more, and FenceTTL intervals later
	// b counts none.
	clk.Advance(stale)
	if n := ta.rc.Fences(ctx, clk.Now(), 0).Seen; n != 1 {
		t.Fatalf("fenced_seen %d, want 1", n)
	}
	clk.Advance(FenceTTL * a.Config().Usage.Interval)
	tb.rc.Accepted(report.Acceptance{At: clk.Now(), Seq: next()})
	if n := tb.rc.Fences(ctx, clk.Now(), 0).Seen; n != 0 {
		t.Fatalf("fenced_seen %d after a stopped marking, want 0", n)
	}
}

func TestBuildWithoutBalancer(t *testing.T) {
	n, tr, clk, holder := rig(t, func(c *Config) { c.Layers, c.Balanced, c.Reports = false, false, false })
	if n.Usage() != nil || n.Fallback() != nil || n.Lease() != nil || tr.rc.Table != nil {
		t.Fatal("want the store alone, no usage table, no transport")
	}
	c := n.Config()
	if c.Shares.WaitForSet || c.Shares.Reports {
		t.Fatalf("shares %+v: a node without the balancer waits for no set and hears no reports", c.Shares)
	}
	if s := n.Shares().Share(holder.Current().Rule("default"), "key:k", clk.Now()); s != 0.5 {
		t.Fatalf("share %v, want the default split", s)
	}
}

func TestBuildRefusesMissingParts(t *testing.T) {
	cfg := DefaultConfig()
	if _, err := Build(cfg, Deps{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no region: %v", err)
	}
	cfg.Region, cfg.Reports = "us-east", true
	if _, err := Build(cfg, Deps{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("reports without an ID: %v", err)
	}
	cfg.ID = "e"
	deps := Deps{Rules: rules.NewHolder(nil), Store: bucket.NewMemory(clock.Real(), 0), Registerer: prometheus.NewRegistry()}
	if _, err := Build(cfg, deps); !errors.Is(err, ErrConfig) {
		t.Fatalf("reports without a transport: %v", err)
	}
}

func TestShareFloor(t *testing.T) {
	for _, tc := range []struct {
		regions int
		want    float64
	}{{0, 0.01}, {1, 0.01}, {2, 0.01}, {3, 0.01}, {4, 0.02 / 3}, {10, 0.02 / 9}} {
		if got := ShareFloor(tc.regions); got != tc.want {
			t.Errorf("ShareFloor(%d) = %v, want %v", tc.regions, got, tc.want)
		}
	}
}
