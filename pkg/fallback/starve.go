package fallback

import (
	"math"
	"runtime/metrics"
	"sync"
	"time"
)

// schedLatency is the runtime metric of how long goroutines waited, runnable, before they
// ran: when it shows waits as long as a Redis call's deadline, the process itself is
// starved (a saturated host, a GC pause) and deadline misses are not evidence against a
// shard.
const schedLatency = "/sched/latencies:seconds"

// starvation counts, from the runtime's scheduling-latency histogram, how many goroutines
// have waited at least a threshold to run since the process started. Reading it costs a
// few microseconds and an allocation, so the Store reads it only on the failure path.
// Safe for concurrent use.
type starvation struct {
	mu        sync.Mutex // mu guards sample
	sample    [1]metrics.Sample
	threshold float64 // seconds
}

func newStarvation(threshold time.Duration) *starvation {
	st := &starvation{threshold: threshold.Seconds()}
	st.sample[0].Name = schedLatency
	return st
}

// slow returns the number of scheduling waits of at least the threshold so far. Two reads
// that differ mean the process was starved in between.
func (st *starvation) slow() uint64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	metrics.Read(st.sample[:])
	if st.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0 // metric unknown to this runtime: never claims starvation
	}
	h := st.sample[0].Value.Float64Histogram()
	var n uint64
	// Bucket i holds waits in [Buckets[i], Buckets[i+1]); count those starting at or
	// above the threshold, so a wait is counted only if it surely reached it.
	for i, c := range h.Counts {
		if lo := h.Buckets[i]; lo >= st.threshold && !math.IsInf(lo, -1) {
			n += c
		}
	}
	return n
}
