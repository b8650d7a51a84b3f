package e2e

// The segments of a round: each loop runs A B B A, and a target's two segments are summed
// (BenchmarkEnforcerRLS in load_test.go).

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/loadgen"
	"github.com/allot-dev/allot/pkg/testenv"
)

// segments is the order a round runs its two targets' loops in, first and second: A B B A.
// Each target's two measured segments are summed, so a machine whose speed drifts across
// the round slows both targets alike, to first order; the second target runs its two back
// to back (one loop of twice the length, read in two halves).
func segments(first, second *loadTarget) []*loadTarget {
	return []*loadTarget{first, second, second, first}
}

// eachSegment runs run for each segment of seq, after warm of the same loop unless the
// segment follows its own target's, and returns each target's phase.
func eachSegment(seq []*loadTarget, warm time.Duration, run func(t *loadTarget, warm time.Duration, p *phase)) map[string]*phase {
	ps := map[string]*phase{}
	for i, t := range seq {
		w := warm
		if i > 0 && seq[i-1] == t {
			w = 0
		}
		if ps[t.name] == nil {
			ps[t.name] = &phase{}
		}
		run(t, w, ps[t.name])
	}
	return ps
}

// phase is one target's measured segments of one loop in a round, summed.
type phase struct {
	runs     []*loadgen.Result
	d        sample  // the counters' change over the measured parts
	degraded float64 // answers from fallback or a fail mode, warm-ups included
	refused  int64
	stall    map[string]float64 // Redis's latency monitor over allot's segments
}

func (p *phase) add(res *loadgen.Result, d sample, degraded float64, refused int64) {
	p.runs = append(p.runs, res)
	p.d.add(d)
	p.degraded += degraded
	p.refused += refused
}

// closed runs one segment of the closed loop against t: warm of it not measured (none
// when t ran the segment before), then loadClosed/2 measured, added to p.
func (t *loadTarget) closed(b *testing.B, c *testenv.Cluster, keys func(int) *loadgen.Keys, warm time.Duration, profile bool, p *phase) {
	redisLatencyReset(b, c)
	w0 := t.proc.sample(b, c)
	if warm > 0 {
		if res := loadgen.ClosedLoop(context.Background(), loadCallers, warm, loadMax, keys, t.check); res.Errors > 0 {
			b.Fatalf("%s, warm-up: %d errors, first: %v", t.name, res.Errors, res.FirstErr)
		}
	}
	s0 := t.proc.sample(b, c)
	t.refused.reset()
	profiled := make(chan struct{})
	if path := os.Getenv("ALLOT_BENCH_PROFILE"); path != "" && profile && t.proc.http != "" {
		go func() {
			defer close(profiled)
			t.proc.profile(b, path)
			t.proc.fetch(b, "allocs", path+".allocs") // allocations since the start, by site
		}()
	} else {
		close(profiled)
	}
	res := loadgen.ClosedLoop(context.Background(), loadCallers, loadClosed/2, loadMax, keys, t.check)
	s1 := t.proc.sample(b, c)
	<-profiled
	if res.Errors > 0 {
		b.Fatalf("%s, closed loop: %d errors, first: %v", t.name, res.Errors, res.FirstErr)
	}
	p.add(res, s1.sub(s0), s1.degraded()-w0.degraded(), t.refused.load())
	if t.proc.http != "" {
		p.stall = redisLatency(b, c, p.stall)
	}
}

// closedRow is t's row of the round from its closed loop's segments.
func (t *loadTarget) closedRow(p *phase) *loadRow {
	res := loadgen.Merge(p.runs...)
	d := &p.d
	n := float64(res.Calls)
	row := &loadRow{Target: t.name, Checks: res.Calls, ChecksPerSec: res.PerSecond(),
		ServerUsPerCheck:   float64(d.server.Microseconds()) / n,
		RedisUsPerCheck:    float64(d.redisCPU.Microseconds()) / n,
		ClientUsPerCheck:   float64(d.client.Microseconds()) / n,
		RedisCallsPerCheck: float64(d.redis) / n,
		ServerSysPerCheck:  float64(d.serverSys) / n,
		ClientSysPerCheck:  float64(d.clientSys) / n,
		RefusedPct:         100 * float64(p.refused) / n,
		StealPct:           100 * float64(d.steal) / float64(max(d.total, 1)),
		Sources:            map[string]float64{},
	}
	if t.proc.http != "" { // the null server has no redis, metrics or sources
		for src, v := range d.sources {
			if v > 0 {
				row.Sources[src] = 100 * v / n
			}
		}
		if d.granted > 0 {
			row.LeaseExpiredPct = 100 * d.expired / d.granted
		}
		row.Degraded = int64(p.degraded) // the warm-ups' answers count too
		row.RedisStallMs = p.stall
	} else {
		row.RedisUsPerCheck, row.RedisCallsPerCheck = 0, 0
	}
	return row
}

