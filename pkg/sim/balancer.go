package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/pkg/aggregator"
	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer/node"
	"github.com/allot-dev/allot/pkg/enforcer/overrides"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/sim/scenario"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// The balancer's control plane in virtual mode. The enforcers' side (reports, share
// tables) runs on each region's clock; the balancer's (ticks, reports arriving,
// publication) on the coordinator's, at barriers (see Slice):
//
//   - every enforcer is a node.Build node with reports on: its usage table and share table
//     are the production ones, wired by the same function. This plane is its report
//     transport (node.Transport): it follows the Reporter's own report.Schedule — every
//     Interval at a phase of its own (spread evenly over the interval), early when the
//     table's refusals jumped, and early (AckGap after its last report) when the enforcer
//     applied a new share set — and a report reaches the balancer ReportDelay later. As
//     Table.Early wakes the Reporter's goroutine, the check that makes a table's refusals
//     jump wakes its virtual enforcer (world.runUntil);
//   - the balancer is the real balancer.Core, ticked as balancer.Service ticks it: at once
//     after an early, acknowledging or final report is ingested (the service's kick; the
//     reports of one instant make one tick), else TickEvery after the last tick or at
//     the core's NextTick when sooner (balancer.TickWait); each
//     Publication it
//     returns lands at once in the virtual etcd (the set as a Watcher would list it:
//     the head and the entries of the newest version) and reaches every enforcer's share
//     table (an overrides.Holder) Propagation (the scenario's) later;
//   - each enforcer enforces through its share table, with its staleness rules: it counts
//     staleness from its last refresh and from its last report the balancer accepted (the
//     reports' Accepted hook), and until it has read a set it enforces min(default,
//     floor). At the start the virtual etcd is empty, which each table has read.
//
// Faults: balancer-down (and leader-change, the same fault named for a short gap) drops
// every report and stops the ticks; when it ends a new leader (a new Core, LeaderRev one
// higher) restores the persisted set and learns again. region-isolated drops the region's
// reports and the sets sent to it; when it ends the region reads the set in force (after
// Propagation), as a Watcher re-listing would. enforcer-isolated does the same to one
// enforcer while its region-mates go on. region-restart gives every enforcer of the
// region a new process's id, an empty usage table and a share table that has read no set
// (node.ResetShares), cut off from the control plane until the fault ends; the old
// processes are gone without a final report (a crash), so the balancer holds what they
// acknowledged until their fence. Their leases and report phases stay.
//
// With aggregators (Options.Aggregate) every region's enforcers report to the region's
// aggregator — the real merge, aggregator.Merger, on the coordinator's clock — which
// forwards one report an Interval (at a phase of its own) and at most AckGap after its
// last when a report asks for one at once, as the Aggregator's loop does; a forward
// reaches the balancer ReportDelay later, and an enforcer counts itself heard as the
// aggregator's answer says (report.AcceptanceOf). The aggregator is in the region: a
// region cut off, or the balancer down, loses its forwards, not its enforcers' reports;
// an enforcer cut off alone loses its reports.

// Virtual-mode timing of the control plane.
const (
	ReportDelay = 50 * time.Millisecond // enforcer → balancer, one way
)

// TickEvery is the longest the balancer's core goes without a tick: the service's default
// (balancer.DefaultServiceConfig, the shipped tick_every), a multiple of Slice.
var TickEvery = balancer.DefaultServiceConfig().TickEvery

// reporter is one enforcer's report transport: what node.Build wired (the table, the
// hooks into the share table) and the Reporter's schedule.
type reporter struct {
	region, enf int
	rc          report.ReporterConfig
	id          string // rc.EnforcerID, then a restarted process's
	seq         uint64
	sched       report.Schedule
	regularAt   time.Time // the next regular report's event (the cadence)
	wakeAt      time.Time // a pending wake before it (zero: none)
	gen         int       // restarts so far (region-restart): a new process, a new id
	// cgen is gen as the coordinator knows it: a restart counts at once for the reports
	// arriving after it, and in the region (gen) at the end of the slice.
	cgen int
}

func (*reporter) Close() error { return nil } // nothing runs but on the virtual clock
func (*reporter) Leave() error { return nil }

// sent is a report on its way to the balancer.
type sent struct {
	at     time.Duration // arrival, since Epoch
	r      *allotv1.ReportRequest
	region int
	enf    int
	gen    int
}

