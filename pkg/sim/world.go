package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/node"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/sim/scenario"
	"github.com/prometheus/client_golang/prometheus"
)

// errRedisDown is what a region's store answers during a redis-down fault.
var errRedisDown = errors.New("sim: redis down (scenario fault)")

// regionStore is one region's bucket store, standing for its Redis Cluster: the exact
// in-memory store on the virtual clock, behind a switch the redis-down fault throws. It
// counts the calls that reach it per key (store_calls_per_request) and stamps its answers
// SourceRedis, which is what they stand for.
type regionStore struct {
	mem   *bucket.Memory
	down  atomic.Bool
	keyOf map[string]int // identity → key index
	calls []int64        // per key; the run's one goroutine writes it
	// cur is the key whose check the region is making (-1 between checks) and curID its
	// identity: a call for it is counted without a lookup in keyOf (a 10,000-key map
	// missed the cache at every call, 3% of a long-tail run).
	cur   int
	curID string
}

func (s *regionStore) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	if s.cur >= 0 && req.Identity == s.curID {
		s.calls[s.cur]++
	} else if k, ok := s.keyOf[req.Identity]; ok {
		s.calls[k]++
	}
	if s.down.Load() {
		return bucket.Result{}, errRedisDown
	}
	res, err := s.mem.Take(ctx, req)
	if res.Source == bucket.SourceMemory {
		res.Source = bucket.SourceRedis
	}
	return res, err
}

// Fence keeps the region's fenced enforcers' marks (bucket.Fences) as its Redis would,
// behind the same switch: an enforcer cut off from the control plane marks itself here,
// and its region-mates' reports count it.
func (s *regionStore) Fence(ctx context.Context, c bucket.FenceCall) (bucket.FenceReply, error) {
	if s.down.Load() {
		return bucket.FenceReply{}, errRedisDown
	}
	return s.mem.Fence(ctx, c)
}

// region is one region of a run: its own virtual clock (every layer of its enforcers reads
// it), its arrivals and its enforcers. Between two barriers (see run) a region touches
// nothing outside itself, so regions run in parallel.
type region struct {
	idx     int
	name    string
	clk     *scheduler
	streams streamHeap
	store   *regionStore
	rules   *rules.Holder
	nodes   []*node.Node // the region's enforcers, built by node.Build
	// early[e] is enforcer e's usage table's Table.Early and jumped[e] what wakes its
	// reports (nil without a balancer): the check that makes the table's refusals jump
	// wakes the enforcer's reporter at once, as the channel wakes the Reporter's goroutine.
	early  []<-chan struct{}
	jumped []func()
}

// onJump makes a jump in enforcer e's table's refusals (signalled on early) call wake.
func (reg *region) onJump(e int, early <-chan struct{}, wake func()) {
	if reg.early == nil {
		reg.early, reg.jumped = make([]<-chan struct{}, len(reg.nodes)), make([]func(), len(reg.nodes))
	}
	reg.early[e], reg.jumped[e] = early, wake
}

// world is everything one run holds.
type world struct {
	sc *scenario.Scenario
	// clk is the coordinator's clock: the control plane (balancer ticks, reports
	// arriving, publication) and the per-second samples run on it, at barriers.
	clk     *scheduler
	plane   plane
	regions []*region
	keys    []keyState
	tally   *tally
	secs    int
	workers int // the cores the regions are laid out for (lanes)
	// faults
	spans []Span
	// effects are the coordinator's changes to the regions made during a slice, applied
	// at its end (see run).
	effects []func()
}

// keyState is one key's request template and what it recorded.
type keyState struct {
	req      enforcer.Request
	identity string
	rate     float64 // per second
	cells    []Cell  // [second × regions + region]; nil without detail (Options.SummaryOnly)
}

// counts is one key's requests in one region during one second: all the judge reads. A
// 10,000-key, 10-minute, three-region run holds 216 MB of them; the cells beside them
// (shares and sources, for the CSV and plots) are ten times that.
type counts struct{ offered, admitted, split int32 }

// tally holds every key's counts, second by second: [(second × keys + key) × regions +
// region]. A second's counts of every key lie together (360 KB for 10,000 keys over three
// regions), so the arrivals of one second, which touch keys at random, stay in the cache
// (laid out key by key, each arrival missed it: 1.3% of a long-tail run).
type tally struct {
	keys, regions int
	c             []counts
}