// openKeys is the key stream of an open loop: stream 0 for a segment's warm-up, 1 + i
// for a target's i-th measured segment of a round. Every round starts them afresh from
// their seeds, as the closed loops' callers do theirs: each segment replays the same keys.
func openKeys(i int) *loadgen.Keys { return loadgen.NewKeys(loadKeys, loadZipfS, 98+uint64(i)) }

// openWalk returns, once each, the keys of the first loadOpenWalk draws of every stream
// the open loops draw from (openKeys 0 to 2): more than a segment draws at 12,000 checks/s,
// above any open-loop rate of these machines (a sixth of the null server's closed loop).
func openWalk() []int {
	seen := make(map[int]bool)
	var walk []int
	for i := range 3 {
		ks := openKeys(i)
		for range loadOpenWalk {
			if k := ks.Next(); !seen[k] {
				seen[k] = true
				walk = append(walk, k)
			}
		}
	}
	return walk
}

// open runs one segment of the open loop against t at rate: warm of it not measured (none
// when t ran the segment before; otherwise the target has been idle since its last
// segment while the other target ran, and a running enforcer's latency, not that of one
// whose busy leases have all expired, is what is measured), then loadOpen/2 measured,
// added to p. The warm-up's fallback answers still count.
func (t *loadTarget) open(b *testing.B, c *testenv.Cluster, rate float64, warm time.Duration, p *phase) {
	redisLatencyReset(b, c)
	w0 := t.proc.sample(b, c)
	if warm > 0 {
		if wr, err := loadgen.OpenLoop(context.Background(), rate, warm, loadCallers, openKeys(0), t.check); err != nil {
			b.Fatal(err)
		} else if wr.Errors > 0 {
			b.Fatalf("%s, open loop warm-up: %d errors, first: %v", t.name, wr.Errors, wr.FirstErr)
		}
	}
	s0 := t.proc.sample(b, c)
	traced := make(chan struct{})
	trace, prof := os.Getenv("ALLOT_BENCH_TRACE"), os.Getenv("ALLOT_BENCH_PROFILE_OPEN")
	if (trace != "" || prof != "") && t.proc.pprof != "" && !t.traced {
		t.traced = true
		suffix := ""
		if t.proc.http == "" {
			suffix = ".null"
		}
		go func() {
			defer close(traced)
			if trace != "" {
				t.proc.fetch(b, "trace?seconds=3", trace+suffix)
			}
			if prof != "" {
				t.proc.fetch(b, "profile?seconds=5", prof+suffix)
			}
		}()
	} else {
		close(traced)
	}
	defer func() { <-traced }()
	or, err := loadgen.OpenLoop(context.Background(), rate, loadOpen/2, loadCallers, openKeys(1+len(p.runs)), t.check)
	if err != nil {
		b.Fatal(err)
	}
	s1 := t.proc.sample(b, c)
	if or.Errors > 0 || or.Dropped > 0 {
		b.Fatalf("%s, open loop: %d errors, %d dropped, first: %v", t.name, or.Errors, or.Dropped, or.FirstErr)
	}
	p.add(or, s1.sub(s0), s1.degraded()-w0.degraded(), 0)
	if t.proc.http != "" {
		p.stall = redisLatency(b, c, p.stall)
	}
}

// addOpen adds t's open loop segments' figures to its row of the round.
func (t *loadTarget) addOpen(row *loadRow, p *phase, rate float64) {
	or := loadgen.Merge(p.runs...)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	row.OpenRate = rate
	row.P50ms, row.P99ms, row.P999ms = ms(or.Quantile(0.5)), ms(or.Quantile(0.99)), ms(or.Quantile(0.999))
	row.P90ms, row.P95ms, row.P98ms = ms(or.Quantile(0.90)), ms(or.Quantile(0.95)), ms(or.Quantile(0.98))
	row.SendLateP99ms = ms(or.SendLateQuantile(0.99))
	row.ServerPeakRSSMiB = procPeakRSSMiB(t.proc.cmd.Process.Pid)
	row.OpenServerUsPerCheck = float64(p.d.server.Microseconds()) / float64(or.Calls)
	if t.proc.http != "" {
		row.Degraded += int64(p.degraded)
		row.OpenRedisPct = 100 * p.d.sources["redis"] / float64(or.Calls)
		row.OpenLeaseEvents = map[string]float64{}
		for ev, v := range p.d.events {
			if v > 0 {
				row.OpenLeaseEvents[ev] = 100 * v / float64(or.Calls)
			}
		}
		if row.RedisStallMs == nil {
			row.RedisStallMs = map[string]float64{}
		}
		for k, v := range p.stall {
			row.RedisStallMs[k] = max(row.RedisStallMs[k], v)
		}
	}
}
