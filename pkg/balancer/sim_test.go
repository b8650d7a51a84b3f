package balancer

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/aggregator"
	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/contract"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

var regions3 = []string{"us-east", "eu-west", "ap-south"}

func equalSplit(rule, identity string) (Limits, bool) {
	if rule == "unknown" {
		return Limits{}, false
	}
	return Limits{Rate: 100, Requests: 200}, true
}

func testConfig() CoreConfig {
	cfg := DefaultCoreConfig()
	cfg.Regions = regions3
	cfg.Limits = equalSplit
	cfg.LeaderRev = 7
	return cfg
}

var t0 = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

// fakeEnf is an enforcer: it applies landed versions after a delay and reports.
type fakeEnf struct {
	region, id string
	seq        uint64
	rev        int64
	ver        uint64
	nextReport time.Time
	inbox      []delivery
	silent     bool // reports stop
	// cut: cut off from the whole control plane since cutAt (no set reaches it, no report
	// leaves it); it keeps enforcing what it applies, and after Stale (its own staleness
	// rule, pkg/enforcer/overrides) min(that, default).
	cut   bool
	cutAt time.Time
	// heard is when its last report was accepted: with reports on, its set goes stale
	// Stale after that (pkg/enforcer/overrides.Holder.Heard).
	heard time.Time
	left  bool // shut down: enforces nothing, reports nothing
	// crashed: with cut, the process is dead (enforces nothing) and marks nothing in its
	// region's store; a cut enforcer that did not crash marks itself fenced there once
	// stale, and its region-mates' reports count it (fenced_seen, pkg/bucket.Fences).
	crashed bool
	// alone: with cut, it fences itself as cut off alone (pkg/enforcer/node) at fenceAt —
	// min(share, default) from then — and marks itself in its region's store naming its
	// last accepted report's seq (markSeq, its seq then unless set), which its
	// region-mates' reports list (fence_marks).
	alone   bool
	fenceAt time.Time
	markSeq uint64
}

type delivery struct {
	at  time.Time
	pub *Publication
}

// world drives a core with enforcers on a virtual clock, one second a step, and checks
// the sums at every step.
type world struct {
	t       *testing.T
	c       *Core
	now     time.Time
	enfs    []*fakeEnf
	demand  func(now time.Time, region int) map[key]float64 // tokens/s per region
	delay   func() time.Duration                            // watch propagation
	sets    map[uint64]map[key][]float64                    // version → listed shares
	prev    map[int64]map[uint64]map[key][]float64          // earlier leaders' sets, by rev
	rev     int64
	lastVer time.Time // when the last new version was returned
	maxPub  float64
	maxAppl float64
	last    *Publication      // the set as last written (a new leader restores it)
	members *contract.Members // the members as last written (nil: none yet)
	// lastPhase is the last version's phase; recent: the enforcers report recent rates
	// (their demand over the last second, as report.Table does).
	lastPhase string
	recent    bool
	// aggs, when not nil: every region's enforcers report through an aggregator
	// (pkg/aggregator's merge), which forwards every Interval.
	aggs []*fakeAgg
}

// fakeAgg is a region's report aggregator: pkg/aggregator's merge (Merger), forwarding
// one report an Interval; an enforcer counts itself heard as the aggregator's answer says
// (what the leader last confirmed).
type fakeAgg struct {
	m    *aggregator.Merger
	next time.Time
	seq  uint64
}

// viaAggregators makes every region report through an aggregator from now.
func (w *world) viaAggregators() {
	w.aggs = make([]*fakeAgg, len(w.c.cfg.Regions))
	for r, name := range w.c.cfg.Regions {
		cfg := aggregator.DefaultConfig()
		cfg.Interval = w.c.cfg.Interval
		w.aggs[r] = &fakeAgg{m: aggregator.NewMerger(name, cfg, w.now), next: w.now.Add(time.Duration(r*3100+400) * time.Millisecond)}
	}
}

// send delivers an enforcer's report: to the leader, or to its region's aggregator.
func (w *world) send(e *fakeEnf, r int, req *allotv1.ReportRequest) {
	if w.aggs == nil {
		if err := w.c.Ingest(w.now, req); err != nil {
			w.t.Fatalf("ingest: %v", err)
		}
		e.heard = w.now
		return
	}
	resp, _, err := w.aggs[r].m.Add(w.now, req)
	if err != nil {
		w.t.Fatalf("aggregator: %v", err)
	}
	if resp.HeardAgoMs >= 0 {
		e.heard = w.now.Add(-time.Duration(resp.HeardAgoMs) * time.Millisecond)
	}
}

// forward sends region r's aggregator's merge when it is due.
func (w *world) forward(r int) {
	a := w.aggs[r]
	if w.now.Before(a.next) {
		return
	}
	a.next = a.next.Add(w.c.cfg.Interval)
	req := a.m.Flush(w.now)
	if req == nil {
		return
	}
	a.seq++
	req.EnforcerId, req.Seq = "agg-"+w.c.cfg.Regions[r], a.seq
	if err := w.c.Ingest(w.now, req); err != nil {
		w.t.Fatalf("ingest of %s's forward: %v", w.c.cfg.Regions[r], err)
	}
	resp := &allotv1.ReportResponse{Accepted: true}
	resp.ShareLeaderRev, resp.ShareVersion = w.c.Newest()
	a.m.Confirm(req, w.now, resp)
}

