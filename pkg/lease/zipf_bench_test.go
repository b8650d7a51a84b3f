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
//   - bench: the benchmark's own, three rounds as it runs them for allot (since e25138e):
//     the closed loop, then the open loop (at a sixth of the closed rate), each in four
//     segments A B B A of 5 s measured, after a warm-up of 5 s (closed) or 3 s (open) for a
//     segment that does not follow its own target's; allot is idle 8–15 s between its
//     segments while the other target runs.
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
	keys := loadgen.NewKeys(10_000, 1.1, 1)
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("key:key-%d", i)
	}
	req := &bucket.Request{Limits: []bucket.Limit{{Name: "r", Rate: 500, Burst: 500}}, Want: 1}
	ctx := context.Background()
	run := func(rate float64, d time.Duration) (checks int64) {
		step := time.Duration(float64(time.Second) / rate)
		for t := time.Duration(0); t < d; t += step {
			req.Identity = ids[keys.Next()]
			if _, err := s.Take(ctx, req); err != nil {
				b.Fatal(err)
			}
			clk.Advance(step)
			checks++
		}
		return checks
	}
	var closedChecks, closedCalls, all, openChecks, openWaits int64
	measure := func(rate float64, d time.Duration) {
		c0 := next.calls.Load()
		n := run(rate, d)
		closedChecks += n
		closedCalls += next.calls.Load() - c0
		all += n
	}
	if sched == "steady" {
		all += run(zipfClosed, 20*time.Second)
		for range 3 {
			measure(zipfClosed, 10*time.Second)
		}
	} else {
		// Each loop in four segments, A B B A, each measured 5 s; a segment that does not
		// follow its own target's first runs a warm-up (closed 5 s, open 3 s). In odd
		// rounds (r = 0, 2, ...) the null server is A.
		openLoop := false
		seg := func(allot bool, warm, rate float64) {
			w, m := time.Duration(warm*float64(time.Second)), 5*time.Second
			if !allot {
				clk.Advance(w + m)
				return
			}
			all += run(rate, w)
			if !openLoop {
				measure(rate, m)
				return
			}
			w0 := rec.n[EventCall].Load()
			n := run(rate, m)
			openChecks += n
			openWaits += rec.n[EventCall].Load() - w0
			all += n
		}
		for r := range 3 {
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
