// Package sim is regionsim's engine: it replays a scenario (pkg/sim/scenario) through the
// real allot code paths on a virtual clock and judges the result against the promises.
//
// # The virtual mode
//
// One process on virtual clocks (discrete-event schedulers implementing clock.Clock): one
// per region, which every layer of the region's enforcers reads, and one for the control
// plane. Regions run in parallel between barriers every Slice (50 ms) of virtual time and
// the control plane runs at the barriers; reports take ReportDelay = Slice to reach the
// balancer, so the parallel run is the sequential one (see Slice). Each region has one
// exact in-memory bucket store standing for its Redis Cluster; each enforcer of a region
// is the node the enforcer binary runs, composed by the same pkg/enforcer/node.Build —
// pkg/enforcer.Enforcer deciding checks against the region's compiled pkg/rules snapshot,
// over pkg/fallback over pkg/lease over that store, with its share and usage tables —
// built with the region's clock (nodeConfig says which settings differ). Requests arrive as Poisson
// processes per key and region at the offered rates, each on a random enforcer of its
// region. Background work runs at known points of the schedule (lease refills inside the
// check that makes them due, control-plane reports and publication as events), so one
// seed gives one run, byte for byte.
//
// The shares each region enforces come from the run's control plane (-policy): the
// balancer, the static default split, or the whole limit everywhere (full).
//
// # The figures
//
// See judge.go: max_window_ratio, steady_ratio and recovery_s per key, and the summary
// (Summary) with exactly the fields issue 9 fixes.
package sim

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// ErrPolicy is returned for a -policy the simulator does not know.
var ErrPolicy = errors.New("sim: unknown policy")

// Options tune a run.
type Options struct {
	// Policy is PolicyBalancer, PolicyStatic or PolicyFull; "" means PolicyBalancer.
	Policy string
	// SummaryOnly keeps only what the summary needs (each key's requests per region and
	// second), not the shares and sources per second: Result.Keys is then nil, and the
	// CSV and plots cannot be written. For populations of thousands of keys.
	SummaryOnly bool
	// Aggregate puts a report aggregator (pkg/aggregator's merge) in every region, with
	// PolicyBalancer: the enforcers report to it and it forwards to the balancer
	// (docs/design.md §12). The scenario format is the same.
	Aggregate bool
	// workers is the cores the regions are laid out for (lanes); 0: GOMAXPROCS. Tests set
	// it to show every layout gives the same run.
	workers int
}

// Result is one run: the per-second cells of every key and the judged summary.
type Result struct {
	Scenario *scenario.Scenario
	Policy   string
	// Seconds is the run's length in whole seconds.
	Seconds int
	// Keys holds each key's cells, [second × regions + region], in scenario order.
	Keys [][]Cell
	// Verdicts are the judged figures of each key, in scenario order.
	Verdicts []Verdict
	Summary  Summary
	// StoreCallsSeen says the run counted the calls that reached a store (virtual mode);
	// a live run does not see them, and its store_calls_per_request is 0.
	StoreCallsSeen bool
}

// Cell returns key k's cell for second s in region r.
func (res *Result) Cell(k, s, r int) *Cell {
	return &res.Keys[k][s*len(res.Scenario.Regions)+r]
}

// Summary is the run's summary: exactly the fields of issue 9 (-summary, -json).
type Summary struct {
	Scenario string `json:"scenario"`
	Policy   string `json:"policy"`
	// Aggregated: the reports went through each region's aggregator (Options.Aggregate).
	Aggregated bool        `json:"aggregated,omitempty"`
	Pass       bool        `json:"pass"`
	Failures   []string    `json:"failures"`
	Keys       []KeyResult `json:"keys"`
	// ControlPlane is what the balancer wrote (virtual mode, -policy balancer only).
	ControlPlane *ControlPlane `json:"control_plane,omitempty"`
}

// ControlPlane counts the balancer's writes over a run: share set versions and the bytes
// they and the head refreshes would write to etcd (the chunks as pkg/contract encodes them,
// with contract.MaxChunkBytes, and the head), in all and per balancing interval, over the
// whole run and over its second half (when the shipped scenarios' traffic is steady).
type ControlPlane struct {
	Versions            int     `json:"versions"`
	VersionsPerInterval float64 `json:"versions_per_interval"`
	// SteadyVersionsPerInterval counts only the versions in steady seconds: at least
	// Settle (30 s) after the start, every key's phase changes and every fault's start and
	// end (the seconds steady_ratio is judged over, for all keys at once); SteadySeconds
	// is how many there were.
	SteadyVersionsPerInterval float64 `json:"steady_versions_per_interval"`
	SteadySeconds             int     `json:"steady_seconds"`
	BytesWritten              int64   `json:"bytes_written"`
	BytesPerInterval          float64 `json:"bytes_per_interval"`
	Recomputes                uint64  `json:"recomputes"`
	// AnswersLost counts the reports the balancer (or a region's aggregator) took whose
	// answer a fault began in time to drop: the enforcer does not know it was heard
	// (configs/scenarios/enforcer-isolated-answer-lost.yaml).
	AnswersLost int `json:"answers_lost,omitempty"`
}