func newWorld(t *testing.T, c *Core, perRegion int) *world {
	w := &world{t: t, c: c, now: t0, sets: map[uint64]map[key][]float64{}, rev: c.cfg.LeaderRev,
		delay: func() time.Duration { return 500 * time.Millisecond }}
	for r, name := range c.cfg.Regions {
		for i := range perRegion {
			w.enfs = append(w.enfs, &fakeEnf{region: name, id: fmt.Sprintf("%s-%d", name, i),
				nextReport: t0.Add(time.Duration(r*1300+i*700) * time.Millisecond).Add(c.cfg.Interval)})
		}
	}
	return w
}

// shareOf is what an enforcer applying (rev, ver) enforces for k in region r.
func (w *world) shareOf(ver uint64, rev int64, k key, r int) float64 {
	l, _ := w.c.cfg.Limits(k.rule, k.identity)
	def := l.Default
	if def == nil {
		def = w.c.cfg.weightSplit()
	}
	sets := w.sets
	if rev != w.rev {
		sets = w.prev[rev]
	}
	if s, ok := sets[ver][k]; ok {
		return s[r]
	}
	return def[r]
}

// enforces is what e enforces for k now: its set's share, after Stale cut off
// min(that, default).
func (w *world) enforces(e *fakeEnf, k key, r int) float64 {
	if e.left || e.crashed {
		return 0
	}
	s := w.shareOf(e.ver, e.rev, k, r)
	if e.cut && (w.now.Sub(e.heard) >= w.c.cfg.Stale || e.alone && !w.now.Before(e.fenceAt)) {
		l, _ := w.c.cfg.Limits(k.rule, k.identity)
		def := l.Default
		if def == nil {
			def = w.c.cfg.weightSplit()
		}
		s = min(s, def[r])
	}
	return s
}