type balancerPlane struct {
	sc   *scenario.Scenario
	w    *world
	cfg  balancer.CoreConfig
	core *balancer.Core
	reps [][]*reporter // [region][enforcer]
	// tickGen counts ticks: the timer's tick scheduled after tick n runs only if no other
	// tick came since (a kick restarts the timer, as the service's loop does). kicked: a
	// kick's tick is scheduled for this instant.
	tickGen uint64
	kicked  bool

	// outbox holds each region's reports sent since the last barrier (written by the
	// region's goroutine between barriers, read by the coordinator at them).
	outbox [][]sent
	// down, isolated, cutEnf and restarting are the control plane's faults, as the
	// coordinator's events set them (a fault starts and ends at a barrier's time); view
	// is the same as the regions see them, copied at every barrier (sync).
	faults
	view faults

	// the virtual etcd: the set as last written
	head    contract.Head
	entries []contract.Entry
	written bool
	// members as last written (contract.MembersKey); membersOK once they were
	members   contract.Members
	membersOK bool
	// what was written: versions (and when), bytes, recomputes of every core
	versionsAt []time.Duration
	bytes      int64
	layout     *contract.Chunker // which chunks each version rewrites, as the publisher does
	recomputes uint64
	// answersLost: reports the balancer (or an aggregator) took whose answer a fault
	// dropped on its way back (ControlPlane.AnswersLost).
	answersLost int
	// aggs: each region's aggregator (Options.Aggregate; nil without).
	aggs []*simAggregator
}

func newBalancerPlane(sc *scenario.Scenario, aggregate bool) (*balancerPlane, error) {
	p := &balancerPlane{sc: sc, layout: contract.NewChunker(0), reps: make([][]*reporter, len(sc.Regions)),
		outbox: make([][]sent, len(sc.Regions)), faults: newFaults(sc), view: newFaults(sc)}
	def := DefaultSplit(sc)
	idx := make(map[string]int, len(sc.Keys))
	for k, key := range sc.Keys {
		idx[key.Name] = k
	}
	cfg := balancer.DefaultCoreConfig()
	for _, r := range sc.Regions {
		cfg.Regions = append(cfg.Regions, r.Name)
	}
	cfg.Interval = sc.Interval
	cfg.Learning = 2 * sc.Interval
	cfg.SilentAfter = 2 * sc.Interval
	cfg.Limits = func(rule, _ string) (balancer.Limits, bool) {
		k, ok := idx[rule]
		if !ok {
			return balancer.Limits{}, false
		}
		l := sc.Keys[k].Limit
		return balancer.Limits{Rate: l.PerSecond(), Requests: l.Burst, Default: def}, true // every request costs 1
	}
	core, err := balancer.NewCore(cfg)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	p.cfg, p.core = cfg, core
	if aggregate {
		acfg := aggregator.DefaultConfig()
		acfg.Interval = sc.Interval
		for _, r := range sc.Regions {
			p.aggs = append(p.aggs, &simAggregator{m: aggregator.NewMerger(r.Name, acfg, Epoch), gap: acfg.AckGap})
		}
	}
	return p, nil
}

func (p *balancerPlane) name() string { return PolicyBalancer }

// initial: the rules carry the default split; the Holder scales from there.
func (p *balancerPlane) initial() [][]float64 { return newFixedPlane(p.sc, PolicyStatic).shares }

// transport is enforcer e of region r's report transport: this plane.
func (p *balancerPlane) transport(r, e int) node.Transport {
	return func(rc report.ReporterConfig) (node.Reporter, error) {
		if len(p.reps[r]) != e {
			return nil, fmt.Errorf("sim: region %s: enforcer %d built out of order", p.sc.Regions[r].Name, e)
		}
		t := rc.Table
		rep := &reporter{region: r, enf: e, rc: rc, id: rc.EnforcerID, sched: report.NewSchedule(t.Config(), rc.AckGap, t.Start())}
		p.reps[r] = append(p.reps[r], rep)
		return rep, nil
	}
}

// usageStart is when enforcer e of region r's usage table starts: the enforcers have been
// running for a while, their report phases spread evenly over the interval, the first
// report covering [phase − Interval, phase).
func (p *balancerPlane) usageStart(r, e int) time.Time {
	return Epoch.Add(p.phase(r, e) - p.sc.Interval)
}

func (p *balancerPlane) bind(w *world) error {
	p.w = w
	for _, reg := range w.regions {
		for _, n := range reg.nodes {
			n.Shares().MarkLoaded() // the virtual etcd is empty at the start: nothing published
		}
	}
	return nil
}