func newTally(secs, keys, regions int) *tally {
	return &tally{keys: keys, regions: regions, c: make([]counts, secs*keys*regions)}
}

// at is key k's counts in region r during second s.
func (t *tally) at(s, k, r int) *counts { return &t.c[(s*t.keys+k)*t.regions+r] }

// Cell is one key's traffic in one region during one second of a run.
type Cell struct {
	Offered, Admitted int64
	// Share is the share the region enforced at the end of the second; RegionalRate is the
	// global rate (per second) × Share.
	Share, RegionalRate float64
	// Sources counts the answers by where they came from (SourceColumns).
	Sources [numSourceCols]int64
}

// SourceColumns name Cell.Sources, in order.
var SourceColumns = [numSourceCols]string{"redis", "lease", "refusal_cache", "fallback", "fail_open", "other"}

const numSourceCols = 6

func sourceCol(s enforcer.Source) int {
	switch s {
	case enforcer.SourceRedis, enforcer.SourceMemory:
		return 0
	case enforcer.SourceLease:
		return 1
	case enforcer.SourceRefusalCache:
		return 2
	case enforcer.SourceFallback:
		return 3
	case enforcer.SourceFailOpen:
		return 4
	}
	return 5
}

// ruleSet is the rules every region compiles: one rule per key, matched by plan (the
// simulator sends plan = key name), counted by api key, with the key's limit as written.
// shares[r][k] is region r's share of key k's limit (nil: 1).
func ruleSet(sc *scenario.Scenario, r int, shares [][]float64) *rules.Set {
	set := &rules.Set{Version: "regionsim"}
	for k, key := range sc.Keys {
		ru := rules.Rule{
			ID:     key.Name,
			Match:  rules.Match{Plan: key.Name},
			By:     rules.ByAPIKey,
			Limits: []rules.LimitSpec{{Name: "limit", Rate: key.Limit.Rate, Per: key.Limit.Per, Burst: key.Limit.Burst}},
			Reason: "regionsim scenario " + sc.Name,
		}
		if shares != nil {
			ru.Shares = map[string]float64{sc.Regions[r].Name: shares[r][k]}
		}
		set.Rules = append(set.Rules, ru)
	}
	return set
}

func compileRegion(sc *scenario.Scenario, r int, shares [][]float64, now time.Time) (*rules.Snapshot, error) {
	snap, err := rules.Compile(ruleSet(sc, r, shares), rules.CompileOptions{Region: sc.Regions[r].Name, Now: now})
	if err != nil {
		return nil, fmt.Errorf("sim: while compiling the rules of region %s: %w", sc.Regions[r].Name, err)
	}
	return snap, nil
}

// newWorld builds the regions and enforcers of sc with the control plane p.
func newWorld(sc *scenario.Scenario, p plane, summaryOnly bool) (*world, error) {
	w := &world{sc: sc, clk: &scheduler{}, plane: p, secs: int(sc.Duration / time.Second), workers: runtime.GOMAXPROCS(0)}
	w.keys = newKeyStates(sc, w.secs, !summaryOnly)
	w.tally = newTally(w.secs, len(sc.Keys), len(sc.Regions))
	keyOf := make(map[string]int, len(sc.Keys))
	for k := range w.keys {
		keyOf[w.keys[k].identity] = k
	}
	for r, rg := range sc.Regions {
		w.regions = append(w.regions, &region{idx: r, name: rg.Name, clk: &scheduler{}})
	}
	for r, rg := range sc.Regions {
		reg := w.regions[r]
		reg.store = &regionStore{mem: bucket.NewMemory(reg.clk, 0), keyOf: keyOf, calls: make([]int64, len(sc.Keys)), cur: -1}
		snap, err := compileRegion(sc, r, p.initial(), Epoch)
		if err != nil {
			w.close()
			return nil, err
		}
		reg.rules = rules.NewHolder(snap)
		n := rg.Enforcers
		peers := func() int { return n }
		for e := range n {
			nd, err := node.Build(nodeConfig(sc, r, e, p.transport(r, e) != nil), node.Deps{
				Rules: reg.rules, Store: reg.store, Peers: peers, Clock: reg.clk,
				Inline:     true, // the region's store is in memory and the clock virtual: no waits to bound
				Registerer: prometheus.NewRegistry(), UsageStart: p.usageStart(r, e), Transport: p.transport(r, e),
			})
			if err != nil {
				w.close()
				return nil, fmt.Errorf("sim: region %s enforcer %d: %w", reg.name, e, err)
			}
			reg.nodes = append(reg.nodes, nd)
		}
		reg.streams.push(newStreams(sc, r), r)
		reg.streams.init()
	}
	if err := p.bind(w); err != nil {
		w.close()
		return nil, err
	}
	w.spans = faultSpans(sc)
	return w, nil
}

