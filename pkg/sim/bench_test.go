package sim

import (
	"testing"

	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// BenchmarkManyKeys runs the shipped 10-minute, three-region, 20-key scenario and reports
// what the balancer wrote (issue 21 §3): versions and bytes to etcd per balancing
// interval, over the run and over its steady seconds, and recomputes per interval.
func BenchmarkManyKeys(b *testing.B) { benchControlPlane(b, "many-keys.yaml") }

// BenchmarkShiftControlPlane is the same for shift-eu-to-us: a key whose traffic moves
// twice.
func BenchmarkShiftControlPlane(b *testing.B) { benchControlPlane(b, "shift-eu-to-us.yaml") }

func benchControlPlane(b *testing.B, file string) {
	sc, err := scenario.Load("../../configs/scenarios/" + file)
	if err != nil {
		b.Fatal(err)
	}
	var cp *ControlPlane
	for b.Loop() {
		res, err := Run(sc, Options{Policy: PolicyBalancer})
		if err != nil {
			b.Fatal(err)
		}
		cp = res.Summary.ControlPlane
	}
	intervals := sc.Duration.Seconds() / sc.Interval.Seconds()
	b.ReportMetric(cp.VersionsPerInterval, "versions/interval")
	b.ReportMetric(cp.SteadyVersionsPerInterval, "steady-versions/interval")
	b.ReportMetric(cp.BytesPerInterval, "etcd-bytes/interval")
	b.ReportMetric(float64(cp.Recomputes)/intervals, "recomputes/interval")
}
