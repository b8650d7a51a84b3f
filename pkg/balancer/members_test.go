package balancer

import (
	"errors"
	"strings"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Reports through a region aggregator (ReportRequest.members, pkg/aggregator): the
// leader records each member as if it had reported itself.

// aggReport is an aggregator's forward at now for region: usage, and each member's
// applied version and how long ago it was heard (a member with reports > 0 contributed
// one 10 s report to the usage).
type aggMember struct {
	id      string
	ver     uint64
	ago     time.Duration
	reports uint32
}

func aggReport(region string, seq uint64, now time.Time, members []aggMember, usage ...*allotv1.IdentityUsage) *allotv1.ReportRequest {
	r := report(region, "agg-"+region, seq, now, usage...)
	r.ShareLeaderRev = 7
	for _, m := range members {
		r.Members = append(r.Members, &allotv1.Member{EnforcerId: m.id, ShareLeaderRev: 7, ShareVersion: m.ver,
			HeardAgoMs: m.ago.Milliseconds(), Reports: m.reports, CoveredMs: int64(m.reports) * 10_000})
	}
	return r
}

// TestIncreaseWaitsForEveryEnforcerBehindAggregator: a decrease in eu-west and ap-south
// is followed by us-east's increase only once both enforcers behind each region's
// aggregator acknowledged it; one of them silent is held exactly as a silent direct
// enforcer is: a twin core fed the same enforcers' reports directly publishes the same
// shares at every tick.
func TestIncreaseWaitsForEveryEnforcerBehindAggregator(t *testing.T) {
	mod := func(c *CoreConfig) { c.Learning, c.Stale, c.AckTimeout = time.Second, time.Minute, 5*time.Second }
	agg, direct := newTestCore(t, mod), newTestCore(t, mod)
	now := t0
	agg.Published(agg.Tick(now), now)
	direct.Published(direct.Tick(now), now)
	seq := uint64(0)
	var silentSince time.Time // e2 stops reporting then (zero: it reports)
	ingest := func(c *Core, r *allotv1.ReportRequest) {
		t.Helper()
		if err := c.Ingest(now, r); err != nil {
			t.Fatal(err)
		}
	}
	reportAll := func(v1, v2 uint64) {
		seq++
		for _, c := range []*Core{agg, direct} {
			east := report("us-east", "e-us-east", seq, now, use("key:a", 1000, 0))
			east.ShareLeaderRev, east.ShareVersion = 7, v1
			ingest(c, east)
		}
		for _, region := range []string{"eu-west", "ap-south"} {
			e2 := aggMember{"e2", v2, 0, 1}
			if !silentSince.IsZero() {
				e2 = aggMember{"e2", v2, now.Sub(silentSince), 0}
			}
			ingest(agg, aggReport(region, seq, now, []aggMember{{"e1", v1, 0, 1}, e2}, use("key:a", 0, 0)))
			for _, m := range []aggMember{{"e1", v1, 0, 1}, e2} {
				if m.reports == 0 {
					continue
				}
				r := report(region, m.id, seq, now, use("key:a", 0, 0))
				r.ShareLeaderRev, r.ShareVersion = 7, m.ver
				ingest(direct, r)
			}
		}
	}
	tick := func() (a, d *Publication) {
		a, d = agg.Tick(now), direct.Tick(now)
		agg.Published(a, now)
		direct.Published(d, now)
		if (a == nil) != (d == nil) || a != nil && (a.Head.Version != d.Head.Version || len(a.Entries) != len(d.Entries) ||
			len(a.Entries) > 0 && !sameShares(a.Entries[0].Shares, d.Entries[0].Shares)) {
			t.Fatalf("%v: through the aggregators %+v, direct %+v: they differ", now.Sub(t0), a, d)
		}
		return a, d
	}
	reportAll(1, 1)
	now = now.Add(10 * time.Second)
	p, _ := tick()
	raised := func(p *Publication) bool { return p != nil && p.Changed && p.Entries[0].Shares["us-east"] > 0.5 }
	if raised(p) {
		t.Fatal("raised at once")
	}
	dec := p.Head.Version
	if got := len(agg.regions[1].enforcers); got != 2 {
		t.Fatalf("eu-west tracks %d enforcers, want the aggregator's 2 members (not the aggregator)", got)
	}
	// e1 acknowledges at once, e2 is one version behind: no increase.
	for range 10 {
		now = now.Add(2 * time.Second)
		reportAll(dec, dec-1)
		if p, _ := tick(); raised(p) {
			t.Fatalf("raised %v after the decrease while e2 behind the aggregators had not acknowledged it", now.Sub(t0))
		}
	}
	// e2 falls silent (the aggregators keep listing it, heard longer ago): held as the
	// direct twin holds it, until it fenced itself and past.
	silentSince = now
	for now.Sub(silentSince) < 3*time.Minute {
		now = now.Add(2 * time.Second)
		reportAll(dec, dec-1)
		p, _ := tick()
		if raised(p) && now.Sub(silentSince) < time.Minute+5*time.Second {
			t.Fatalf("raised %v after e2 fell silent, before it fenced itself (Stale + AckTimeout = 65s)", now.Sub(silentSince))
		}
	}
}

func sameShares(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if d := v - b[k]; d > 1e-9 || d < -1e-9 {
			return false
		}
	}
	return true
}