// newLeader replaces the core by a new leader's (LeaderRev one more), restored from the
// last set written, as the balancer's service does after an election.
func (w *world) newLeader(last *Publication) {
	cfg := w.c.cfg
	cfg.LeaderRev++
	c, err := NewCore(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := c.Restore(last.Head, last.Entries); err != nil {
		w.t.Fatal(err)
	}
	if w.members != nil {
		if err := c.RestoreMembers(*w.members, true); err != nil {
			w.t.Fatal(err)
		}
	}
	if w.prev == nil {
		w.prev = map[int64]map[uint64]map[key][]float64{}
	}
	w.prev[w.rev] = w.sets
	w.c, w.rev, w.sets, w.lastVer = c, cfg.LeaderRev, map[uint64]map[key][]float64{}, time.Time{}
}

func (w *world) step(d time.Duration) {
	end := w.now.Add(d)
	for w.now.Before(end) {
		w.now = w.now.Add(time.Second)
		w.tickOnce()
	}
}

func (w *world) tickOnce() {
	c := w.c
	n := len(c.cfg.Regions)
	for _, e := range w.enfs {
		if e.cut {
			e.inbox = e.inbox[:0]
		}
		keep := e.inbox[:0]
		for _, dl := range e.inbox {
			if !dl.at.After(w.now) {
				if dl.pub.Head.Version > e.ver || dl.pub.Head.LeaderRev != e.rev {
					e.rev, e.ver = dl.pub.Head.LeaderRev, dl.pub.Head.Version
				}
			} else {
				keep = append(keep, dl)
			}
		}
		e.inbox = keep
		if !w.now.Before(e.nextReport) && !e.silent && !e.cut && !e.left {
			r := c.regionIdx[e.region]
			per := 0
			for _, o := range w.enfs {
				if o.region == e.region {
					per++
				}
			}
			secs := c.cfg.Interval.Seconds()
			req := &allotv1.ReportRequest{Region: e.region, EnforcerId: e.id, Seq: e.seq + 1,
				IntervalStartMs: e.nextReport.Add(-c.cfg.Interval).UnixMilli(), IntervalEndMs: e.nextReport.UnixMilli(),
				ShareLeaderRev: e.rev, ShareVersion: e.ver}
			if w.recent {
				req.RecentWindowMs = 1000
			}
			for _, o := range w.enfs {
				if o.region != e.region || !o.cut || o.crashed || o.left {
					continue
				}
				if o.alone && !w.now.Before(o.fenceAt) {
					seq := o.markSeq
					if seq == 0 {
						seq = o.seq
					}
					req.FencedSeen++
					req.FenceMarks = append(req.FenceMarks, &allotv1.FenceMark{Enforcer: bucket.SightID(o.id), Seq: seq})
				} else if w.now.Sub(o.heard) >= c.cfg.Stale {
					req.FencedSeen++
				}
			}
			if w.demand != nil {
				for k, rate := range w.demand(w.now, r) {
					if rate > 0 || w.recent {
						u := &allotv1.IdentityUsage{Rule: k.rule, Identity: k.identity, Admitted: rate * secs / float64(per)}
						if w.recent {
							u.RecentRate = rate / float64(per)
						}
						req.Usage = append(req.Usage, u)
					}
				}
			}
			e.seq++
			w.send(e, r, req)
			e.nextReport = e.nextReport.Add(c.cfg.Interval)
		}
	}
	for r := range w.aggs {
		w.forward(r)
	}
	p := c.Tick(w.now)
	if p != nil && p.Changed {
		w.last = p
	}
	if p != nil && p.Members != nil {
		w.members = p.Members
	}
	if p == nil {
		w.check(n)
		return
	}
	if p.Changed {
		// A plan's continuation (the last version held increases back) and a shift's
		// version may follow at once; the rest wait MinVersionGap.
		if !w.lastVer.IsZero() && w.now.Sub(w.lastVer) < c.cfg.MinVersionGap && w.lastPhase != "decrease" && !w.recent {
			w.t.Fatalf("%v: version %d %v after the last, MinVersionGap %v", w.now, p.Head.Version, w.now.Sub(w.lastVer), c.cfg.MinVersionGap)
		}
		w.lastVer, w.lastPhase = w.now, p.Head.Phase
		set := map[key][]float64{}
		for _, en := range p.Entries {
			s := make([]float64, n)
			sum := 0.0
			for r, name := range c.cfg.Regions {
				s[r] = en.Shares[name]
				sum += s[r]
			}
			if err := en.Validate(); err != nil {
				w.t.Fatalf("entry: %v", err)
			}
			w.maxPub = max(w.maxPub, sum)
			if sum > 1+1e-9 {
				w.t.Fatalf("%v: version %d: published %s %s sums to %g", w.now, p.Head.Version, en.Rule, en.Identity, sum)
			}
			set[key{en.Rule, en.Identity}] = s
		}
		w.sets[p.Head.Version] = set
		if l := c.Stats(w.now).Listed; l != len(p.Entries) {
			w.t.Fatalf("Stats.Listed %d, publication lists %d", l, len(p.Entries))
		}
	}
	c.Published(p, w.now)
	if p.Changed {
		for _, e := range w.enfs {
			e.inbox = append(e.inbox, delivery{at: w.now.Add(w.delay()), pub: p})
		}
	}
	w.check(n)
}

// check: for every identity, Σ over regions of the largest share any of its enforcers
// applies is ≤ 1.
func (w *world) check(n int) {
	keys := map[key]bool{}
	for _, set := range w.sets {
		for k := range set {
			keys[k] = true
		}
	}
	for _, sets := range w.prev {
		for _, set := range sets {
			for k := range set {
				keys[k] = true
			}
		}
	}
	for k := range keys {
		sum := 0.0
		for r, name := range w.c.cfg.Regions {
			m := 0.0
			for _, e := range w.enfs {
				if e.region == name {
					m = max(m, w.enforces(e, k, r))
				}
			}
			sum += m
		}
		w.maxAppl = max(w.maxAppl, sum)
		if sum > 1+1e-9 {
			w.t.Fatalf("%v: applied shares of %v sum to %g", w.now, k, sum)
		}
	}
}

// published returns the shares of k in the newest version.
func (w *world) published(k key) []float64 {
	s := w.sets[w.c.Stats(w.now).Version][k]
	if s == nil {
		s = w.c.cfg.weightSplit()
	}
	return s
}

func TestPlanKeepsSumAtMostOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cfg := testConfig()
	c, err := NewCore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, c, 3)
	w.delay = func() time.Duration { return time.Duration(rng.IntN(4000)) * time.Millisecond } // < AckTimeout
	keys := []key{{"default", "key:a"}, {"default", "key:b"}, {"pro", "key:c"}, {"default", "key:d"}}
	rates := make([][]float64, len(keys))
	for i := range rates {
		rates[i] = make([]float64, 3)
	}
	w.demand = func(_ time.Time, r int) map[key]float64 {
		m := map[key]float64{}
		for i, k := range keys {
			m[k] = rates[i][r]
		}
		return m
	}
	for range 120 { // 120 shifts of 7-25 s: ~30 minutes
		for i := range keys {
			for r := range 3 {
				rates[i][r] = 0
				if rng.IntN(3) > 0 {
					rates[i][r] = float64(rng.IntN(200))
				}
			}
		}
		if rng.IntN(10) == 0 { // a region goes silent for a while
			for _, e := range w.enfs {
				e.silent = e.region == regions3[rng.IntN(3)]
			}
		} else {
			for _, e := range w.enfs {
				e.silent = false
			}
		}
		w.step(time.Duration(7+rng.IntN(19)) * time.Second)
	}
	st := c.Stats(w.now)
	if st.Version < 10 {
		t.Fatalf("only %d versions in 30 minutes of shifting traffic", st.Version)
	}
	t.Logf("versions %d, max published sum %.6f, max applied sum %.6f", st.Version, w.maxPub, w.maxAppl)
}