// Run replays sc in virtual mode and judges it. It returns an error only for a bad
// option or a scenario the layers refuse (ErrPolicy, a rule that does not compile).
func Run(sc *scenario.Scenario, opt Options) (*Result, error) {
	policy := opt.Policy
	if policy == "" {
		policy = PolicyBalancer
	}
	var p plane
	switch policy {
	case PolicyStatic, PolicyFull:
		p = newFixedPlane(sc, policy)
	case PolicyBalancer:
		bp, err := newBalancerPlane(sc, opt.Aggregate)
		if err != nil {
			return nil, err
		}
		p = bp
	default:
		return nil, fmt.Errorf("%w %q (want %s, %s or %s)", ErrPolicy, policy, PolicyBalancer, PolicyStatic, PolicyFull)
	}
	w, err := newWorld(sc, p, opt.SummaryOnly)
	if err != nil {
		return nil, err
	}
	if opt.workers > 0 {
		w.workers = opt.workers
	}
	w.run()
	w.close()
	res := w.judge()
	if bp, ok := p.(*balancerPlane); ok {
		res.Summary.ControlPlane = bp.writes(sc)
		res.Summary.Aggregated = bp.aggs != nil
	}
	return res, nil
}

// judge builds the result and its verdicts from what the world recorded.
func (w *world) judge() *Result {
	calls := make([]int64, len(w.keys))
	for k := range w.keys {
		for _, reg := range w.regions {
			calls[k] += reg.store.calls[k]
		}
	}
	return judgeRun(w.sc, w.plane.name(), w.secs, w.keys, w.tally, calls, w.spans)
}

// judgeRun judges what was recorded of every key (both modes): the tally's counts, or
// without one (live mode) the cells; storeCalls is nil when the run could not count them
// (live mode).
func judgeRun(sc *scenario.Scenario, policy string, secs int, keys []keyState, tl *tally, storeCalls []int64, spans []Span) *Result {
	R := len(sc.Regions)
	res := &Result{Scenario: sc, Policy: policy, Seconds: secs, StoreCallsSeen: storeCalls != nil}
	if storeCalls == nil {
		storeCalls = make([]int64, len(sc.Keys))
	}
	res.Summary = Summary{Scenario: sc.Name, Policy: policy, Pass: true, Failures: []string{}, Keys: []KeyResult{}}
	exp := Expect(sc.Expect)
	for k, key := range sc.Keys {
		ks := &keys[k]
		if ks.cells != nil {
			res.Keys = append(res.Keys, ks.cells)
		}
		ser := &KeySeries{
			Key: key.Name, Rate: ks.rate, Burst: key.Limit.Burst,
			Offered: make([]float64, secs), Admitted: make([]float64, secs), Split: make([]float64, secs),
			StoreCalls: storeCalls[k],
		}
		for s := 0; s < secs; s++ {
			for r := 0; r < R; r++ {
				var off, adm int64
				if tl != nil {
					cn := tl.at(s, k, r)
					off, adm = int64(cn.offered), int64(cn.admitted)
					ser.Split[s] += float64(cn.split)
				} else { // live mode counts in the cells
					off, adm = ks.cells[s*R+r].Offered, ks.cells[s*R+r].Admitted
				}
				ser.Offered[s] += float64(off)
				ser.Admitted[s] += float64(adm)
				ser.Requests += off
			}
		}
		for _, ph := range key.Phases {
			ser.Phases = append(ser.Phases, int(ph.At/time.Second))
		}
		v := Judge(ser, spans, exp)
		res.Verdicts = append(res.Verdicts, v)
		res.Summary.Keys = append(res.Summary.Keys, rounded(v.KeyResult))
		if len(v.Failures) > 0 {
			res.Summary.Pass = false
			res.Summary.Failures = append(res.Summary.Failures, v.Failures...)
		}
	}
	return res
}

// rounded keeps six decimals of each figure: the summary is for people and diffs, and
// the pass/fail decisions were made on the exact values.
func rounded(k KeyResult) KeyResult {
	r6 := func(f float64) float64 { return math.Round(f*1e6) / 1e6 }
	k.Rate = r6(k.Rate)
	k.MaxWindowRatio = r6(k.MaxWindowRatio)
	k.MaxWindowRatio60s = r6(k.MaxWindowRatio60s)
	k.MaxWindowRatio300s = r6(k.MaxWindowRatio300s)
	k.SteadyRatio = r6(k.SteadyRatio)
	k.SteadySplit = r6(k.SteadySplit)
	k.StoreCallsPerRequest = r6(k.StoreCallsPerRequest)
	rec := make([]float64, len(k.RecoveryS))
	for i, x := range k.RecoveryS {
		rec[i] = r6(x)
	}
	k.RecoveryS = rec
	return k
}
