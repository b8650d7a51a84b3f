//go:build unix

package main

import (
	"bytes"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/sim"
	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// BenchmarkPopulation is the long-tail run (issue 26 §4: 10,000 keys, 10 minutes, in
// under 60 s) at a fifth of its keys and a tenth of its length, generated as
//
//	regionsim population -keys 2000 -busy 4 -middle 200 -seed 26 -duration 1m0s
//
// and replayed in virtual mode as `regionsim run` does (the summary only). It reports the
// simulator's cost per simulated request (sim-ns/request: wall time over every request
// offered, the regions running in parallel as in a run), the same in CPU time
// (cpu-ns/request: the process's user and system time, steadier than wall time on a
// shared machine) and per simulated second.
func BenchmarkPopulation(b *testing.B) {
	sc := populationScenario(b, 2000, 4, 200)
	var requests int64
	cpu0 := cpuTime(b)
	for b.Loop() {
		res, err := sim.Run(sc, sim.Options{Policy: sim.PolicyBalancer, SummaryOnly: true})
		if err != nil {
			b.Fatal(err)
		}
		requests = 0
		for _, k := range res.Summary.Keys {
			requests += k.Offered
		}
	}
	cpu := float64(cpuTime(b)-cpu0) / float64(b.N)
	per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(per/float64(requests), "sim-ns/request")
	b.ReportMetric(cpu/float64(requests), "cpu-ns/request")
	b.ReportMetric(per/sc.Duration.Seconds()/1e6, "sim-ms/sim-second")
	b.ReportMetric(float64(requests)/sc.Duration.Seconds(), "requests/sim-second")
}

// cpuTime is the process's user and system time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// populationScenario is `regionsim population -keys keys -busy busy -middle middle -seed 26
// -duration 1m0s` over three regions of three enforcers, parsed.
func populationScenario(tb testing.TB, keys, busy, middle int) *scenario.Scenario {
	tb.Helper()
	p := population{keys: keys, busy: busy, middle: middle, seed: 26, duration: time.Minute,
		regions: []string{"us-east", "eu-west", "ap-south"}, enforcers: []int{3, 3, 3}}
	var buf bytes.Buffer
	p.write(&buf)
	sc, err := scenario.Parse(buf.Bytes(), "population.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	return sc
}
