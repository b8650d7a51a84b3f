package balancer

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

func newTestCore(t *testing.T, mod func(*CoreConfig)) *Core {
	t.Helper()
	cfg := testConfig()
	if mod != nil {
		mod(&cfg)
	}
	c, err := NewCore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func report(region, enf string, seq uint64, end time.Time, usage ...*allotv1.IdentityUsage) *allotv1.ReportRequest {
	return &allotv1.ReportRequest{Region: region, EnforcerId: enf, Seq: seq,
		IntervalStartMs: end.Add(-10 * time.Second).UnixMilli(), IntervalEndMs: end.UnixMilli(), Usage: usage}
}

func use(identity string, admitted, refused float64) *allotv1.IdentityUsage {
	return &allotv1.IdentityUsage{Rule: "default", Identity: identity, Admitted: admitted, Refused: refused}
}

func TestCoreConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*CoreConfig)
		want string
	}{
		{func(c *CoreConfig) { c.Regions = nil }, "Regions is empty"},
		{func(c *CoreConfig) { c.Regions = []string{"us-east", "us-east"} }, `"us-east" listed twice`},
		{func(c *CoreConfig) { c.Regions = []string{"US East"} }, `Regions: "US East"`},
		{func(c *CoreConfig) { c.Weights = []float64{1, 0, 1} }, "Weights[1] 0"},
		{func(c *CoreConfig) { c.Weights = []float64{1} }, "Weights has 1 values for 3 regions"},
		{func(c *CoreConfig) { c.Interval = 0 }, "Interval 0s, must be > 0"},
		{func(c *CoreConfig) { c.AckTimeout = -time.Second }, "AckTimeout -1s"},
		{func(c *CoreConfig) { c.Stale = time.Second }, "Stale 1s, must be >= SilentAfter"},
		{func(c *CoreConfig) { c.StepGap = 3 * time.Second }, "StepGap 3s, must be in [0, MinVersionGap"},
		{func(c *CoreConfig) { c.MaxEntries = 0 }, "MaxEntries 0"},
		{func(c *CoreConfig) { c.MaxPublished = c.MaxIdentities + 1 }, "MaxPublished"},
		{func(c *CoreConfig) { c.LeaderRev = 0 }, "LeaderRev 0"},
		{func(c *CoreConfig) { c.Limits = nil }, "Limits is nil"},
	} {
		cfg := testConfig()
		tc.mod(&cfg)
		_, err := NewCore(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one naming %q", err, tc.want)
		}
	}
}

func TestIngestRefusesBadReports(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.MaxEntries = 2 })
	end := t0
	ok := func() *allotv1.ReportRequest { return report("us-east", "e1", 1, end, use("key:a", 5, 0)) }
	for name, mod := range map[string]func(r *allotv1.ReportRequest){
		"unknown region":   func(r *allotv1.ReportRequest) { r.Region = "mars" },
		"empty enforcer":   func(r *allotv1.ReportRequest) { r.EnforcerId = "" },
		"empty interval":   func(r *allotv1.ReportRequest) { r.IntervalStartMs = r.IntervalEndMs },
		"NaN admitted":     func(r *allotv1.ReportRequest) { r.Usage[0].Admitted = math.NaN() },
		"negative refused": func(r *allotv1.ReportRequest) { r.Usage[0].Refused = -1 },
		"infinite error":   func(r *allotv1.ReportRequest) { r.Usage[0].Error = math.Inf(1) },
		"omitted NaN":      func(r *allotv1.ReportRequest) { r.OmittedTokens = math.NaN() },
		"fenced_seen":      func(r *allotv1.ReportRequest) { r.FencedSeen = MaxFencedSeen + 1 },
		"empty identity":   func(r *allotv1.ReportRequest) { r.Usage[0].Identity = "" },
		"long rule":        func(r *allotv1.ReportRequest) { r.Usage[0].Rule = strings.Repeat("r", MaxNameLen+1) },
		"nil usage":        func(r *allotv1.ReportRequest) { r.Usage = append(r.Usage, nil) },
		"too many entries": func(r *allotv1.ReportRequest) { r.Usage = append(r.Usage, use("key:b", 1, 0), use("key:c", 1, 0)) },
		// A bad entry after a good one: the good one must not be counted either.
		"bad second entry": func(r *allotv1.ReportRequest) { r.Usage = append(r.Usage, use("key:b", -1, 0)) },
	} {
		r := ok()
		mod(r)
		if err := c.Ingest(t0, r); !errors.Is(err, ErrInvalidReport) {
			t.Errorf("%s: error %v, want ErrInvalidReport", name, err)
		}
	}
	if err := c.Ingest(t0, nil); !errors.Is(err, ErrInvalidReport) {
		t.Errorf("nil report: %v", err)
	}
	st := c.Stats(t0)
	if st.Tracked != 0 || st.Regions[0].Reports != 0 || st.Invalid != 14 {
		t.Fatalf("after refused reports: tracked %d, reports %d, invalid %d; want 0, 0, 14", st.Tracked, st.Regions[0].Reports, st.Invalid)
	}
	// The same seq, now valid, is not a duplicate: refused reports leave no trace.
	if err := c.Ingest(t0, ok()); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(t0); st.Tracked != 1 || st.Duplicates != 0 {
		t.Fatalf("tracked %d duplicates %d, want 1, 0", st.Tracked, st.Duplicates)
	}
}

