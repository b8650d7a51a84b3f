package lease

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/loadgen"
)

// BenchmarkZipfMix replays the load benchmark's workload (e2e/load_test.go: 10,000 keys,
// Zipf s = 1.1, one rule of 500/s burst 500, one enforcer) on a virtual clock over a memory
// store, with refills run in line (SyncRefill), so the figures are exact and repeatable:
// Redis calls per check, the share of leased tokens that expired unspent, and the share of
// open-loop checks that waited on a foreground call (the checks p99 lands on when they
// approach 1%). Schedules:
//
//   - bench: the benchmark's own, as `make bench-load` runs it for allot: 15 s of the
//     closed loop and 5 s of the open loop's key streams before the rounds, then five
//     rounds, each the closed loop, then the open loop (at a sixth of the closed rate),
//     each in four segments A B B A of 5 s measured, after a warm-up of 5 s (closed) or
//     3 s (open) for a segment that does not follow its own target's; allot is idle
//     8–15 s between its segments while the other target runs.
//   - steady: the closed loop's rate without a pause, measured over three 10 s windows
//     after 20 s.
//
// Run it with:
//
//	go test -run '^$' -bench ZipfMix -benchtime 1x ./pkg/lease/
func BenchmarkZipfMix(b *testing.B) {
	for _, sched := range []string{"bench", "steady"} {
		for _, q := range []time.Duration{30 * time.Second, 2 * time.Minute} {
			b.Run(fmt.Sprintf("%s/quiet=%v", sched, q), func(b *testing.B) {
				for b.Loop() {
					r := zipfMix(b, sched, q)
					b.ReportMetric(r.callsClosed, "calls/check-closed")
					b.ReportMetric(r.calls, "calls/check")
					b.ReportMetric(r.expired, "expired-%")
					if sched == "bench" {
						b.ReportMetric(r.openWaits, "open-waits-%")
					}
				}
			})
		}
	}
}

type zipfResult struct{ callsClosed, calls, expired, openWaits float64 }

// The rates of the replay: the closed loop's, and the open loop's (a sixth of the null
// server's closed-loop rate) as measured on the 2-core machines.
const (
	zipfClosed = 28_000
	zipfOpen   = 5_400
)

func zipfMix(b *testing.B, sched string, quiet time.Duration) zipfResult {
	clk := clock.NewFake(t0)
	mem := bucket.NewMemory(clk, 0)
	next := &counting{next: mem}
	rec := &recorder{}
	cfg := DefaultConfig()
	cfg.Clock = clk
	cfg.SyncRefill = true
	cfg.Observer = rec.observe
	cfg.QuietTTL = quiet
	s, err := New(next, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("key:key-%d", i)
	}
	// The key streams e2e draws from (load_test.go, loadphase_test.go): every closed loop
	// starts its 64 callers' streams afresh from seeds 1–64 (taken here in turn), every open
	// loop one stream, from seed 98 for a warm-up and 99 + i for a target's i-th measured
	// segment of the round. So each segment replays the same sequence of keys, and a key of
	// the tail comes back at the schedule's period rather than at random.
	openKeys := func(seed uint64) func() int { return loadgen.NewKeys(10_000, 1.1, seed).Next }
	closedKeys := func() func() int {
		ks := make([]func() int, 64)
		for w := range ks {
			ks[w] = openKeys(uint64(w + 1))
		}
		return inTurn(ks...)
	}
	req := &bucket.Request{Limits: []bucket.Limit{{Name: "r", Rate: 500, Burst: 500}}, Want: 1}
	ctx := context.Background()
	run := func(rate float64, d time.Duration, key func() int) (checks int64) {
		step := time.Duration(float64(time.Second) / rate)
		for t := time.Duration(0); t < d; t += step {
			req.Identity = ids[key()]
			if _, err := s.Take(ctx, req); err != nil {
				b.Fatal(err)
			}
			clk.Advance(step)
			checks++
		}
		return checks
	}
	var closedChecks, closedCalls, all, openChecks, openWaits int64
	measure := func(rate float64, d time.Duration, key func() int) {
		c0 := next.calls.Load()
		n := run(rate, d, key)
		closedChecks += n
		closedCalls += next.calls.Load() - c0
		all += n
	}
	if sched == "steady" {
		key := loadgen.NewKeys(10_000, 1.1, 1).Next
		all += run(zipfClosed, 20*time.Second, key)
		for range 3 {
			measure(zipfClosed, 10*time.Second, key)
		}
	} else {
		// Each loop in four segments, A B B A, each measured 5 s; a segment that does not
		// follow its own target's first runs a warm-up (closed 5 s, open 3 s). In odd
		// rounds (r = 0, 2, ...) the null server is A.
		openLoop := false
		var roundWaits [4]int64 // the open loop's calls of one round, by why (EventCallNew...)
		var roundChecks int64
		var measured uint64 // allot's measured open segments so far in the round
		seg := func(allot bool, warm, rate float64) {
			w, m := time.Duration(warm*float64(time.Second)), 5*time.Second
			if !allot {
				clk.Advance(w + m)
				return
			}
			if !openLoop {
				if w > 0 {
					all += run(rate, w, closedKeys())
				}
				measure(rate, m, closedKeys())
				return
			}
			if w > 0 {
				all += run(rate, w, openKeys(98))
			}
			var w0 [4]int64
			for i := range w0 {
				w0[i] = rec.n[EventCallNew+Event(i)].Load()
			}
			c0 := rec.n[EventCall].Load()
			n := run(rate, m, openKeys(99+measured))
			measured++
			openChecks += n
			openWaits += rec.n[EventCall].Load() - c0
			for i := range w0 {
				roundWaits[i] += rec.n[EventCallNew+Event(i)].Load() - w0[i]
			}
			roundChecks += n
			all += n
		}
		// Before the rounds: the closed loop's streams for 15 s, then the open loop's three
		// (seeds 98–100) in turn, closed, for 5 s.
		all += run(zipfClosed, 15*time.Second, closedKeys())
		all += run(zipfClosed, 5*time.Second, inTurn(openKeys(98), openKeys(99), openKeys(100)))
		for r := range 5 {
			roundWaits, roundChecks, measured = [4]int64{}, 0, 0
			allotFirst := r%2 == 1
			for _, loop := range []struct {
				rate, warm float64
				open       bool
			}{{zipfClosed, 5, false}, {zipfOpen, 3, true}} {
				openLoop = loop.open
				seg(allotFirst, loop.warm, loop.rate)
				seg(!allotFirst, loop.warm, loop.rate)
				seg(!allotFirst, 0, loop.rate)
				seg(allotFirst, loop.warm, loop.rate)
			}
			pct := func(i int) float64 { return 100 * float64(roundWaits[i]) / float64(max(roundChecks, 1)) }
			b.Logf("round %d: open-loop checks that waited on a call, %% by why: new %.3f expired %.3f spent %.3f exact %.3f",
				r+1, pct(0), pct(1), pct(2), pct(3))
		}
	}
	g := rec.tokens[EventGranted].Load()
	return zipfResult{
		callsClosed: float64(closedCalls) / float64(closedChecks),
		calls:       float64(next.calls.Load()) / float64(all),
		expired:     100 * float64(rec.tokens[EventExpired].Load()) / float64(max(g, 1)),
		openWaits:   100 * float64(openWaits) / float64(max(openChecks, 1)),
	}
}

// inTurn draws from the given key streams one after the other, starting with the second.
func inTurn(streams ...func() int) func() int {
	i := 0
	return func() int {
		i = (i + 1) % len(streams)
		return streams[i]()
	}
}