// The same with e2 acknowledging through the aggregator: raised at once.
func TestAcknowledgementThroughAggregator(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.Learning = time.Second })
	now := t0
	c.Published(c.Tick(now), now)
	seq := uint64(0)
	reportAll := func(v uint64) {
		seq++
		east := report("us-east", "e-us-east", seq, now, use("key:a", 1000, 0))
		east.ShareLeaderRev, east.ShareVersion = 7, v
		if err := c.Ingest(now, east); err != nil {
			t.Fatal(err)
		}
		for _, region := range []string{"eu-west", "ap-south"} {
			if err := c.Ingest(now, aggReport(region, seq, now, []aggMember{{"e1", v, 0, 1}, {"e2", v, 300 * time.Millisecond, 1}})); err != nil {
				t.Fatal(err)
			}
		}
	}
	reportAll(1)
	now = now.Add(10 * time.Second)
	p := c.Tick(now)
	c.Published(p, now)
	now = now.Add(time.Second)
	reportAll(p.Head.Version)
	if p := c.Tick(now); p == nil || !p.Changed || p.Entries[0].Shares["us-east"] < 0.5 {
		t.Fatalf("every member acknowledged through its aggregator: %+v, want us-east raised", p)
	}
}

func TestIngestMembersRefusedAndDeduped(t *testing.T) {
	c := newTestCore(t, nil)
	now := t0
	ok := aggReport("eu-west", 1, now, []aggMember{{"e1", 0, 0, 1}})
	if err := c.Ingest(now, ok); err != nil {
		t.Fatal(err)
	}
	if err := c.Ingest(now, ok); err != nil { // a retry
		t.Fatal(err)
	}
	if s := c.Stats(now); s.Duplicates != 1 {
		t.Errorf("duplicates %d after a retried forward, want 1", s.Duplicates)
	}
	for name, m := range map[string]struct {
		mut  func(r *allotv1.ReportRequest)
		want string
	}{
		"empty id":  {func(r *allotv1.ReportRequest) { r.Members[0].EnforcerId = "" }, "members[0]: enforcer_id"},
		"twice":     {func(r *allotv1.ReportRequest) { r.Members = append(r.Members, r.Members[0]) }, "listed twice"},
		"final agg": {func(r *allotv1.ReportRequest) { r.Final = true }, "only a member leaves"},
		"negative":  {func(r *allotv1.ReportRequest) { r.Members[0].HeardAgoMs = -1 }, "heard_ago_ms -1"},
		"recent":    {func(r *allotv1.ReportRequest) { r.Members[0].RecentReports = 2 }, "recent_reports 2"},
		"future":    {func(r *allotv1.ReportRequest) { r.Members[0].ShareVersion = 99 }, `member "e1"`},
	} {
		r := aggReport("eu-west", 2, now, []aggMember{{"e1", 0, 0, 1}})
		m.mut(r)
		err := c.Ingest(now, r)
		if !errors.Is(err, ErrInvalidReport) || !strings.Contains(err.Error(), m.want) {
			t.Errorf("%s: %v, want ErrInvalidReport naming %q", name, err, m.want)
		}
	}
	// A final member leaves.
	fin := aggReport("eu-west", 3, now, []aggMember{{"e1", 0, 0, 0}})
	fin.Members[0].Final = true
	if err := c.Ingest(now, fin); err != nil {
		t.Fatal(err)
	}
	if n := len(c.regions[1].enforcers); n != 0 {
		t.Errorf("eu-west tracks %d enforcers after its only member's final report, want 0", n)
	}
}