func TestIngestDedupesSeq(t *testing.T) {
	c := newTestCore(t, nil)
	end := t0.Add(10 * time.Second)
	for _, seq := range []uint64{1, 2, 1, 2, 3} {
		if err := c.Ingest(end, report("us-east", "e1", seq, end, use("key:a", 100, 0))); err != nil {
			t.Fatal(err)
		}
	}
	// The same seq from another enforcer or region is a different report.
	if err := c.Ingest(end, report("us-east", "e2", 1, end, use("key:a", 100, 0))); err != nil {
		t.Fatal(err)
	}
	st := c.Stats(end)
	if st.Duplicates != 2 || st.Regions[0].Reports != 4 {
		t.Fatalf("duplicates %d reports %d, want 2, 4", st.Duplicates, st.Regions[0].Reports)
	}
	c.mu.Lock()
	got := c.ids[key{"default", "key:a"}].tokens(3)[0]
	c.mu.Unlock()
	if got != 400 {
		t.Fatalf("tokens %g, want 400 (each report once)", got)
	}
	// A restarted enforcer starts its seq again: not a duplicate.
	e := &enforcerState{}
	for seq := uint64(1); seq <= 200; seq++ {
		if e.seen(seq) {
			t.Fatalf("seq %d seen twice", seq)
		}
	}
	if !e.seen(150) || e.seen(1) || !e.seen(1) || e.seen(2) {
		t.Fatal("window: 150 is a retry, 1 after 200 is a restart, then a retry")
	}
}

func TestUnknownRuleIgnoredAndCounted(t *testing.T) {
	c := newTestCore(t, nil)
	u := &allotv1.IdentityUsage{Rule: "unknown", Identity: "key:a", Admitted: 5}
	if err := c.Ingest(t0, report("us-east", "e1", 1, t0, u, use("key:b", 1, 0))); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(t0); st.UnknownRule != 1 || st.Tracked != 1 {
		t.Fatalf("unknown %d tracked %d, want 1, 1", st.UnknownRule, st.Tracked)
	}
}

// hot is one identity's demand: rate tokens/s in region hotRegion(now), nothing elsewhere.
func hotDemand(k key, rate float64, region func(now time.Time) int) func(time.Time, int) map[key]float64 {
	return func(now time.Time, r int) map[key]float64 {
		if r == region(now) {
			return map[key]float64{k: rate}
		}
		return map[key]float64{k: 0}
	}
}

func TestSharesFollowShiftWithinTwoIntervals(t *testing.T) {
	c := newTestCore(t, nil)
	w := newWorld(t, c, 2)
	k := key{"default", "key:hot"}
	shift := t0.Add(2 * time.Minute)
	w.demand = hotDemand(k, 80, func(now time.Time) int {
		if now.Before(shift) {
			return 0
		}
		return 2
	})
	w.step(2 * time.Minute)
	// Demand 80 of a limit of 100: the region's share covers its demand (0.8), and the
	// slack goes by the default split (pkg/share).
	if s := w.published(k); s[0] < 0.8 {
		t.Fatalf("before the shift: shares %v, want us-east ≥ 0.8", s)
	}
	w.step(2 * c.cfg.Interval)
	s := w.published(k)
	if s[2] < 0.5 || s[0] > 0.5 {
		t.Fatalf("two intervals after the shift: shares %v, want ap-south ≥ 0.5 and us-east ≤ 0.5", s)
	}
	w.step(2 * c.cfg.Interval)
	if s := w.published(k); s[2] < 0.8 {
		t.Fatalf("four intervals after the shift: shares %v, want ap-south ≥ 0.8", s)
	}
}