// faultSpans are the whole seconds each fault touches.
func faultSpans(sc *scenario.Scenario) []Span {
	var spans []Span
	for _, f := range sc.Faults {
		spans = append(spans, Span{int(f.At / time.Second), int(math.Ceil(f.End().Seconds()))})
	}
	return spans
}

// newKeyStates makes each key's state; cells (the per-region detail: shares, sources)
// only when detail is wanted.
func newKeyStates(sc *scenario.Scenario, secs int, detail bool) []keyState {
	keys := make([]keyState, len(sc.Keys))
	for k, key := range sc.Keys {
		keys[k] = keyState{
			req:      enforcer.Request{Attrs: rules.Attrs{APIKey: key.Name, Plan: key.Name}},
			identity: "key:" + key.Name,
			rate:     key.Limit.PerSecond(),
		}
		if detail {
			keys[k].cells = make([]Cell, secs*len(sc.Regions))
		}
	}
	return keys
}

// nodeConfig is the settings of enforcer e of region r (node.Config): the production
// defaults, over the region's store standing for its Redis Cluster (Layers), with the
// balancer's shares and usage reports when the plane reads them (balanced). What differs
// from a production enforcer: no sampled decision or refusal logs, and a usage table of one
// stripe holding every key twice over, so that nothing is ever evicted (the hash seed
// cannot change a report) and each report clears a small table, not the 16,384 pairs a
// production enforcer keeps.
func nodeConfig(sc *scenario.Scenario, r, e int, balanced bool) node.Config {
	nc := node.DefaultConfig()
	nc.Region, nc.ID = sc.Regions[r].Name, fmt.Sprintf("%s-%d", sc.Regions[r].Name, e)
	nc.Check.DecisionLogEvery, nc.Check.RefusalLogEvery = 0, 0
	nc.Layers = true
	nc.Balanced, nc.Reports = balanced, balanced
	nc.Shares.Floor = node.ShareFloor(len(sc.Regions))
	nc.Usage.Stripes, nc.Usage.Capacity = 1, max(64, 2*len(sc.Keys))
	nc.Usage.Interval = sc.Interval
	return nc
}

func (w *world) close() {
	for _, reg := range w.regions {
		for _, n := range reg.nodes {
			n.Close()
		}
	}
}

// Slice is the virtual time between two barriers. Within a slice each region runs on its
// own, and the coordinator runs the control plane's events due by its end beside them (in
// parallel: see run); at the barrier that ends it what the coordinator did to the regions
// takes effect. Reports take ReportDelay = Slice to reach the balancer, so a report sent
// within a slice is delivered in the next: the parallel run is the sequential one, event
// for event. Faults of the control plane (balancer-down, region-isolated) start and end
// at the first barrier at or after their time (at most Slice late); a redis-down fault is
// the region's own, exact to the nanosecond.
const Slice = ReportDelay

// barrierAt is the first barrier at or after t.
func barrierAt(t time.Duration) time.Duration { return (t + Slice - 1) / Slice * Slice }

// scheduleFaults turns the scenario's faults into events.
func (w *world) scheduleFaults() {
	for _, f := range w.sc.Faults {
		f := f
		switch f.Kind {
		case scenario.RedisDown:
			reg := w.regions[f.Region]
			reg.clk.at(f.At, func() { reg.store.down.Store(true) })
			reg.clk.at(f.End(), func() { reg.store.down.Store(false) })
		default:
			w.clk.at(barrierAt(f.At), func() { w.plane.fault(f, true) })
			w.clk.at(barrierAt(f.End()), func() { w.plane.fault(f, false) })
		}
	}
}

