package sim

import (
	"slices"
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

// BenchmarkManyKeysSeeds runs many-keys with seeds 1–20 and the shipped 31 (the same
// keys and moves, other arrivals) and reports how fast its moves recover over all of
// them (issue 21 §2): one seed is one sample of a distribution whose tail moves by a
// move or two from seed to seed. Each run is about 2.5 s; the benchmark, about a minute.
func BenchmarkManyKeysSeeds(b *testing.B) {
	base, err := scenario.Load("../../configs/scenarios/many-keys.yaml")
	if err != nil {
		b.Fatal(err)
	}
	var moves []float64
	for b.Loop() {
		moves = moves[:0]
		for _, seed := range append(seedRange(1, 20), 31) {
			sc := *base
			sc.Seed = seed
			res, err := Run(&sc, Options{Policy: PolicyBalancer})
			if err != nil {
				b.Fatal(err)
			}
			for _, v := range res.Verdicts {
				if len(v.RecoveryS) > 1 {
					moves = append(moves, v.RecoveryS[1:]...) // a first phase is not a move
				}
			}
		}
	}
	slices.Sort(moves)
	over := func(s float64) (n float64) {
		for _, r := range moves {
			if r > s {
				n++
			}
		}
		return n
	}
	b.ReportMetric(float64(len(moves)), "moves")
	b.ReportMetric(over(3), "moves-over-3s")
	b.ReportMetric(over(5), "moves-over-5s")
	b.ReportMetric(over(15), "moves-over-15s")
	b.ReportMetric(moves[len(moves)/2], "median-s")
	b.ReportMetric(moves[len(moves)*9/10], "p90-s")
}

func seedRange(from, to int64) (s []int64) {
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}