func TestIncreaseWaitsForAcknowledgement(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.AckTimeout = time.Hour; c.Learning = time.Second })
	k := key{"default", "key:a"}
	now := t0
	seq := uint64(0)
	reportAll := func(ver uint64, rate []float64) {
		seq++
		for r, name := range regions3 {
			rq := report(name, "e-"+name, seq, now, use(k.identity, rate[r]*10, 0))
			rq.ShareLeaderRev, rq.ShareVersion = 7, ver
			if err := c.Ingest(now, rq); err != nil {
				t.Fatal(err)
			}
		}
	}
	tick := func() *Publication {
		p := c.Tick(now)
		c.Published(p, now)
		return p
	}
	tick() // version 1: the empty set of this term
	reportAll(1, []float64{100, 0, 0})
	now = now.Add(10 * time.Second)
	p := tick()
	if !p.Changed || p.Head.Version != 2 {
		t.Fatalf("recompute: %+v, want version 2", p.Head)
	}
	// From the default split (1/3 each) to us-east: its increase needs the others'
	// decreases acknowledged first, so version 2 holds only the decreases.
	if s := p.Entries[0].Shares; s["us-east"] > 1.0/3+1e-9 || p.Head.Phase != "decrease" {
		t.Fatalf("version 2 %v phase %q: us-east raised before the decreases were acknowledged", s, p.Head.Phase)
	}
	now = now.Add(time.Second)
	if p := tick(); p != nil {
		t.Fatalf("no acknowledgement yet, got %+v", p.Head)
	}
	// eu-west and ap-south apply version 2; us-east still on 1 does not matter (it is the
	// one increasing), but the region acks are per region: all three report 2.
	reportAll(2, []float64{100, 0, 0})
	now = now.Add(time.Second)
	p = tick()
	if p == nil || !p.Changed || p.Entries[0].Shares["us-east"] < 0.9 || p.Head.Phase != "target" {
		t.Fatalf("after the acknowledgement: %+v, want us-east raised", p)
	}
}

// TestIncreaseWaitsForReportsNotTime: a decrease counts as applied only when the region's
// enforcers report it — a region cut off from etcd would otherwise go on enforcing its
// old, larger share beside the others' increases. However long it lasts.
func TestIncreaseWaitsForReportsNotTime(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.Learning = time.Second })
	now := t0
	c.Published(c.Tick(now), now)
	seq := uint64(0)
	reportAll := func(ver uint64) {
		seq++
		for r, name := range regions3 {
			rq := report(name, "e-"+name, seq, now, use("key:a", float64(1000*max(1-r, 0)), 0))
			rq.ShareLeaderRev, rq.ShareVersion = 7, ver
			if err := c.Ingest(now, rq); err != nil {
				t.Fatal(err)
			}
		}
	}
	reportAll(1)
	now = now.Add(10 * time.Second)
	p := c.Tick(now)
	c.Published(p, now)
	raised := func(p *Publication) bool { return p != nil && p.Changed && p.Entries[0].Shares["us-east"] > 0.5 }
	if raised(p) {
		t.Fatal("raised at once")
	}
	dec := p.Head.Version
	for range 30 { // a minute of reports still applying the version before the decrease
		now = now.Add(2 * time.Second)
		reportAll(dec - 1)
		if p := c.Tick(now); raised(p) {
			t.Fatalf("raised %v after the decrease, which no report acknowledged", now.Sub(t0))
		} else if p != nil {
			c.Published(p, now)
		}
	}
	now = now.Add(2 * time.Second)
	reportAll(dec)
	if p := c.Tick(now); !raised(p) {
		t.Fatalf("not raised once every region reported the decrease: %+v", p)
	}
}