// sample records the shares in force at the end of second s (now).
func (w *world) sample(s int, now time.Time) {
	R := len(w.regions)
	for k := range w.keys {
		ks := &w.keys[k]
		if ks.cells == nil {
			continue
		}
		for r := range w.regions {
			c := &ks.cells[s*R+r]
			c.Share = w.plane.share(r, k, now)
			c.RegionalRate = ks.rate * c.Share
		}
	}
}

// runUntil runs the region's arrivals and events due before b (ns since Epoch), in time
// order (events first on a tie), then sets its clock to b.
func (w *world) runUntil(reg *region, b int64) {
	R := len(w.regions)
	ctx := context.Background()
	for {
		top := reg.streams.top()
		st, key := top.s, int(top.key)
		evAt, ok := reg.clk.peek()
		if ok && evAt < b && evAt <= st.next {
			reg.clk.runNext()
			continue
		}
		if st.next >= b {
			break
		}
		reg.clk.set(st.next)
		e := st.rng.IntN(len(reg.nodes)) // a random enforcer of its region
		nd := reg.nodes[e]
		ks := &w.keys[key]
		sec := int(st.next / int64(time.Second))
		i := sec*R + reg.idx
		cn := w.tally.at(sec, key, reg.idx)
		cn.offered++
		if st.take(st.phase(st.t)) {
			cn.split++
		}
		reg.store.cur, reg.store.curID = key, ks.identity
		d, err := nd.Enforcer().Check(ctx, &ks.req)
		reg.store.cur = -1
		if reg.early != nil && len(reg.early[e]) > 0 { // this check made the refusals jump
			<-reg.early[e]
			reg.jumped[e]()
		}
		allowed := err == nil && d.Allowed
		if allowed {
			cn.admitted++
		}
		if ks.cells != nil {
			c := &ks.cells[i]
			c.Offered++
			if allowed {
				c.Admitted++
			}
			c.Sources[sourceCol(d.Source)]++
		}
		st.advance()
		reg.streams.advanced()
	}
	reg.clk.set(b)
}

// run replays the scenario slice by slice. Within a slice the regions run their arrivals
// and events (see lanes) and, beside them, the coordinator runs the control plane's
// events of the same slice: its inputs were fixed a slice before (a report sent in one
// slice arrives in the next: ReportDelay = Slice), and what it does to a region (effect)
// waits for the end of the slice, when every region stands at the barrier, as it did when
// the coordinator ran after the regions. So the run is the sequential one, event for
// event, with the control plane's work off the barrier.
//
// Order is kept by rounds of the coordinator's clock: the reports of a slice are handed
// to it (plane.barrier) after the events of that slice ran, but they are ordered before
// the events those scheduled for the same instants, as when they were handed over first.
func (w *world) run() {
	end := w.sc.Duration
	w.scheduleFaults()
	w.plane.start(w)
	for s := 1; s <= w.secs; s++ {
		s := s
		w.clk.at(time.Duration(s)*time.Second, func() {
			now := w.clk.Now()
			w.effect(func() { w.sample(s-1, now) })
		})
	}
	w.plane.sync()
	ls := lanes(len(w.regions), w.workers)
	var wg, exited sync.WaitGroup
	half := make(chan struct{}, 1) // the split region's first half is done
	// run runs lane i's part of the slice [b, b+Slice): with first, every region's first
	// instant (b); else the rest of every region's slice and the coordinator's events due
	// by its end.
	run := func(i int, b int64, first bool) {
		for _, st := range ls[i] {
			if first {
				if st.region >= 0 && st.half != 2 {
					w.runUntil(w.regions[st.region], b+1)
				}
				continue
			}
			switch {
			case st.region < 0:
				w.coordinate(b + int64(Slice))
			case st.half == 1:
				w.runUntil(w.regions[st.region], b+int64(Slice)/2)
				half <- struct{}{}
			case st.half == 2:
				<-half
				fallthrough
			default:
				w.runUntil(w.regions[st.region], b+int64(Slice))
			}
		}
	}
	type step struct {
		b     int64
		first bool
	}
	work := make([]chan step, len(ls))
	for i := 1; i < len(ls); i++ {
		work[i] = make(chan step)
		exited.Add(1)
		go func(i int, c chan step) {
			defer exited.Done()
			for s := range c {
				run(i, s.b, s.first)
				wg.Done()
			}
		}(i, work[i])
	}
	all := func(b int64, first bool) {
		wg.Add(len(ls) - 1)
		for i := 1; i < len(ls); i++ {
			work[i] <- step{b, first}
		}
		run(0, b, first)
		wg.Wait()
	}
	// Slice n is [b, b+Slice) for the regions and (b, b+Slice] for the coordinator; the
	// reports the regions send in it arrive in (b+Slice, b+2·Slice), except those sent at
	// b, which arrive at b+Slice, in the coordinator's slice. So the regions' first
	// instant runs on its own, its reports handed over before the rest of the slice runs.
	// Round 2n is the slice's reports, 2n+1 what the coordinator's events of the slice
	// schedule.
	var round uint64
	for b := time.Duration(0); b < end; b += Slice {
		round += 2
		all(int64(b), true)
		w.clk.setRound(round)
		w.plane.barrier()
		w.clk.setRound(round + 1)
		all(int64(b), false)
		w.clk.setRound(round)
		w.plane.barrier()
		for i, fn := range w.effects {
			fn()
			w.effects[i] = nil
		}
		w.effects = w.effects[:0]
		w.plane.sync()
	}
	for i := 1; i < len(ls); i++ {
		close(work[i])
	}
	exited.Wait()
}