func (p *balancerPlane) start(w *world) {
	for r, rs := range p.reps {
		clk := w.regions[r].clk
		for e, rep := range rs {
			rep := rep
			// The schedule's regular reports fall on a chain of events, each scheduled an
			// Interval before it runs (so a regular report keeps its place among the events
			// of the same instant, whatever woke the enforcer in between); a wake the
			// schedule asks for sooner (an acknowledgement's AckGap, an early report's
			// EarlyGap) is an event of its own (wake), and a jump in the table's refusals
			// wakes it at the check that made it (region.onJump).
			var regular func()
			regular = func() {
				rep.regularAt = rep.regularAt.Add(p.sc.Interval)
				clk.at(rep.regularAt.Sub(Epoch), regular)
				p.wake(rep)
			}
			rep.regularAt = Epoch.Add(p.phase(r, e))
			clk.at(p.phase(r, e), regular)
			w.regions[r].onJump(e, rep.rc.Table.Early(), func() { p.wake(rep) })
		}
	}
	for r, a := range p.aggs {
		// Phases of their own, between the enforcers' (an aggregator starts with the first
		// interval).
		a.next = p.sc.Interval * time.Duration(2*r+1) / time.Duration(2*len(p.aggs))
		p.forwardAt(r, a.next)
	}
	p.tickAt(TickEvery)
}

// tickAt schedules the timer's next tick at t, unless another tick comes first.
func (p *balancerPlane) tickAt(t time.Duration) {
	if t >= p.sc.Duration {
		return
	}
	gen := p.tickGen
	p.w.clk.at(t, func() {
		if gen == p.tickGen {
			p.timerTick()
		}
	})
}

// timerTick is one pass of the service's loop: a tick, then the timer restarted.
func (p *balancerPlane) timerTick() {
	p.tickGen++
	p.tick()
	now := p.w.clk.Now()
	p.tickAt(p.w.clk.elapsed() + balancer.TickWait(p.core, now, TickEvery))
}

// wake is the Reporter's loop at one instant: it reports while the schedule says so, then
// sleeps until the schedule's Wake. It runs on the enforcer's regular reports, on the
// wakes the schedule asks for, and at the check that made its table's refusals jump (the
// Reporter's Table.Early; see world.runUntil).
func (p *balancerPlane) wake(rep *reporter) {
	clk := p.w.regions[rep.region].clk
	for {
		now := clk.Now()
		t := rep.rc.Table
		step := rep.sched.At(now, t.Start(), t.Jumped())
		if step.Report {
			p.report(rep, step)
			rep.sched.Reported(now)
			continue
		}
		if at := step.Wake; at.Before(rep.regularAt) && !at.Equal(rep.wakeAt) {
			rep.wakeAt = at
			clk.at(at.Sub(Epoch), func() {
				if rep.wakeAt.Equal(at) {
					rep.wakeAt = time.Time{}
				}
				p.wake(rep)
			})
		}
		return
	}
}

// phase is when enforcer e of region r first reports: the enforcers' phases are spread
// evenly over (0, Interval].
func (p *balancerPlane) phase(r, e int) time.Duration {
	i, total := 0, 0
	for q, reg := range p.sc.Regions {
		if q < r {
			i += reg.Enforcers
		}
		total += reg.Enforcers
	}
	return p.sc.Interval * time.Duration(i+e+1) / time.Duration(total)
}

// report drains rep's table and sends it to the balancer (unless cut off). It runs on the
// region's goroutine: the report waits in the region's outbox for the next barrier.
func (p *balancerPlane) report(rep *reporter, step report.Step) {
	now := p.w.regions[rep.region].clk.Now()
	r := rep.rc.Table.Report(now)
	rep.seq++
	r.Region, r.EnforcerId, r.Seq, r.Early, r.Ack = rep.rc.Region, rep.id, rep.seq, step.Early, step.Ack
	r.ShareLeaderRev, r.ShareVersion = rep.rc.Shares()
	if rep.rc.Fences != nil {
		// Marked and counted whether or not the report can leave: a cut-off enforcer
		// still reaches its region's store.
		f := rep.rc.Fences(context.Background(), now, r.Seq)
		r.FencedSeen, r.FenceMarks = f.Seen, f.Marks
	}
	if v := &p.view; p.aggs != nil && v.cutFromAggregator(rep.region, rep.enf) || p.aggs == nil && (v.down || v.cut(rep.region, rep.enf)) {
		return
	}
	p.outbox[rep.region] = append(p.outbox[rep.region], sent{at: now.Add(ReportDelay).Sub(Epoch), r: r,
		region: rep.region, enf: rep.enf, gen: rep.gen})
}

// sync shows the regions the control plane's faults as they stand at the barrier.
func (p *balancerPlane) sync() { p.faults.copyTo(&p.view) }