func TestHeadRefreshWithoutChange(t *testing.T) {
	c := newTestCore(t, nil)
	now := t0
	p := c.Tick(now)
	if p == nil || !p.Changed || p.Head.Version != 1 || p.Head.LeaderRev != 7 {
		t.Fatalf("first tick: %+v, want version 1 of rev 7", p)
	}
	if p2 := c.Tick(now); p2 == nil || p2.Head.Version != 1 || !p2.Changed {
		t.Fatalf("unconfirmed write not retried: %+v", p2)
	}
	c.Published(p, now)
	if p := c.Tick(now.Add(time.Second)); p != nil {
		t.Fatalf("nothing due, got %+v", p.Head)
	}
	p = c.Tick(now.Add(c.cfg.Interval))
	if p == nil || p.Changed || p.Entries != nil || p.Head.Version != 1 || !p.Head.PublishedAt.Equal(now.Add(c.cfg.Interval)) {
		t.Fatalf("head refresh: %+v", p)
	}
}

func restoredSet() (contract.Head, []contract.Entry) {
	head := contract.Head{LeaderRev: 3, Version: 41, Chunks: 1, Entries: 1, Regions: regions3}
	return head, []contract.Entry{{Rule: "default", Identity: "key:a", Shares: map[string]float64{"us-east": 0.8, "eu-west": 0.1, "ap-south": 0.1}},
		{Rule: "unknown", Identity: "key:z", Shares: map[string]float64{"us-east": 1}}}
}

func TestRestoreThenLearning(t *testing.T) {
	c := newTestCore(t, nil)
	if err := c.Restore(restoredSet()); err != nil {
		t.Fatal(err)
	}
	now := t0
	p := c.Tick(now)
	if p == nil || !p.Changed || p.Head.Version != 42 || p.Head.LeaderRev != 7 || len(p.Entries) != 1 || p.Entries[0].Shares["us-east"] != 0.8 {
		t.Fatalf("first publication of the new term: %+v", p)
	}
	c.Published(p, now)
	if err := c.Restore(restoredSet()); !errors.Is(err, ErrRestoreLate) {
		t.Fatalf("second restore: %v", err)
	}
	// Only ap-south reports, all traffic there: no reallocation until Learning.
	for i := 1; now.Sub(t0) < c.cfg.Learning-time.Second; i++ {
		now = now.Add(time.Second)
		if i%10 == 0 {
			_ = c.Ingest(now, report("ap-south", "e1", uint64(i), now, use("key:a", 500, 0)))
		}
		if p := c.Tick(now); p != nil {
			c.Published(p, now)
			if p.Changed {
				t.Fatalf("%v into learning: new version %d", now.Sub(t0), p.Head.Version)
			}
		}
	}
	if st := c.Stats(now); !st.Learning || st.Recomputes != 0 {
		t.Fatalf("learning %v recomputes %d", st.Learning, st.Recomputes)
	}
	now = t0.Add(c.cfg.Learning)
	p = c.Tick(now)
	// us-east and eu-west have not been heard in this term: they may still be applying an
	// older version of the old leader (their shares of it unknown), so they are held at
	// what they had and ap-south gets nothing more yet (never over).
	if st := c.Stats(now); st.Learning || st.Recomputes != 1 || (p != nil && p.Changed) {
		t.Fatalf("at the end of learning: learning %v recomputes %d publication %+v", st.Learning, st.Recomputes, p)
	}
	// Once they report applying this term's versions, ap-south gets the rest.
	for i := range 60 {
		now = now.Add(time.Second)
		if i%5 == 0 {
			for r, name := range regions3 {
				var u []*allotv1.IdentityUsage
				if r == 2 {
					u = append(u, use("key:a", 500, 0))
				}
				rep := report(name, "e1", uint64(100+i), now, u...)
				rep.ShareLeaderRev, rep.ShareVersion = 7, c.Stats(now).Version
				_ = c.Ingest(now, rep)
			}
		}
		if p := c.Tick(now); p != nil {
			c.Published(p, now)
		}
	}
	if s, _ := c.Identity("default", "key:a"); s.Published[2] < 0.6 {
		t.Fatalf("after every region reported this term's version: shares %v, want ap-south ≥ 0.6 (its 50/s and a part of the slack)", s.Published)
	}
}