// coordinate runs the coordinator's events due by b (ns since Epoch), then sets its clock
// to b.
func (w *world) coordinate(b int64) {
	for {
		at, ok := w.clk.peek()
		if !ok || at > b {
			break
		}
		w.clk.runNext()
	}
	w.clk.set(b)
}

// effect defers fn, something the coordinator does to a region (an answer reaching an
// enforcer, a set on its way, a restart, a sample of the shares in force), to the end
// of the slice: effects run in the order they were made, every region at the barrier,
// before the next slice (see run).
func (w *world) effect(fn func()) { w.effects = append(w.effects, fn) }

// lane is the steps one goroutine runs to each barrier, in order: a region's slice, or
// the coordinator's (region −1); a step with half 1 runs its region to the middle of the
// slice, one with half 2 from there to the barrier once the first half is done (on the
// other lane).
type lane []laneStep

type laneStep struct{ region, half int }

// coordinator is the coordinator's step in a lane.
var coordinator = laneStep{region: -1}

// lanes lays R regions and the coordinator out on the goroutines that run them between
// barriers, for workers cores. Regions never touch each other nor the coordinator
// between barriers, so the lanes are the same run, byte for byte, however they are laid
// out.
//
// One region a goroutine, except for an odd number of regions over two cores: there one
// region's slice is halved, its first half on one lane before that lane's whole regions
// and its second half on the other after them. Three regions on two cores, a region a
// goroutine, left one core idle a third of each slice (a slice is a few milliseconds of
// work, under the Go scheduler's time slice, so the third region waited for a core);
// halved, both cores work to every barrier, and only the halved region changes cores
// (cutting every region's slice into steps that any core takes switched all of them
// between cores and lost more to cold caches than the idle third: 11% more CPU).
//
// The coordinator has a goroutine of its own, which the Go scheduler fits between the
// regions' lanes: its work comes in bursts (a tick's recompute, a report of thousands of
// identities) that no cut fixed in advance evens out. Placed in a lane, with the halved
// region's cut moved each slice to even the lanes out by their average times, the
// 10,000-key population ran no faster than with the coordinator alone at the barrier; on
// a goroutine of its own, 2–5% faster.
func lanes(regions, workers int) []lane {
	if workers != 2 || regions < 3 || regions%2 == 0 {
		ls := make([]lane, regions, regions+1)
		for r := range ls {
			ls[r] = lane{{region: r}}
		}
		return append(ls, lane{coordinator})
	}
	split := regions - 1
	a, b := lane{{region: split, half: 1}}, lane{}
	for r := range split {
		if r < split/2 {
			a = append(a, laneStep{region: r})
		} else {
			b = append(b, laneStep{region: r})
		}
	}
	return []lane{a, append(b, laneStep{region: split, half: 2}), {coordinator}}
}