// barrier hands the reports sent during the slice to the coordinator, region by region,
// to arrive ReportDelay after they were sent (after this barrier).
func (p *balancerPlane) barrier() {
	for q, box := range p.outbox {
		for _, m := range box {
			m := m
			p.w.clk.at(m.at, func() {
				switch {
				case p.aggs != nil:
					p.relay(m)
				case !p.down: // the balancer went down while the report was on its way
					p.ingest(m)
				}
			})
		}
		p.outbox[q] = box[:0]
	}
}

func (p *balancerPlane) ingest(m sent) {
	// A report the core refuses is a bug of the simulator or of the core: there is no
	// operator to tell, so it is dropped; the tests see its effect on the figures.
	now := p.w.clk.Now()
	if p.core.Ingest(now, m.r) != nil {
		return
	}
	// The answer reaches the enforcer (unless it was cut off or restarted meanwhile): its
	// share table counts staleness from the last accepted report.
	if rep := p.reps[m.region][m.enf]; rep.cgen == m.gen && !p.cut(m.region, m.enf) {
		resp := &allotv1.ReportResponse{Accepted: true}
		resp.ShareLeaderRev, resp.ShareVersion = p.core.Newest()
		if a, ok := report.AcceptanceOf(now, m.r.Seq, resp); ok {
			p.w.effect(func() { rep.rc.Accepted(a) })
		}
	} else if rep.cgen == m.gen {
		p.answersLost++ // taken, and the cut began on the way: the enforcer never hears it
	}
	p.kickTick(m.r)
}

// kickTick: a shift, or an acknowledgement a change plan may be waiting for, in an
// ingested report: the service ticks the core at once (balancer.Service's kick), not at
// the next TickEvery, after the reports that arrive at the same instant.
func (p *balancerPlane) kickTick(r *allotv1.ReportRequest) {
	if balancer.AsksForTick(r) && !p.kicked {
		p.kicked = true
		p.w.clk.at(p.w.clk.elapsed(), func() { p.kicked = false; p.timerTick() })
	}
}

func (p *balancerPlane) tick() {
	if p.down {
		return
	}
	now := p.w.clk.Now()
	pub := p.core.Tick(now)
	if pub == nil {
		return
	}
	p.core.Published(pub, now)
	if pub.Changed {
		p.versionsAt = append(p.versionsAt, p.w.clk.elapsed())
		writes, _ := p.layout.Next(pub.Entries, pub.Head.LeaderRev, pub.Head.Version)
		for _, w := range writes { // what the balancer's publisher writes: the changed chunks
			p.bytes += int64(len(w.Data))
		}
	}
	if b, err := json.Marshal(pub.Head); err == nil {
		p.bytes += int64(len(b))
	}
	if pub.Members != nil {
		if b, err := json.Marshal(pub.Members); err == nil {
			p.bytes += int64(len(b))
		}
		p.members, p.membersOK = *pub.Members, true
	}
	if pub.Changed || !p.written {
		p.entries = pub.Entries
	}
	p.head, p.written = pub.Head, true
	for r := range p.reps {
		p.deliver(r, -1)
	}
}

// deliver sends the set in the virtual etcd to region r's enforcers (only enforcer e when
// e ≥ 0) that are not cut off, arriving after Propagation.
func (p *balancerPlane) deliver(r, e int) {
	head, entries, clk := p.head, p.entries, p.w.regions[r].clk
	written := p.written
	set := overrides.Prepare(p.sc.Regions[r].Name, head, entries) // built once for the region's enforcers
	for q, n := range p.w.regions[r].nodes {
		if (e >= 0 && q != e) || p.cut(r, q) {
			continue
		}
		q, n, rep := q, n, p.reps[r][q]
		apply := func() {
			if p.view.cut(r, q) {
				return
			}
			h := n.Shares()
			if !written { // nothing published yet: the list finds none
				h.MarkLoaded()
				return
			}
			if h.ApplyPrepared(set, clk.Now()) {
				// A new set swapped in (what Holder.Changed tells the Reporter): report early,
				// AckGap after the last report at the soonest, so the balancer sees the version
				// applied (what its change plan waits for before it publishes an increase).
				rep.sched.SharesChanged()
				p.wake(rep)
			}
		}
		at := p.w.clk.elapsed() + p.sc.Propagation
		p.w.effect(func() { clk.at(at, apply) })
	}
}

