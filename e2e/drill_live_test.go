package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allot-dev/allot/e2e/stack"
	"github.com/allot-dev/allot/pkg/sim"
	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// liveScenario is the scenario the live drill replays (its key is the stack's drill-shift
// rule, so the stack needs no rules of its own for it).
const liveScenario = "stack-shift.yaml"

// drillTrafficShiftLive: regionsim's live mode (pkg/sim.RunLive, what `regionsim run -mode
// live` runs) replays configs/scenarios/stack-shift.yaml against the stack's enforcers —
// the same Poisson arrivals as virtual mode, over gRPC — and the run is judged by the same
// summary as virtual mode: every key's max_window_ratio within the scenario's expectation
// (1.01) and every phase recovered within its recovery_s (15 s). The figures count every
// answer, from shared counts or not (the traffic-shift drill beside it judges the shared
// ones alone); the answers by source are logged to tell them apart.
func drillTrafficShiftLive(t *testing.T, s *stack.Stack) {
	sc, err := scenario.Load(filepath.Join(stack.RepoRoot(t), "configs", "scenarios", liveScenario))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string][]string{}
	for _, r := range s.Regions {
		for _, e := range r.Enforcers {
			targets[r.Name] = append(targets[r.Name], e.GRPC)
		}
	}
	var progress strings.Builder
	res, err := sim.RunLive(context.Background(), sc, sim.LiveOptions{Targets: targets, Progress: &progress})
	if err != nil {
		t.Fatalf("regionsim live run: %v", err)
	}
	var table, js strings.Builder
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	t.Logf("regionsim live, %s against the stack (targets %v):\n%s\nsummary: %s", sc.Name, targets, table.String(), strings.TrimSpace(js.String()))
	t.Logf("regionsim live, per second:\n%s", liveTimeline(res))

	for i, k := range res.Summary.Keys {
		if k.MaxWindowRatio > sc.Expect.MaxWindowRatio {
			t.Errorf("key %s: max_window_ratio %.4f > %.2f: the global limit did not hold", k.Key, k.MaxWindowRatio, sc.Expect.MaxWindowRatio)
		}
		for p, r := range k.RecoveryS {
			if r > sc.Expect.RecoveryS {
				t.Errorf("key %s, phase %d: recovered after %.0f s, want ≤ %.0f s", k.Key, p, r, sc.Expect.RecoveryS)
			}
		}
		if res.Verdicts[i].RecoveryFailed && len(k.RecoveryS) == 0 {
			t.Errorf("key %s: no recovery figure", k.Key)
		}
	}
	if !res.Summary.Pass {
		t.Errorf("the live run's summary fails: %s", strings.Join(res.Summary.Failures, "; "))
	}
}

// liveTimeline is one line per second: offered and admitted in each region, the share it
// answered with, and the answers not from shared counts (fallback, fail-open, errors).
func liveTimeline(res *sim.Result) string {
	var b strings.Builder
	for k := range res.Scenario.Keys {
		for sec := 0; sec < res.Seconds; sec++ {
			fmt.Fprintf(&b, "  %3ds", sec)
			for r, reg := range res.Scenario.Regions {
				c := res.Cell(k, sec, r)
				if c.Offered == 0 {
					continue
				}
				other := c.Sources[3] + c.Sources[4] + c.Sources[5] // sim.SourceColumns: fallback, fail_open, other
				fmt.Fprintf(&b, "  %s %d/%d share %.2f", reg.Name, c.Admitted, c.Offered, c.Share)
				if other > 0 {
					fmt.Fprintf(&b, " (%d not shared: fallback %d, fail-open %d, other %d)", other, c.Sources[3], c.Sources[4], c.Sources[5])
				}
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
