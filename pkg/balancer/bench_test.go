package balancer

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// benchReports builds per region one report of ids identities (ids/regions of them busy
// in each region), as one enforcer would send.
func benchReports(ids, per int, region string, seq uint64, end time.Time, offset int) []*allotv1.ReportRequest {
	var out []*allotv1.ReportRequest
	for start := 0; start < ids; start += per {
		rq := report(region, fmt.Sprintf("e%d", start/per), seq, end)
		for i := start; i < min(start+per, ids); i++ {
			rq.Usage = append(rq.Usage, &allotv1.IdentityUsage{Rule: "default", Identity: fmt.Sprintf("key:%d", (i+offset)%ids),
				Admitted: float64(i%97) * 10, Refused: float64(i % 7)})
		}
		out = append(out, rq)
	}
	return out
}

// BenchmarkRecompute1M: one recompute of 1,000,000 identities × 3 regions, each region
// having reported every identity (with the policy in pkg/share).
func BenchmarkRecompute1M(b *testing.B) {
	const ids = 1_000_000
	cfg := testConfig()
	cfg.Learning = time.Second
	c, err := NewCore(cfg)
	if err != nil {
		b.Fatal(err)
	}
	now := t0
	c.Published(c.Tick(now), now)
	reps := make([][]*allotv1.ReportRequest, 3)
	for r, name := range regions3 {
		reps[r] = benchReports(ids, cfg.MaxEntries, name, 1, now, r*ids/3)
	}
	seq := uint64(1)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		seq++
		for r := range reps {
			for _, rq := range reps[r] {
				rq.Seq = seq
				if err := c.Ingest(now, rq); err != nil {
					b.Fatal(err)
				}
			}
		}
		now = now.Add(cfg.Interval)
		b.StartTimer()
		p := c.Tick(now)
		b.StopTimer()
		c.Published(p, now)
		b.StartTimer()
	}
	b.StopTimer()
	reps = nil // the reports' own memory is not the core's
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "core-heap-MiB") // live heap: the core's state
	if st := c.Stats(now); st.Tracked != ids || st.Recomputes < 1 {
		b.Fatalf("tracked %d recomputes %d", st.Tracked, st.Recomputes)
	}
}

// BenchmarkIngest10k: ingestion of one region's interval of 10,000 identities (one
// report of 10,000 entries), into a core already tracking them.
func BenchmarkIngest10k(b *testing.B) {
	cfg := testConfig()
	c, err := NewCore(cfg)
	if err != nil {
		b.Fatal(err)
	}
	rq := benchReports(10_000, 10_000, "us-east", 1, t0, 0)[0]
	_ = c.Ingest(t0, rq)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		rq.Seq = uint64(i + 2)
		if err := c.Ingest(t0, rq); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/10_000, "ns/identity")
}

// BenchmarkTop20Of1M: Core.Top(20) over 1,000,000 tracked identities with demand (the
// dashboard's once-an-interval sample): how long it holds the core's mutex.
func BenchmarkTop20Of1M(b *testing.B) {
	const ids = 1_000_000
	cfg := testConfig()
	cfg.Learning = time.Second
	c, err := NewCore(cfg)
	if err != nil {
		b.Fatal(err)
	}
	now := t0
	c.Published(c.Tick(now), now)
	for r, name := range regions3 {
		for _, rq := range benchReports(ids, cfg.MaxEntries, name, 1, now, r*ids/3) {
			if err := c.Ingest(now, rq); err != nil {
				b.Fatal(err)
			}
		}
	}
	now = now.Add(cfg.Interval)
	c.Published(c.Tick(now), now) // a recompute: every identity has a smoothed demand
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if top := c.Top(20); len(top) != 20 {
			b.Fatalf("Top(20) returned %d", len(top))
		}
	}
}
