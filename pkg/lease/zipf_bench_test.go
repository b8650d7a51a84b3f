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
// Redis calls per check, and the share of leased tokens that expired unspent. Phases as
// the benchmark runs them for allot, three times: 5 s of warm-up and 10 s measured at the
// closed loop's rate, 10 s at the open loop's (a sixth of the null server's), then 25 s
// idle (the null server's turn); without the warm-up; and the same rate without a pause.
//
//	go test -run '^$' -bench ZipfMix ./pkg/lease/
func BenchmarkZipfMix(b *testing.B) {
	for _, c := range []struct {
		name         string
		closed, open float64 // checks/s
		warm, idle   time.Duration
	}{
		{"bench-phases", 28_000, 6_400, 5 * time.Second, 25 * time.Second},
		{"bench-phases-no-warm-up", 28_000, 6_400, 0, 20 * time.Second},
		{"steady", 28_000, 28_000, 0, 0},
	} {
		for _, q := range []time.Duration{10 * time.Second, 30 * time.Second} {
			b.Run(fmt.Sprintf("%s/quiet=%v", c.name, q), func(b *testing.B) {
				for b.Loop() {
					r := zipfMix(b, c.closed, c.open, c.warm, c.idle, q)
					b.ReportMetric(r.callsClosed, "calls/check-closed")
					b.ReportMetric(r.calls, "calls/check")
					b.ReportMetric(r.expired, "expired-%")
				}
			})
		}
	}
}

type zipfResult struct{ callsClosed, calls, expired float64 }

func zipfMix(b *testing.B, closed, open float64, warm, idle, quiet time.Duration) zipfResult {
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
	var closedChecks, closedCalls, all int64
	for range 3 {
		all += run(closed, warm)
		c0 := next.calls.Load()
		n := run(closed, 10*time.Second)
		closedChecks += n
		closedCalls += next.calls.Load() - c0
		all += n + run(open, 10*time.Second)
		clk.Advance(idle)
	}
	g := rec.tokens[EventGranted].Load()
	return zipfResult{
		callsClosed: float64(closedCalls) / float64(closedChecks),
		calls:       float64(next.calls.Load()) / float64(all),
		expired:     100 * float64(rec.tokens[EventExpired].Load()) / float64(max(g, 1)),
	}
}
