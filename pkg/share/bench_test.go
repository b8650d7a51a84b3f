package share

import (
	"math"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user + system CPU time: on a shared machine the wall clock
// of a benchmark measures the neighbours too.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchIdentities is the recompute the balancer does every interval at the design's
// scale (issue 7: 1,000,000 identities × 3 regions, < 0.5 s and < 1 GB).
const benchIdentities = 1_000_000

// benchInputs are the demand patterns the identities cycle through: a steady split, a
// wobble, a shift, an idle key, a silent region, an over-limit key.
func benchInputs() []Input {
	nan := math.NaN()
	def := []float64{0.5, 0.3, 0.2}
	free := []float64{nan, nan, nan}
	mk := func(d0, d1, d2 float64, held []float64) Input {
		return Input{Limit: 1000, Demand: []float64{d0, d1, d2}, Default: def, Held: held}
	}
	return []Input{
		mk(500, 300, 100, free),
		mk(560, 280, 60, free),
		mk(0, 100, 1200, free),
		mk(0, 0, 0, free),
		mk(900, nan, 0, []float64{nan, 0.3, nan}),
		mk(2000, 1500, 10, free),
		mk(100, 900, 0, free),
		mk(333, 333, 334, free),
	}
}

// BenchmarkRecompute1M is one whole recompute pass over 1M identities × 3 regions, the
// states updated in place (AllocateInto with dst = st), the inputs shifting between
// passes so every path runs. One op = the whole pass; ns/identity and the states' memory
// are reported alongside.
func BenchmarkRecompute1M(b *testing.B) {
	cfg := DefaultConfig()
	inputs := benchInputs()
	states := make([]State, benchIdentities)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range states {
		states[i] = Allocate(cfg, State{}, inputs[i%len(inputs)])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	pass := 1
	changes := 0
	b.ResetTimer()
	start, startCPU := time.Now(), cpuTime()
	for b.Loop() {
		for i := range states {
			var changed bool
			states[i], changed = AllocateInto(states[i], cfg, states[i], inputs[(i+pass)%len(inputs)])
			if changed {
				changes++
			}
		}
		pass++
	}
	elapsed, cpu := time.Since(start), cpuTime()-startCPU
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N)/benchIdentities, "ns/identity")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/benchIdentities, "cpu-ns/identity")
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/pass")
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MB-states")
	b.ReportMetric(float64(changes)/float64(b.N)/benchIdentities, "changed/identity")
}

// BenchmarkRecompute1MAllocate is the same pass through Allocate (new slices per
// identity), for comparison: what a balancer that does not reuse its states pays.
func BenchmarkRecompute1MAllocate(b *testing.B) {
	cfg := DefaultConfig()
	inputs := benchInputs()
	states := make([]State, benchIdentities)
	for i := range states {
		states[i] = Allocate(cfg, State{}, inputs[i%len(inputs)])
	}
	pass := 1
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		for i := range states {
			states[i] = Allocate(cfg, states[i], inputs[(i+pass)%len(inputs)])
		}
		pass++
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/benchIdentities, "ns/identity")
}

// BenchmarkAllocateInto is one identity's recompute.
func BenchmarkAllocateInto(b *testing.B) {
	cfg := DefaultConfig()
	inputs := benchInputs()
	st := Allocate(cfg, State{}, inputs[0])
	i := 0
	for b.Loop() {
		st, _ = AllocateInto(st, cfg, st, inputs[i%len(inputs)])
		i++
	}
}

// BenchmarkStepInto is one step of one identity's change plan.
func BenchmarkStepInto(b *testing.B) {
	may := []float64{0.58, 0.32, 0.10}
	target := []float64{0.01, 0.1, 0.89}
	next := make([]float64, 0, 3)
	for b.Loop() {
		next, _ = StepInto(next, may, target)
	}
}
