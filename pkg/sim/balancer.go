package sim

import (
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/shares"
	"github.com/allot-dev/allot/pkg/shareset"
	"github.com/allot-dev/allot/pkg/sim/scenario"
	"github.com/allot-dev/allot/pkg/usage"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// The balancer's control plane in virtual mode. The enforcers' side (reports, share
// tables) runs on each region's clock; the balancer's (ticks, reports arriving,
// publication) on the coordinator's, at barriers (see Slice):
//
//   - every enforcer has a real usage.Table (its enforcer's UsageObserver) and reports it
//     like usage.Reporter: every Interval, at a phase of its own (spread evenly over the
//     interval), early when the table says refusals jumped (checked every EarlyPoll), and
//     early (AckGap after its last report) when its region applied a new share set; a
//     report reaches the balancer ReportDelay later;
//   - the balancer is the real balancer.Core, ticked every TickEvery; each Publication it
//     returns lands at once in the virtual etcd (the set as a Watcher would list it:
//     the head and the entries of the newest version) and reaches every region's
//     shares.Holder Propagation (the scenario's) later;
//   - each region's enforcers enforce through the region's real shares.Holder
//     (enforcer.Config.Shares), with its staleness rule.
//
// Faults: balancer-down drops every report and stops the ticks; when it ends a new leader
// (a new Core, LeaderRev one higher) restores the persisted set and learns again.
// region-isolated drops the region's reports and the sets sent to it; when it ends the
// region reads the set in force (after Propagation), as a Watcher re-listing would.

// Virtual-mode timing of the control plane.
const (
	ReportDelay = 50 * time.Millisecond  // enforcer → balancer, one way
	TickEvery   = 250 * time.Millisecond // how often the balancer's core is ticked (a multiple of Slice)
	EarlyPoll   = 100 * time.Millisecond // how often an enforcer looks at WantEarly
)

type reporter struct {
	region int
	id     string
	table  *usage.Table
	seq    uint64
	ack    bool // a new share set was applied and not reported yet
}

// sent is a report on its way to the balancer.
type sent struct {
	at time.Duration // arrival, since Epoch
	r  *allotv1.ReportRequest
}

type balancerPlane struct {
	sc      *scenario.Scenario
	w       *world
	cfg     balancer.CoreConfig
	core    *balancer.Core
	holders []*shares.Holder
	reps    [][]*reporter // [region][enforcer]

	// outbox holds each region's reports sent since the last barrier (written by the
	// region's goroutine between barriers, read by the coordinator at them).
	outbox [][]sent
	// down and isolated are the control plane's faults; set only at barriers.
	down     bool
	isolated []bool
	// the virtual etcd: the set as last written
	head    shareset.Head
	entries []shareset.Entry
	written bool
}

func newBalancerPlane(sc *scenario.Scenario) (*balancerPlane, error) {
	p := &balancerPlane{sc: sc, isolated: make([]bool, len(sc.Regions)), reps: make([][]*reporter, len(sc.Regions)),
		outbox: make([][]sent, len(sc.Regions))}
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
	return p, nil
}

func (p *balancerPlane) name() string { return PolicyBalancer }

// initial: the rules carry the default split; the Holder scales from there.
func (p *balancerPlane) initial() [][]float64 { return newFixedPlane(p.sc, PolicyStatic).shares }

func (p *balancerPlane) bind(w *world) error {
	p.w = w
	for r, reg := range p.sc.Regions {
		clk := w.regions[r].clk
		hc := shares.DefaultConfig()
		hc.Region = reg.Name
		hc.Clock = clk
		h, err := shares.NewHolder(hc)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		p.holders = append(p.holders, h)
		uc := usage.DefaultConfig()
		// One stripe holding every key twice over: nothing is ever evicted (so the hash
		// seed cannot change a report), and each report clears a small table, not the
		// 16,384 pairs a production enforcer keeps.
		uc.Stripes, uc.Capacity = 1, max(64, 2*len(p.sc.Keys))
		uc.Interval = p.sc.Interval
		uc.EarlyGap = min(uc.EarlyGap, p.sc.Interval)
		uc.RegionalRate = func(rule *rules.Compiled, identity string) float64 {
			if rule == nil || len(rule.Global) == 0 {
				return 0
			}
			return rule.Global[0].Rate * h.Share(rule, identity, clk.Now())
		}
		for e := range reg.Enforcers {
			// The enforcers have been running for a while: their report phases are spread
			// evenly over the interval, the first report covering [phase − Interval, phase).
			t, err := usage.NewTable(uc, clk.Now().Add(p.phase(r, e)-p.sc.Interval))
			if err != nil {
				return fmt.Errorf("sim: %w", err)
			}
			p.reps[r] = append(p.reps[r], &reporter{region: r, id: fmt.Sprintf("%s-%d", reg.Name, e), table: t})
		}
	}
	return nil
}

func (p *balancerPlane) sharesFor(r int) enforcer.Shares { return p.holders[r] }

func (p *balancerPlane) observer(r, e int) enforcer.UsageObserver { return p.reps[r][e].table }

func (p *balancerPlane) start(w *world) {
	end := p.sc.Duration
	for r, rs := range p.reps {
		clk := w.regions[r].clk
		for e, rep := range rs {
			rep := rep
			// Like usage.Reporter: a report when the table's interval is over (its Start +
			// Interval, so an early report restarts the interval) or when WantEarly.
			var regular func()
			regular = func() {
				due := rep.table.Start().Add(p.sc.Interval)
				if now := clk.Now(); now.Before(due) { // an early report moved the interval
					clk.at(due.Sub(Epoch), regular)
					return
				}
				p.report(rep, false)
				clk.after(p.sc.Interval, regular)
			}
			clk.at(p.phase(r, e), regular)
			clk.every(EarlyPoll, EarlyPoll, end, func() {
				if rep.table.WantEarly(clk.Now()) {
					p.report(rep, true)
				}
			})
		}
	}
	w.clk.every(TickEvery, TickEvery, end, p.tick)
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
func (p *balancerPlane) report(rep *reporter, early bool) {
	now := p.w.regions[rep.region].clk.Now()
	r := rep.table.Report(now)
	rep.seq++
	r.Region, r.EnforcerId, r.Seq, r.Early = p.sc.Regions[rep.region].Name, rep.id, rep.seq, early
	r.ShareLeaderRev, r.ShareVersion = p.holders[rep.region].Applied()
	rep.ack = false
	if p.down || p.isolated[rep.region] {
		return
	}
	p.outbox[rep.region] = append(p.outbox[rep.region], sent{at: now.Add(ReportDelay).Sub(Epoch), r: r})
}

// barrier hands the reports sent during the slice to the coordinator, region by region,
// to arrive ReportDelay after they were sent (at or after this barrier).
func (p *balancerPlane) barrier() {
	for q, box := range p.outbox {
		for _, m := range box {
			r := m.r
			p.w.clk.at(m.at, func() {
				if !p.down { // the balancer went down while the report was on its way
					p.ingest(r)
				}
			})
		}
		p.outbox[q] = box[:0]
	}
}

func (p *balancerPlane) ingest(r *allotv1.ReportRequest) {
	// A report the core refuses is a bug of the simulator or of the core: there is no
	// operator to tell, so it is dropped; the tests see its effect on the figures.
	_ = p.core.Ingest(p.w.clk.Now(), r)
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
	if pub.Changed || !p.written {
		p.entries = pub.Entries
	}
	p.head, p.written = pub.Head, true
	for r := range p.holders {
		if !p.isolated[r] {
			p.deliver(r)
		}
	}
}

// deliver sends the set in the virtual etcd to region r, arriving after Propagation.
func (p *balancerPlane) deliver(r int) {
	head, entries, h, clk := p.head, p.entries, p.holders[r], p.w.regions[r].clk
	clk.at(p.w.clk.elapsed()+p.sc.Propagation, func() {
		if !p.isolated[r] && h.Apply(head, entries, clk.Now()) {
			for _, rep := range p.reps[r] {
				p.ack(rep)
			}
		}
	})
}

// ack reports early that rep's region applied a new share set, as usage.Reporter does on
// shares.Holder.Changed: at least AckGap after rep's last report, so the balancer sees the
// version applied (what its change plan waits for before it publishes an increase).
func (p *balancerPlane) ack(rep *reporter) {
	if rep.ack {
		return
	}
	rep.ack = true
	clk := p.w.regions[rep.region].clk
	var try func()
	try = func() {
		if !rep.ack { // another report went meanwhile and carried the version
			return
		}
		start := rep.table.Start()
		if at := start.Add(ackGap); clk.Now().Before(at) {
			clk.at(at.Sub(Epoch), try)
			return
		}
		p.report(rep, clk.Now().Before(start.Add(p.sc.Interval)))
	}
	try()
}

// ackGap is the real Reporter's default AckGap.
var ackGap = usage.DefaultReporterConfig().AckGap

func (p *balancerPlane) fault(f scenario.Fault, on bool) {
	switch f.Kind {
	case scenario.BalancerDown:
		p.down = on
		if !on {
			p.newLeader()
		}
	case scenario.RegionIsolated:
		p.isolated[f.Region] = on
		if !on && p.written {
			p.deliver(f.Region)
		}
	}
}

// newLeader replaces the core with a new leader's, restored from the virtual etcd.
func (p *balancerPlane) newLeader() {
	cfg := p.cfg
	cfg.LeaderRev = p.cfg.LeaderRev + 1
	core, err := balancer.NewCore(cfg)
	if err != nil {
		return // the config was valid a moment ago
	}
	if p.written {
		// A fresh core accepts one Restore before it starts: an error here is impossible.
		_ = core.Restore(p.head, p.entries)
	}
	p.cfg, p.core = cfg, core
}

func (p *balancerPlane) share(r, k int) float64 {
	rule := p.w.regions[r].rules.Current().Rule(p.sc.Keys[k].Name)
	return p.holders[r].Share(rule, p.w.keys[k].identity, p.w.clk.Now())
}
