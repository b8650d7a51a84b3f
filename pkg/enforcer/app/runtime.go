package app

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// ApplyRuntime sets the Go runtime settings cfg asks for, for the whole process: the
// garbage collector's target (Config.GCPercent) and its heap floor (Config.GCHeapFloorMiB),
// unless the environment sets GOGC, which the Go runtime has read already and which wins.
// It returns what it did, for the log, and a stop function that ends the floor's tuning
// (GOGC stays where the last collection left it). A process's owner calls it once
// (cmd/enforcer); New does not, since it may run beside other code in one process.
func ApplyRuntime(cfg *Config, getenv func(string) string) (string, func()) {
	if v := getenv("GOGC"); v != "" {
		return fmt.Sprintf("GOGC=%s from the environment (gc_percent %d, gc_heap_floor_mib %d not applied)", v, cfg.GCPercent, cfg.GCHeapFloorMiB), func() {}
	}
	debug.SetGCPercent(cfg.GCPercent)
	if cfg.GCHeapFloorMiB == 0 {
		return fmt.Sprintf("gc_percent %d", cfg.GCPercent), func() {}
	}
	f := newHeapFloor(uint64(cfg.GCHeapFloorMiB)<<20, cfg.GCPercent)
	f.arm()
	return fmt.Sprintf("gc_percent %d, heap floor %d MiB", cfg.GCPercent, cfg.GCHeapFloorMiB), f.stop
}

// heapFloor keeps the collector's heap goal at or above floor bytes. The goal after a
// collection is live + (live + stacks + globals) × GOGC/100 (the runtime's own formula,
// with what that collection found); with GOGC fixed, a small live heap makes a small
// goal and a collection every few megabytes allocated. After each collection heapFloor
// sets GOGC to the larger of base and the percentage that puts the next goal at floor.
//
// Why: an enforcer's live heap is small (10–20 MB) while gRPC allocates ~4 KB per check,
// so at gc_percent alone it collected about once a second at 10,000 checks/s, and each
// collection (the mark worker on one of two cores for several ms, and assists) made a
// few percent of checks slow (the load benchmark's GC traces: ALLOT_BENCH_GODEBUG=
// gctrace=1 ALLOT_BENCH_LOG=1). With a 256 MiB floor it collects every few seconds. The
// cost is memory: the heap grows to about floor before it is collected, then follows the
// live heap × (1 + base/100) once that is larger.
//
// It runs on the runtime's cleanup goroutine, once per collection (a cleanup on a
// sentinel object that each run replaces), so it owns no goroutine; stop ends the chain
// at the next collection.
type heapFloor struct {
	floor   uint64
	base    int
	stopped atomic.Bool
	samples []metrics.Sample // only collected reads them: one sentinel is armed at a time
	// onCollected, if set (tests), is called with the GOGC each collection set.
	onCollected func(int)
}

func newHeapFloor(floor uint64, base int) *heapFloor {
	return &heapFloor{floor: floor, base: base, samples: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"},
	}}
}

// sentinel is the object whose collection tells heapFloor a cycle ended (big enough not
// to share a tiny-allocator block, whose cleanups may never run).
type sentinel struct{ _ [32]byte }

func (f *heapFloor) arm() { runtime.AddCleanup(new(sentinel), (*heapFloor).collected, f) }

func (f *heapFloor) stop() { f.stopped.Store(true) }

// collected runs after a collection: it sets GOGC for the next one and re-arms.
func (f *heapFloor) collected() {
	if f.stopped.Load() {
		return
	}
	metrics.Read(f.samples)
	p := gcPercentFor(f.floor, f.base, f.samples[0].Value.Uint64(), f.samples[1].Value.Uint64()+f.samples[2].Value.Uint64())
	debug.SetGCPercent(p)
	// Re-arm before telling anyone: a collection that starts after onCollected returns
	// must find the new sentinel allocated, or it passes unseen and the chain waits a
	// whole extra cycle (or, in an idle process, forever).
	f.arm()
	if f.onCollected != nil {
		f.onCollected(p)
	}
}

// maxFloorPercent bounds the GOGC heapFloor sets (reached only with a live heap under a
// ten-thousandth of the floor, e.g. at start).
const maxFloorPercent = 1_000_000

// gcPercentFor is the GOGC that puts the collector's next goal, live + (live + roots) ×
// GOGC/100, at floor, and never below base. roots is the scannable stacks and globals.
func gcPercentFor(floor uint64, base int, live, roots uint64) int {
	if live >= floor || live == 0 {
		return base
	}
	p := (floor - live) * 100 / (live + roots)
	return int(max(uint64(base), min(p, maxFloorPercent)))
}