func TestLearningEndsWhenEveryRegionReported(t *testing.T) {
	c := newTestCore(t, nil)
	if err := c.Restore(restoredSet()); err != nil {
		t.Fatal(err)
	}
	now := t0
	c.Published(c.Tick(now), now)
	for i, name := range regions3 {
		now = now.Add(time.Second)
		_ = c.Ingest(now, report(name, "e1", 1, now, use("key:a", 10, 0)))
		c.Published(c.Tick(now), now)
		if st := c.Stats(now); st.Learning != (i < 2) {
			t.Fatalf("after %d regions reported: learning %v", i+1, st.Learning)
		}
	}
}

func TestSilentRegionHeldThenStale(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.Stale = 2 * time.Minute; c.KeyTTL = time.Hour })
	w := newWorld(t, c, 1)
	k := key{"default", "key:a"}
	// ap-south is busy, the others idle; then ap-south goes silent and the traffic is in
	// us-east.
	silentAt := t0.Add(time.Minute)
	w.demand = hotDemand(k, 90, func(now time.Time) int {
		switch {
		case now.Before(silentAt):
			return 2
		case now.Before(silentAt.Add(30 * time.Second)):
			return -1 // ap-south not heard, nobody else busy yet
		}
		return 0
	})
	w.step(time.Minute)
	last := w.published(k)[2]
	if last < 0.9 {
		t.Fatalf("ap-south share %g before silence, want ≥ 0.9", last)
	}
	for _, e := range w.enfs {
		e.silent = e.region == "ap-south"
	}
	w.step(90 * time.Second) // silent, not yet stale
	if s := w.published(k); math.Abs(s[2]-last) > 1e-9 || s[0]+s[1] > 1-last+1e-9 {
		t.Fatalf("silent ap-south: shares %v, want it held at %g and the others within the rest", s, last)
	}
	// Stale (2 min after its last report): held at min(last, default) = 1/3. Its
	// enforcers have gone stale by their own clocks by then (no share refresh, or no
	// report accepted, for Stale: pkg/enforcer/overrides), so once AckTimeout more has passed (a
	// report's round trip) the others get the rest without an acknowledgement.
	w.step(50 * time.Second) // 140 s after its last report
	if s := w.published(k); math.Abs(s[2]-1.0/3) > 1e-9 {
		t.Fatalf("stale ap-south: shares %v, want it held at 1/3", s)
	}
	w.step(2 * c.cfg.Interval)
	if s := w.published(k); s[0] < 0.6 {
		t.Fatalf("Stale + AckTimeout after ap-south's last report: shares %v, want us-east ≈ 2/3", s)
	}
}

func TestKeyTTLReturnsToDefault(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.KeyTTL = time.Minute })
	w := newWorld(t, c, 1)
	k := key{"default", "key:a"}
	gone := t0.Add(time.Minute)
	w.demand = func(now time.Time, r int) map[key]float64 {
		if now.Before(gone) && r == 1 {
			return map[key]float64{k: 50}
		}
		return nil
	}
	w.step(time.Minute)
	if s := w.published(k); s[1] < 0.5 { // demand 50 of 100, met
		t.Fatalf("busy in eu-west: shares %v, want eu-west ≥ 0.5", s)
	}
	w.step(c.cfg.KeyTTL + 3*c.cfg.Interval)
	st := c.Stats(w.now)
	if _, listed := w.sets[st.Version][k]; listed || st.Tracked != 0 || st.Evicted != 1 {
		t.Fatalf("after KeyTTL: listed %v tracked %d evicted %d, want back at the default split and forgotten", listed, st.Tracked, st.Evicted)
	}
	// Never through zero: every version on the way gave each region ≥ the smaller of its
	// busy and default shares (the plan moves between them).
	for v, set := range w.sets {
		if s, ok := set[k]; ok {
			for r := range s {
				if s[r] < 0.01-1e-9 {
					t.Fatalf("version %d: %v share %g for %s", v, s, s[r], regions3[r])
				}
			}
		}
	}
}