// TestRegionSilentBehindAggregator: every enforcer of ap-south falls silent while its
// aggregator goes on forwarding (listing them, heard longer ago): the region is silent,
// then gone, exactly as if they had reported directly and stopped — the aggregator's own
// forwards never make the region look alive. A twin core publishes the same at every tick.
func TestRegionSilentBehindAggregator(t *testing.T) {
	mod := func(c *CoreConfig) { c.Learning, c.Stale, c.AckTimeout = time.Second, time.Minute, 5*time.Second }
	agg, direct := newTestCore(t, mod), newTestCore(t, mod)
	now := t0
	agg.Published(agg.Tick(now), now)
	direct.Published(direct.Tick(now), now)
	seq := uint64(0)
	ver := map[string]uint64{}
	var silentSince time.Time
	ingest := func(c *Core, r *allotv1.ReportRequest) {
		t.Helper()
		if err := c.Ingest(now, r); err != nil {
			t.Fatal(err)
		}
	}
	reportAll := func() {
		seq++
		for _, region := range regions3 {
			demand := map[string]float64{"us-east": 0, "eu-west": 400, "ap-south": 400}[region]
			if region == "ap-south" && !silentSince.IsZero() {
				last := silentSince.Add(-2 * time.Second) // their last report, as the direct twin's
				ms := []aggMember{{"e1", ver[region], now.Sub(last), 0}, {"e2", ver[region], now.Sub(last), 0}}
				ingest(agg, aggReport(region, seq, now, ms))
				continue
			}
			ingest(agg, aggReport(region, seq, now, []aggMember{{"e1", ver[region], 0, 1}, {"e2", ver[region], 0, 1}}, use("key:a", demand*10, 0)))
			for _, id := range []string{"e1", "e2"} {
				r := report(region, id, seq, now, use("key:a", demand*5, 0))
				r.ShareLeaderRev, r.ShareVersion = 7, ver[region]
				ingest(direct, r)
			}
		}
	}
	for now.Sub(t0) < 4*time.Minute {
		if now.Sub(t0) >= time.Minute && silentSince.IsZero() {
			silentSince = now
		}
		reportAll()
		now = now.Add(2 * time.Second)
		a, d := agg.Tick(now), direct.Tick(now)
		agg.Published(a, now)
		direct.Published(d, now)
		if (a == nil) != (d == nil) || a != nil && (a.Head.Version != d.Head.Version || len(a.Entries) != len(d.Entries) ||
			len(a.Entries) > 0 && !sameShares(a.Entries[0].Shares, d.Entries[0].Shares)) {
			t.Fatalf("%v: through the aggregators %+v, direct %+v: they differ", now.Sub(t0), a, d)
		}
		if a != nil && a.Changed {
			for _, region := range regions3 {
				if region != "ap-south" || silentSince.IsZero() {
					ver[region] = a.Head.Version // applied at once
				}
			}
		}
	}
	if got := agg.Stats(now).Regions[2].Enforcers; got != 0 {
		t.Errorf("ap-south still tracks %d enforcers 3 minutes after they fell silent, want 0 (fenced)", got)
	}
	if p := agg.Tick(now.Add(time.Second)); p != nil && len(p.Entries) > 0 && p.Entries[0].Shares["eu-west"] < 0.5 {
		t.Errorf("eu-west holds %v with ap-south gone: its share did not come back", p.Entries[0].Shares)
	}
}
