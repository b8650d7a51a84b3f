package sim

import "github.com/allot-dev/allot/pkg/sim/scenario"

// faults are the control plane's faults in force.
type faults struct {
	down       bool
	isolated   []bool
	cutEnf     [][]bool // [region][enforcer]: enforcer-isolated
	restarting []bool
}

func newFaults(sc *scenario.Scenario) faults {
	f := faults{isolated: make([]bool, len(sc.Regions)), restarting: make([]bool, len(sc.Regions)),
		cutEnf: make([][]bool, len(sc.Regions))}
	for r, reg := range sc.Regions {
		f.cutEnf[r] = make([]bool, reg.Enforcers)
	}
	return f
}

// copyTo makes dst the same as f, in place.
func (f *faults) copyTo(dst *faults) {
	dst.down = f.down
	copy(dst.isolated, f.isolated)
	copy(dst.restarting, f.restarting)
	for r := range f.cutEnf {
		copy(dst.cutEnf[r], f.cutEnf[r])
	}
}

// cut: enforcer e of region r is cut off from the control plane.
func (f *faults) cut(r, e int) bool {
	return f.isolated[r] || f.restarting[r] || f.cutEnf[r][e]
}

// cutFromAggregator: enforcer e of region r cannot reach its region's aggregator.
func (f *faults) cutFromAggregator(r, e int) bool {
	return f.restarting[r] || f.cutEnf[r][e]
}
