package enforcer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// checkStats are the two metrics every check updates: allot_enforcer_decisions_total
// {result, source} and the allot_enforcer_check_seconds histogram. Prometheus's own
// counter and histogram are one set of atomics that every core adds to, and on two cores
// under load the cache line moving between them cost ~30% of a check's CPU
// (BenchmarkCheckParallel's profile). Here each check adds to one of statStripes copies and
// a scrape sums them. Which copy: one handed out by a sync.Pool, whose Get returns the
// object the same P put back last, so each core keeps adding to its own copy and its cache
// lines stay put (a copy picked at random per check was on the other core's half the
// time). The pool only lends pointers into the fixed array: an object it drops at a GC
// loses no count, and New hands out the copies round robin. Counts are exact; the
// histogram's sum is kept in whole nanoseconds.
type checkStats struct {
	stripes [statStripes]checkStripe
	lend    sync.Pool // *checkStripe, pointing into stripes
	next    atomic.Uint32
}

const statStripes = 8

// latencyBuckets are the histogram's upper bounds in seconds.
var latencyBuckets = [...]float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1}

// latencyBounds are latencyBuckets in nanoseconds, for the check path's comparison.
var latencyBounds = func() (b [len(latencyBuckets)]time.Duration) {
	for i, s := range latencyBuckets {
		b[i] = time.Duration(s * float64(time.Second))
	}
	return b
}()

type checkStripe struct {
	decisions [2][numSources]atomic.Uint64 // [allowed][source]
	buckets   [len(latencyBuckets) + 1]atomic.Uint64
	sumNanos  atomic.Uint64
	_         [64]byte // the next stripe on another cache line
}

const (
	decisionsHelp = "Check decisions by result (allowed, refused) and by where the deciding answer came from."
	latencyHelp   = "Time to decide one check (rules match and store takes), excluding transport."
)

var (
	decisionsDesc = prometheus.NewDesc("allot_enforcer_decisions_total", decisionsHelp, []string{"result", "source"}, nil)
	latencyDesc   = prometheus.NewDesc("allot_enforcer_check_seconds", latencyHelp, nil, nil)
)

// observe counts one check. A shadow source counts as none (shadow rules never decide).
func (c *checkStats) observe(allowed int, src Source, took time.Duration) {
	if src == SourceShadow || src >= numSources {
		src = SourceNone
	}
	s, _ := c.lend.Get().(*checkStripe)
	if s == nil {
		s = &c.stripes[c.next.Add(1)%statStripes]
	}
	s.decisions[allowed][src].Add(1)
	i := 0
	for i < len(latencyBounds) && took > latencyBounds[i] {
		i++
	}
	s.buckets[i].Add(1)
	if took > 0 {
		s.sumNanos.Add(uint64(took))
	}
	c.lend.Put(s)
}

// decided returns the count of decisions by result and source, summed over the stripes.
func (c *checkStats) decided(allowed int, src Source) uint64 {
	var n uint64
	for i := range c.stripes {
		n += c.stripes[i].decisions[allowed][src].Load()
	}
	return n
}

// Describe implements prometheus.Collector.
func (c *checkStats) Describe(ch chan<- *prometheus.Desc) {
	ch <- decisionsDesc
	ch <- latencyDesc
}

// Collect implements prometheus.Collector: every (result, source) series, as the
// CounterVec they were exported as before, and the histogram.
func (c *checkStats) Collect(ch chan<- prometheus.Metric) {
	for a, result := range [2]string{"refused", "allowed"} {
		for src := Source(0); src < numSources; src++ {
			if src == SourceShadow {
				continue
			}
			ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.CounterValue, float64(c.decided(a, src)), result, src.String())
		}
	}
	var counts [len(latencyBuckets) + 1]uint64
	var sum uint64
	for i := range c.stripes {
		s := &c.stripes[i]
		for b := range counts {
			counts[b] += s.buckets[b].Load()
		}
		sum += s.sumNanos.Load()
	}
	cum := make(map[float64]uint64, len(latencyBuckets))
	var n uint64
	for b, le := range latencyBuckets {
		n += counts[b]
		cum[le] = n
	}
	n += counts[len(latencyBuckets)]
	ch <- prometheus.MustNewConstHistogram(latencyDesc, n, float64(sum)/1e9, cum)
}