func (p *balancerPlane) fault(f scenario.Fault, on bool) {
	switch f.Kind {
	case scenario.BalancerDown, scenario.LeaderChange:
		p.down = on
		if !on {
			p.newLeader()
		}
	case scenario.RegionIsolated:
		p.isolated[f.Region] = on
		if !on {
			p.deliver(f.Region, -1)
		}
	case scenario.EnforcerIsolated:
		p.cutEnf[f.Region][f.Enforcer] = on
		if !on {
			p.deliver(f.Region, f.Enforcer)
		}
	case scenario.RegionRestart:
		p.restarting[f.Region] = on
		if on {
			p.restart(f.Region)
		} else {
			p.deliver(f.Region, -1)
		}
	}
}

// restart replaces every enforcer process of region r (see region-restart): a new id, an
// empty usage table, a share table that has read no set, no acknowledgement pending.
// Their leases, their report phases and the region's store stay (Redis is not restarted).
//
// The coordinator counts the new processes at once (cgen: the old ones' reports still on
// their way are dropped); the region replaces them at the end of the slice.
func (p *balancerPlane) restart(r int) {
	for _, rep := range p.reps[r] {
		rep.cgen++
	}
	p.w.effect(func() {
		now := p.w.regions[r].clk.Now()
		for e, rep := range p.reps[r] {
			if err := p.w.regions[r].nodes[e].ResetShares(); err != nil {
				continue // the config was valid at Build
			}
			t := rep.rc.Table
			t.Report(now) // the old process's counts die with it
			rep.gen++
			rep.id = fmt.Sprintf("%s-%d-r%d", p.sc.Regions[r].Name, e, rep.gen)
			rep.seq = 0
			rep.sched = report.NewSchedule(t.Config(), rep.rc.AckGap, rep.regularAt.Add(-p.sc.Interval))
		}
	})
}

// writes is the run's ControlPlane summary.
func (p *balancerPlane) writes(sc *scenario.Scenario) *ControlPlane {
	intervals := sc.Duration.Seconds() / sc.Interval.Seconds()
	secs := int(sc.Duration / time.Second)
	steady := make([]bool, secs)
	for s := Settle; s < secs; s++ {
		steady[s] = true
	}
	unsettle := func(at time.Duration) {
		for s := int(at / time.Second); s < min(secs, int(at/time.Second)+Settle); s++ {
			if s >= 0 {
				steady[s] = false
			}
		}
	}
	for _, k := range sc.Keys {
		for _, ph := range k.Phases {
			unsettle(ph.At)
		}
	}
	for _, f := range sc.Faults {
		for s := int(f.At / time.Second); s < min(secs, int(f.End()/time.Second)); s++ {
			steady[s] = false
		}
		unsettle(f.At)
		unsettle(f.End())
	}
	nSteady, vSteady := 0, 0
	for _, st := range steady {
		if st {
			nSteady++
		}
	}
	for _, at := range p.versionsAt {
		if s := int(at / time.Second); s < secs && steady[s] {
			vSteady++
		}
	}
	r6 := func(f float64) float64 { return math.Round(f*1e6) / 1e6 }
	cp := &ControlPlane{
		Versions: len(p.versionsAt), VersionsPerInterval: r6(float64(len(p.versionsAt)) / intervals),
		SteadySeconds: nSteady,
		BytesWritten:  p.bytes, BytesPerInterval: r6(float64(p.bytes) / intervals),
		Recomputes:  p.recomputes + p.core.Stats(p.w.clk.Now()).Recomputes,
		AnswersLost: p.answersLost,
	}
	if nSteady > 0 {
		cp.SteadyVersionsPerInterval = r6(float64(vSteady) / (float64(nSteady) / sc.Interval.Seconds()))
	}
	return cp
}

// newLeader replaces the core with a new leader's, restored from the virtual etcd.
func (p *balancerPlane) newLeader() {
	p.recomputes += p.core.Stats(p.w.clk.Now()).Recomputes
	cfg := p.cfg
	cfg.LeaderRev = p.cfg.LeaderRev + 1
	core, err := balancer.NewCore(cfg)
	if err != nil {
		return // the config was valid a moment ago
	}
	if p.written {
		// A fresh core accepts one Restore before it starts: an error here is impossible.
		_ = core.Restore(p.head, p.entries)
		_ = core.RestoreMembers(p.members, p.membersOK)
	}
	p.cfg, p.core = cfg, core
}

// share is the largest share any of region r's enforcers enforces for key k at now: they
// share the region's store, so the region admits at most that.
func (p *balancerPlane) share(r, k int, now time.Time) float64 {
	rule := p.w.regions[r].rules.Current().Rule(p.sc.Keys[k].Name)
	m := 0.0
	for _, n := range p.w.regions[r].nodes {
		m = max(m, n.Shares().Share(rule, p.w.keys[k].identity, now))
	}
	return m
}
