package overrides

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var t0 = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

// compiled returns the rule "default" (30/s, burst 60) compiled for us-east of three equal
// regions: default share 1/3.
func compiled(t testing.TB) *rules.Compiled {
	t.Helper()
	set, err := rules.ParseYAML([]byte("rules:\n  - id: default\n    limits: [{name: second, rate: 30, per: 1s, burst: 60}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := rules.Compile(set, rules.CompileOptions{Region: "us-east", Now: t0,
		Regions: map[string]float64{"us-east": 1, "eu-west": 1, "ap-south": 1}})
	if err != nil {
		t.Fatal(err)
	}
	return snap.Rule("default")
}

func newHolder(t testing.TB, fc *clock.Fake, reg prometheus.Registerer) *Holder {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Region, cfg.Clock, cfg.Registerer = "us-east", fc, reg
	h, err := NewHolder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func entry(identity string, us, eu, ap float64) contract.Entry {
	return contract.Entry{Rule: "default", Identity: identity, Shares: map[string]float64{"us-east": us, "eu-west": eu, "ap-south": ap}}
}

func head(rev int64, ver uint64, at time.Time) contract.Head {
	return contract.Head{LeaderRev: rev, Version: ver, PublishedAt: at, Regions: []string{"us-east", "eu-west", "ap-south"}, Phase: "target"}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestHolderDefaultSplitBeforeAnySet(t *testing.T) {
	fc := clock.NewFake(t0)
	h := newHolder(t, fc, nil)
	r := compiled(t)
	if s := h.Share(r, "key:a", fc.Now()); !near(s, 1.0/3) {
		t.Fatalf("share %g, want the default 1/3", s)
	}
	if rev, ver := h.Applied(); rev != 0 || ver != 0 {
		t.Fatalf("applied %d/%d before any set", rev, ver)
	}
	fc.Advance(time.Hour)
	if h.Stale(fc.Now()) || !near(h.Share(r, "key:a", fc.Now()), 1.0/3) {
		t.Fatal("the default split is never stale")
	}
}

func TestHolderFencing(t *testing.T) {
	fc := clock.NewFake(t0)
	h := newHolder(t, fc, nil)
	r := compiled(t)
	now := fc.Now()
	if !h.Apply(head(5, 10, now), []contract.Entry{entry("key:a", 0.8, 0.1, 0.1)}, now) {
		t.Fatal("first set not applied")
	}
	for _, tc := range []struct {
		rev  int64
		ver  uint64
		want bool
	}{
		{4, 99, false}, // an older leader, whatever its version
		{5, 9, false},  // an older version of this leader
		{5, 10, false}, // the set in force
		{5, 11, true},  // this leader's next version
		{6, 1, true},   // a new leader starting its own count
		{5, 12, false}, // the deposed leader again
	} {
		got := h.Apply(head(tc.rev, tc.ver, now), []contract.Entry{entry("key:a", float64(tc.ver)/100, 0, 0)}, now)
		if got != tc.want {
			t.Fatalf("Apply(rev %d, ver %d) = %v, want %v", tc.rev, tc.ver, got, tc.want)
		}
	}
	if rev, ver := h.Applied(); rev != 6 || ver != 1 {
		t.Fatalf("applied %d/%d, want 6/1", rev, ver)
	}
	if s := h.Share(r, "key:a", now); !near(s, 0.01) {
		t.Fatalf("share %g, want the new leader's 0.01", s)
	}
	if s := h.Share(r, "key:b", now); !near(s, 1.0/3) {
		t.Fatalf("unlisted identity: share %g, want default", s)
	}
}

func TestHolderStaleness(t *testing.T) {
	fc := clock.NewFake(t0)
	h := newHolder(t, fc, nil)
	r := compiled(t)
	now := fc.Now()
	h.Apply(head(1, 1, now), []contract.Entry{
		entry("key:up", 0.8, 0.1, 0.1),   // above the default: falls to 1/3 when stale
		entry("key:down", 0.1, 0.8, 0.1), // below it: keeps 0.1
	}, now)
	step := func(at time.Duration, up, down float64, stale bool) {
		t.Helper()
		now := t0.Add(at)
		if got := h.Share(r, "key:up", now); !near(got, up) {
			t.Errorf("at %v: key:up share %g, want %g", at, got, up)
		}
		if got := h.Share(r, "key:down", now); !near(got, down) {
			t.Errorf("at %v: key:down share %g, want %g", at, got, down)
		}
		if h.Stale(now) != stale {
			t.Errorf("at %v: stale %v, want %v", at, !stale, stale)
		}
	}
	step(0, 0.8, 0.1, false)
	step(DefaultStale-time.Nanosecond, 0.8, 0.1, false)
	step(DefaultStale, 1.0/3, 0.1, true)
	step(time.Hour, 1.0/3, 0.1, true)

	// The balancer confirms the set (same version, later PublishedAt): fresh again.
	at := t0.Add(time.Hour)
	if h.Apply(head(1, 1, at), nil, at) {
		t.Fatal("a confirmation is not a swap")
	}
	step(time.Hour, 0.8, 0.1, false)
	step(time.Hour+DefaultStale, 1.0/3, 0.1, true)
	if got := h.Age(t0.Add(time.Hour + time.Minute)); got != time.Minute {
		t.Fatalf("age %v, want 1m", got)
	}
}

// A set last published long ago is old the moment it is read; a balancer clock ahead of
// ours cannot make one look fresher than when we read it.
func TestHolderFreshnessIsBoundedByReadTime(t *testing.T) {
	fc := clock.NewFake(t0)
	r := compiled(t)

	h := newHolder(t, fc, nil)
	h.Apply(head(1, 1, t0.Add(-time.Hour)), []contract.Entry{entry("key:a", 0.9, 0.05, 0.05)}, t0)
	if s := h.Share(r, "key:a", t0); !near(s, 1.0/3) {
		t.Fatalf("a set published an hour ago: share %g, want min(0.9, 1/3)", s)
	}

	h = newHolder(t, fc, nil)
	h.Apply(head(1, 1, t0.Add(time.Hour)), []contract.Entry{entry("key:a", 0.9, 0.05, 0.05)}, t0)
	if s := h.Share(r, "key:a", t0.Add(DefaultStale)); !near(s, 1.0/3) {
		t.Fatalf("a set stamped in the future goes stale Stale after it was read: share %g", s)
	}
}

func TestHolderEntryWithoutThisRegion(t *testing.T) {
	fc := clock.NewFake(t0)
	h := newHolder(t, fc, nil)
	r := compiled(t)
	h.Apply(head(1, 1, t0), []contract.Entry{
		{Rule: "default", Identity: "key:rest-small", Shares: map[string]float64{"eu-west": 0.7, "ap-south": 0.2}},
		{Rule: "default", Identity: "key:rest-big", Shares: map[string]float64{"eu-west": 0.1}},
		{Rule: "default", Identity: "key:bad", Shares: map[string]float64{"us-east": 0.9, "eu-west": 0.9}},
	}, t0)
	if s := h.Share(r, "key:rest-small", t0); !near(s, 0.1) {
		t.Fatalf("share %g, want 1 − 0.9", s)
	}
	if s := h.Share(r, "key:rest-big", t0); !near(s, 1.0/3) {
		t.Fatalf("share %g, want min(default, 0.9)", s)
	}
	if s := h.Share(r, "key:bad", t0); !near(s, 1.0/3) {
		t.Fatalf("an invalid entry (sum 1.8) is skipped: share %g, want the default", s)
	}
	if h.Len() != 2 {
		t.Fatalf("len %d, want 2", h.Len())
	}
}

func TestHolderMetrics(t *testing.T) {
	fc := clock.NewFake(t0)
	reg := prometheus.NewRegistry()
	h := newHolder(t, fc, reg)
	h.Apply(head(7, 3, t0), []contract.Entry{entry("key:a", 0.5, 0.25, 0.25)}, t0)
	h.Apply(head(6, 9, t0), nil, t0)
	fc.Advance(DefaultStale + time.Second)
	want := `
# HELP allot_shares_age_seconds Seconds since the balancer last confirmed the share set in force (since start before any set). Past the staleness period listed identities enforce min(last, default share).
# TYPE allot_shares_age_seconds gauge
allot_shares_age_seconds 301
# HELP allot_shares_cut_off 1 while this enforcer fenced itself as cut off from the control plane while its region's other enforcers are heard (identities enforce min(last, default share) until a report is accepted and a set read again), else 0.
# TYPE allot_shares_cut_off gauge
allot_shares_cut_off 0
# HELP allot_shares_entries Identities the share set in force lists (the rest keep the default split).
# TYPE allot_shares_entries gauge
allot_shares_entries 1
# HELP allot_shares_leader_rev Fencing token (the publishing leader's election revision) of the share set in force.
# TYPE allot_shares_leader_rev gauge
allot_shares_leader_rev 7
# HELP allot_shares_loaded 1 once a share set was loaded (or none is published); 0 while waiting for it, when every identity enforces min(default share, floor).
# TYPE allot_shares_loaded gauge
allot_shares_loaded 1
# HELP allot_shares_sets_total Share sets offered to this enforcer, by outcome: applied (swapped in) or ignored (not newer: an older leader or version).
# TYPE allot_shares_sets_total counter
allot_shares_sets_total{outcome="applied"} 1
allot_shares_sets_total{outcome="ignored"} 1
# HELP allot_shares_stale 1 when the share set in force is past the staleness period (identities enforce min(last, default share)), else 0.
# TYPE allot_shares_stale gauge
allot_shares_stale 1
# HELP allot_shares_version Version of the share set in force (0 before any).
# TYPE allot_shares_version gauge
allot_shares_version 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestHolderConfig(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Region = "" }, "region is empty"},
		{func(c *Config) { c.Stale = 0 }, "stale 0s, must be > 0"},
		{func(c *Config) { c.Stale = -time.Second }, "stale -1s, must be > 0"},
		{func(c *Config) { c.Clock = nil }, "clock is nil"},
		{func(c *Config) { c.Floor = -0.1 }, "floor -0.1, must be in [0, 1]"},
		{func(c *Config) { c.Floor = math.NaN() }, "floor NaN"},
	} {
		cfg := DefaultConfig()
		cfg.Region = "us-east"
		tc.mod(&cfg)
		if _, err := NewHolder(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}

// An enforcer restarted while etcd is unreachable (issue 21 §1d) does not know what the
// balancer gave its region: until a set is loaded it enforces min(default, Floor), the
// least the balancer leaves any region, never the default split (which with another
// region at 0.98 summed to 1.32).
func TestHolderBeforeTheSetIsLoaded(t *testing.T) {
	fc := clock.NewFake(t0)
	cfg := DefaultConfig()
	cfg.Region, cfg.Clock, cfg.WaitForSet = "us-east", fc, true
	h, err := NewHolder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := compiled(t)
	if s := h.Share(r, "key:a", fc.Now()); !near(s, DefaultFloor) || h.Loaded() {
		t.Fatalf("before the set: share %g loaded %v, want the floor %g and not loaded", s, h.Loaded(), DefaultFloor)
	}
	h.Apply(head(1, 1, t0), []contract.Entry{entry("key:b", 0.5, 0.25, 0.25)}, t0)
	if s := h.Share(r, "key:a", fc.Now()); !near(s, 1.0/3) || !h.Loaded() {
		t.Fatalf("after a set: share %g of an unlisted key, want the default 1/3", s)
	}
	// None published: the watcher's list marks it loaded.
	h2, _ := NewHolder(cfg)
	h2.MarkLoaded()
	if s := h2.Share(r, "key:a", fc.Now()); !near(s, 1.0/3) {
		t.Fatalf("loaded with no set: share %g, want the default 1/3", s)
	}
}

func TestShareAllocatesNothing(t *testing.T) {
	fc := clock.NewFake(t0)
	h := newHolder(t, fc, nil)
	r := compiled(t)
	h.Apply(head(1, 1, t0), []contract.Entry{entry("key:a", 0.5, 0.25, 0.25)}, t0)
	id := string([]byte("key:a")) // not the entry's own string
	if n := testing.AllocsPerRun(1000, func() { _ = h.Share(r, id, t0) }); n != 0 {
		t.Fatalf("Share allocates %v times", n)
	}
}

// BenchmarkShare is the lookup on the check path: a table of 100,000 identities looked
// up listed and unlisted in turn (most lookups miss the CPU caches), one of 1,024 (they
// stay in cache), and the empty table (no set: the default split for all).
func BenchmarkShare(b *testing.B) {
	fc := clock.NewFake(t0)
	r := compiled(b)
	small := newHolder(b, fc, nil)
	var ses []contract.Entry
	for i := range 1024 {
		ses = append(ses, entry(fmt.Sprintf("key:k%d", i), 0.5, 0.25, 0.25))
	}
	small.Apply(head(1, 1, t0), ses, t0)
	b.Run("listed-1k", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			_ = small.Share(r, ses[i&1023].Identity, t0)
		}
	})
	h := newHolder(b, fc, nil)
	const n = 100_000
	es := make([]contract.Entry, n)
	ids := make([]string, 2*n)
	for i := range es {
		es[i] = entry(fmt.Sprintf("key:k%d", i), 0.5, 0.25, 0.25)
		ids[2*i] = es[i].Identity
		ids[2*i+1] = fmt.Sprintf("key:other%d", i)
	}
	h.Apply(head(1, 1, t0), es, t0)
	b.Run("listed-100k", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			_ = h.Share(r, ids[(2*i)%len(ids)], t0)
		}
	})
	b.Run("unlisted-100k", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			_ = h.Share(r, ids[(2*i+1)%len(ids)], t0)
		}
	})
	b.Run("empty", func(b *testing.B) {
		e := newHolder(b, fc, nil)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			_ = e.Share(r, ids[i%len(ids)], t0)
		}
	})
}

// Checks read while sets are applied: each sees one whole set (race detector, and every
// answer is one of the versions' shares).
func TestHolderConcurrentApplyAndShare(t *testing.T) {
	fc := clock.NewFake(t0)
	h := newHolder(t, fc, nil)
	r := compiled(t)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := range 200 {
				ver := uint64(2*v + w + 1)
				h.Apply(head(1, ver, t0), []contract.Entry{entry("key:a", 0.5, 0.25, 0.25)}, t0)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 2000 {
			if s := h.Share(r, "key:a", t0); !near(s, 0.5) && !near(s, 1.0/3) {
				t.Errorf("share %g", s)
				return
			}
		}
	}()
	wg.Wait()
	if _, v := h.Applied(); v != 400 {
		t.Fatalf("version %d, want the highest, 400", v)
	}
}

// Changed signals a swapped-in set, once per pending signal, and not a mere refresh.
func TestHolderChangedSignalsNewSetsOnly(t *testing.T) {
	fc := clock.NewFake(t0)
	h := newHolder(t, fc, nil)
	now := fc.Now()
	pending := func() bool {
		select {
		case <-h.Changed():
			return true
		default:
			return false
		}
	}
	h.Apply(head(5, 10, now), []contract.Entry{entry("key:a", 0.8, 0.1, 0.1)}, now)
	h.Apply(head(5, 11, now), []contract.Entry{entry("key:a", 0.7, 0.2, 0.1)}, now)
	if !pending() || pending() {
		t.Fatal("two new sets should leave exactly one pending signal")
	}
	fc.Advance(time.Second)
	h.Apply(head(5, 11, fc.Now()), nil, fc.Now()) // the same version, refreshed
	if pending() {
		t.Fatal("a refresh of the set in force signalled a change")
	}
}

// With Reports, a set goes stale Stale after the last accepted usage report even while
// it keeps being refreshed: a region the balancer no longer hears from must be at
// min(last, default) by the time the balancer hands the rest to the others.
func TestHolderStaleWhenReportsGoUnheard(t *testing.T) {
	fc := clock.NewFake(t0)
	cfg := DefaultConfig()
	cfg.Region, cfg.Clock, cfg.Reports, cfg.Stale = "us-east", fc, true, time.Minute
	h, err := NewHolder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := compiled(t)
	apply := func() {
		now := fc.Now()
		h.Apply(head(5, 10, now), []contract.Entry{entry("key:a", 0.8, 0.1, 0.1)}, now)
	}
	apply()
	h.Heard(fc.Now())
	fc.Advance(50 * time.Second)
	apply() // refreshed; the report at t0 is 50 s old
	if got := h.Share(r, "key:a", fc.Now()); got != 0.8 {
		t.Fatalf("50 s after the last accepted report: share %g, want 0.8", got)
	}
	fc.Advance(10 * time.Second)
	apply() // refreshed again, but no report accepted for a minute
	if got := h.Share(r, "key:a", fc.Now()); got != r.Share || !h.Stale(fc.Now()) {
		t.Fatalf("a minute without an accepted report: share %g stale %v, want min(0.8, default %g) and stale", got, h.Stale(fc.Now()), r.Share)
	}
	h.Heard(fc.Now())
	if got := h.Share(r, "key:a", fc.Now()); got != 0.8 {
		t.Fatalf("heard again: share %g, want 0.8", got)
	}
}

// A prepared set is built once for the Holders of its region, which each swap it in (and
// refresh or ignore it by their own set); a Holder of another region reads its own share.
func TestApplyPrepared(t *testing.T) {
	fc := clock.NewFake(t0)
	r := compiled(t)
	a, b := newHolder(t, fc, nil), newHolder(t, fc, nil)
	cfg := DefaultConfig()
	cfg.Region, cfg.Clock = "eu-west", fc
	eu, err := NewHolder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	es := []contract.Entry{entry("key:a", 0.5, 0.3, 0.2), {Rule: "default", Identity: "key:bad", Shares: map[string]float64{"us-east": 2}}}
	p := Prepare("us-east", head(1, 1, t0), es)
	if !a.ApplyPrepared(p, t0) || !b.ApplyPrepared(p, t0) || !eu.ApplyPrepared(p, t0) {
		t.Fatal("a new set was not swapped in")
	}
	if a.cur.Load().invalid != 1 || b.Len() != 1 {
		t.Fatalf("invalid %d, entries %d: want the bad entry skipped", a.cur.Load().invalid, b.Len())
	}
	if sa, sb, se := a.Share(r, "key:a", t0), b.Share(r, "key:a", t0), eu.Share(r, "key:a", t0); !near(sa, 0.5) || !near(sb, 0.5) || !near(se, 0.3) {
		t.Fatalf("shares %g, %g (us-east) and %g (eu-west): want 0.5, 0.5 and 0.3", sa, sb, se)
	}
	if a.ApplyPrepared(p, t0.Add(time.Second)) {
		t.Fatal("the set in force was swapped in again")
	}
}

// Current: the set in force against the newest the leader had made when it took the last
// accepted report — a later leader's, or the same leader's at that version or later; when
// the leader did not say (an aggregator's answer, an older balancer), a set refreshed
// since the time given.
func TestCurrentAgainstTheLeadersNewest(t *testing.T) {
	fc := clock.NewFake(t0)
	h := newHolder(t, fc, nil)
	h.Apply(head(7, 3, t0), nil, t0)
	for _, tc := range []struct {
		rev  int64
		ver  uint64
		want bool
	}{{7, 3, true}, {7, 2, true}, {7, 4, false}, {6, 9, true}, {8, 1, false}} {
		h.HeardReport(fc.Now(), h.seq.Load()+1, tc.rev, tc.ver)
		if got := h.Current(t0); got != tc.want {
			t.Errorf("applying (7, 3), the leader's newest (%d, %d): Current %v, want %v", tc.rev, tc.ver, got, tc.want)
		}
	}
	h.HeardReport(fc.Now(), h.seq.Load()+1, 0, 0) // not said
	if h.Current(t0) || !h.Current(t0.Add(-time.Second)) {
		t.Error("not said: want Current only for a time before the set's refresh")
	}
}