func TestMaxIdentitiesEvictsLeastDemanded(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.MaxIdentities, c.MaxPublished = 8, 2; c.Learning = time.Second })
	now := t0
	c.Published(c.Tick(now), now)
	var us []*allotv1.IdentityUsage
	for i := range 20 {
		us = append(us, use("key:"+string(rune('a'+i)), float64(10*(i+1)), 0))
	}
	if err := c.Ingest(now, report("us-east", "e1", 1, now, us...)); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(now); st.Tracked != 8 || st.Dropped != 12 {
		t.Fatalf("tracked %d dropped %d, want 8 (MaxIdentities; us-east is past its part of 8 + 1/8) and 12", st.Tracked, st.Dropped)
	}
	// Another region still adds its own past MaxIdentities.
	if err := c.Ingest(now, report("ap-south", "e1", 1, now, use("key:zz", 500, 0))); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(now); st.Tracked != 9 {
		t.Fatalf("tracked %d after ap-south's new identity, want 9", st.Tracked)
	}
	now = now.Add(10 * time.Second)
	p := c.Tick(now)
	c.Published(p, now)
	if st := c.Stats(now); st.Tracked != 8 || st.Evicted != 1 {
		t.Fatalf("after recompute: tracked %d evicted %d, want 8, 1", st.Tracked, st.Evicted)
	}
	for now2 := now; now2.Before(now.Add(time.Minute)); now2 = now2.Add(time.Second) {
		if p := c.Tick(now2); p != nil {
			c.Published(p, now2)
			if len(p.Entries) > 2 {
				t.Fatalf("%d entries published, MaxPublished 2", len(p.Entries))
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.ids[key{"default", "key:a"}]; ok {
		t.Fatal("the least demanded identity is still tracked")
	}
}

// A report flagged early (refusals jumped at its enforcer) asks for no recompute by the
// flag alone: on 2,000 keys those recomputes republished noise (8.1 versions a steady
// interval, 2.8 without). Its recent rates do, when they show a move (TestArrivalJudgedByItsCount).
func TestEarlyFlagAsksNoRecompute(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.Learning = time.Second })
	now := t0
	c.Published(c.Tick(now), now)
	for i, name := range regions3 {
		_ = c.Ingest(now, report(name, "e1", 1, now, use("key:a", float64(100*(1-min(i, 1))), 0)))
	}
	now = now.Add(time.Second)
	c.Published(c.Tick(now), now) // learning over: the first recompute
	if st := c.Stats(now); st.Recomputes != 1 {
		t.Fatalf("recomputes %d, want 1", st.Recomputes)
	}
	for seq := uint64(2); seq < 6; seq++ {
		now = now.Add(time.Second)
		rq := report("eu-west", "e1", seq, now, use("key:a", 0, 500))
		rq.Early = true
		if err := c.Ingest(now, rq); err != nil {
			t.Fatal(err)
		}
		c.Published(c.Tick(now), now)
		if st := c.Stats(now); st.Recomputes != 1 {
			t.Fatalf("early report %v after the last recompute: recomputes %d, want still 1", now.Sub(t0.Add(time.Second)), st.Recomputes)
		}
	}
	now = t0.Add(time.Second + c.cfg.Interval)
	c.Published(c.Tick(now), now)
	if st := c.Stats(now); st.Recomputes != 2 {
		t.Fatalf("interval due: recomputes %d, want 2", st.Recomputes)
	}
}

func TestTooManyEnforcersRefused(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.MaxEnforcers = 2 })
	for i, id := range []string{"e1", "e2", "e3"} {
		err := c.Ingest(t0, report("us-east", id, 1, t0))
		if (i < 2) != (err == nil) || (i == 2 && !errors.Is(err, ErrTooManyEnforcers)) {
			t.Fatalf("enforcer %s: %v", id, err)
		}
	}
	if err := c.Ingest(t0, report("eu-west", "e3", 1, t0)); err != nil {
		t.Fatalf("the cap is per region: %v", err)
	}
}

// lowest puts the m least demanded first, as a sort would (up to ties), for any m.
func TestLowestSelectsLikeASort(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		n := 1 + rng.IntN(300)
		rs := make([]ranked, n)
		for i := range rs {
			rs[i].d = float64(rng.IntN(20)) // many ties
		}
		sorted := make([]float64, n)
		for i := range rs {
			sorted[i] = rs[i].d
		}
		slices.Sort(sorted)
		m := rng.IntN(n + 1)
		got := lowest(rs, m)
		if len(got) != m {
			t.Fatalf("trial %d: %d returned, want %d", trial, len(got), m)
		}
		ds := make([]float64, m)
		for i := range got {
			ds[i] = got[i].d
		}
		slices.Sort(ds)
		if !slices.Equal(ds, sorted[:m]) {
			t.Fatalf("trial %d: n %d m %d: got %v, want %v", trial, n, m, ds, sorted[:m])
		}
	}
}
