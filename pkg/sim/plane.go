package sim

import (
	"time"

	"github.com/allot-dev/allot/pkg/enforcer/node"
	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// Policies name where a run's shares come from (-policy).
const (
	// PolicyBalancer: shares from the balancer's core, fed by the enforcers' usage reports
	// and published to the regions with the scenario's propagation delay.
	PolicyBalancer = "balancer"
	// PolicyStatic: every region enforces its default share (equal split) all run long.
	PolicyStatic = "static"
	// PolicyFull: every region enforces the whole global limit (no coordination at all).
	PolicyFull = "full"
)

// plane is a run's control plane: it decides the share of each key every region enforces.
// The simulator calls it at virtual times; it must schedule any work of its own (reports,
// recomputes, publication) on the world's clocks, so that a seed gives one run: the
// regions' work on their clocks, the control plane's on the coordinator's (w.clk), which
// runs beside the regions within a slice and so touches a region only through
// world.effect.
type plane interface {
	// name is the policy's name, as the summary gives it.
	name() string
	// initial is the shares the regions compile their first rules with: [region][key],
	// nil for the whole limit.
	initial() [][]float64
	// transport is the usage-report transport of enforcer e of region r (node.Deps), built
	// in order of r then e; nil: the plane reads no reports, and the enforcers enforce the
	// shares the rules were compiled with, not the balancer's (node.Config.Balanced).
	transport(r, e int) node.Transport
	// usageStart is when enforcer e of region r's usage table starts (node.Deps.UsageStart).
	usageStart(r, e int) time.Time
	// bind is called once, after the enforcers are built, with the world they live in.
	bind(w *world) error
	// start schedules the plane's background work: the enforcers' on their region's
	// clock, the balancer's on the coordinator's (w.clk).
	start(w *world)
	// barrier hands the coordinator what the regions sent it since the last call, with
	// every region and the coordinator stopped: after the regions' first instant of a
	// slice and again at its end (see world.run).
	barrier()
	// sync is called at the end of each slice, once the coordinator's effects on the
	// regions are applied: the regions see the control plane as it stands then.
	sync()
	// fault starts (on) or ends a fault of the control plane (every kind but redis-down).
	fault(f scenario.Fault, on bool)
	// share is the share region r enforces for key k at now (a region's time: called at a
	// barrier).
	share(r, k int, now time.Time) float64
}

// fixedPlane never changes a share: static (the default split) or full (the whole limit).
type fixedPlane struct {
	policy string
	shares [][]float64 // nil: 1 everywhere
}

func newFixedPlane(sc *scenario.Scenario, policy string) *fixedPlane {
	p := &fixedPlane{policy: policy}
	if policy == PolicyStatic {
		def := DefaultSplit(sc)
		p.shares = make([][]float64, len(sc.Regions))
		for r := range p.shares {
			p.shares[r] = make([]float64, len(sc.Keys))
			for k := range p.shares[r] {
				p.shares[r][k] = def[r]
			}
		}
	}
	return p
}

// DefaultSplit is the share each region gets of a key the balancer has not moved: an
// equal split (scenarios give regions no weights, and keys no shares: of their own).
func DefaultSplit(sc *scenario.Scenario) []float64 {
	def := make([]float64, len(sc.Regions))
	for r := range def {
		def[r] = 1 / float64(len(def))
	}
	return def
}

func (p *fixedPlane) name() string                      { return p.policy }
func (p *fixedPlane) initial() [][]float64              { return p.shares }
func (p *fixedPlane) transport(int, int) node.Transport { return nil }
func (p *fixedPlane) usageStart(int, int) time.Time     { return time.Time{} }
func (p *fixedPlane) bind(*world) error                 { return nil }
func (p *fixedPlane) start(*world)                      {}
func (p *fixedPlane) fault(scenario.Fault, bool)        {}

func (p *fixedPlane) share(r, k int, _ time.Time) float64 {
	if p.shares == nil {
		return 1
	}
	return p.shares[r][k]
}

func (p *fixedPlane) barrier() {}
func (p *fixedPlane) sync()    {}
