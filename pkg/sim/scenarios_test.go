package sim

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/sim/scenario"
)

const scenarioDir = "../../configs/scenarios"

func load(t testing.TB, name string) *scenario.Scenario {
	t.Helper()
	sc, err := scenario.Load(filepath.Join(scenarioDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func run(t testing.TB, sc *scenario.Scenario, policy string) *Result {
	t.Helper()
	res, err := Run(sc, Options{Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Every shipped scenario passes in virtual mode with the balancer, with the expectations
// its file states (the defaults unless a comment there says why).
func TestShippedScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(scenarioDir, "*.yaml"))
	if err != nil || len(files) < 8 {
		t.Fatalf("want at least 8 scenarios in %s, found %d (%v)", scenarioDir, len(files), err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) {
			t.Parallel() // each run is one goroutine on its own virtual clock
			sc := load(t, name)
			if len(sc.Keys) > 1000 && os.Getenv("ALLOT_POPULATIONS") == "" {
				// long-tail.yaml: a scale run of minutes, `make long-tail` (BENCHMARKS.md).
				t.Skipf("%s is a population of %d keys: `make long-tail` runs it (or ALLOT_POPULATIONS=1)", name, len(sc.Keys))
			}
			if (testing.Short() || raceEnabled) && sc.Duration.Seconds()*float64(len(sc.Keys)) > 2000 {
				t.Skipf("%s is long (%v × %d keys): it runs without -short and without -race", name, sc.Duration, len(sc.Keys))
			}
			res := run(t, sc, PolicyBalancer)
			var b strings.Builder
			res.WriteTable(&b)
			t.Log("\n" + b.String())
			if !res.Summary.Pass {
				t.Errorf("%s failed under the balancer:\n%s", name, strings.Join(res.Summary.Failures, "\n"))
			}
		})
	}
}

// With a report aggregator in every region (Options.Aggregate, docs/design.md §12) the
// scenarios of the control plane's faults pass as they do directly, with the expectations
// their files state: one enforcer cut off alone (it is released on the mark its
// region-mates' reports carry through the aggregator; without the marks forwarded
// enforcer-isolated falls to 0.803, isolated-across-leaders to 0.766), a region cut off, a
// leader change in the middle of a move, enforcers cut off in turn.
func TestAggregatedScenarios(t *testing.T) {
	for _, name := range []string{"enforcer-isolated.yaml", "enforcer-isolated-answer-lost.yaml", "isolated-across-leaders.yaml",
		"enforcers-cut-in-turn.yaml", "region-isolated.yaml", "leader-change-mid-plan.yaml", "shift-eu-to-us.yaml"} {
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) {
			t.Parallel()
			sc := load(t, name)
			res, err := Run(sc, Options{Policy: PolicyBalancer, Aggregate: true, SummaryOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Summary.Aggregated {
				t.Error("the summary does not say the reports went through aggregators")
			}
			if !res.Summary.Pass {
				t.Errorf("%s failed through aggregators:\n%s", name, strings.Join(res.Summary.Failures, "\n"))
			}
			for _, k := range res.Summary.Keys {
				t.Logf("%s: steady_ratio %.3f, max_window_ratio %.3f, recovery %v", k.Key, k.SteadyRatio, k.MaxWindowRatio, k.RecoveryS)
			}
		})
	}
}

// enforcer-isolated-answer-lost.yaml is what its name says only while its cut falls
// between a report's acceptance and its answer's arrival: the balancer took a report of
// the cut-off enforcer that the enforcer never heard was taken (its mark then names a
// later report than the balancer's last, not an earlier one). If the enforcers' report
// schedule moves, move the fault with it.
func TestAnswerLostScenarioLosesAnAnswer(t *testing.T) {
	t.Parallel()
	sc := load(t, "enforcer-isolated-answer-lost.yaml")
	for _, agg := range []bool{false, true} {
		res, err := Run(sc, Options{Policy: PolicyBalancer, Aggregate: agg, SummaryOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if cp := res.Summary.ControlPlane; cp == nil || cp.AnswersLost < 1 {
			t.Fatalf("aggregated %v: control plane %+v, want a report taken whose answer the cut dropped", agg, cp)
		}
	}
}

// The failing direction is honest: traffic spread over regions is over-admitted when every
// region enforces the whole limit, and traffic in one region is held far under its limit
// by a static split.
func TestPolicyContrasts(t *testing.T) {
	t.Parallel()
	res := run(t, load(t, "three-way-split.yaml"), PolicyFull)
	if res.Summary.Pass || !res.Verdicts[0].WindowFailed {
		t.Fatalf("three-way-split under -policy full: want a max_window_ratio failure, got %+v", res.Summary)
	}
	t.Logf("full: %s", res.Summary.Failures[0])
	if !strings.Contains(res.Summary.Failures[0], "max_window_ratio") || !strings.Contains(res.Summary.Failures[0], "key globex") {
		t.Fatalf("unclear reason: %q", res.Summary.Failures[0])
	}

	res = run(t, load(t, "shift-eu-to-us.yaml"), PolicyStatic)
	if res.Summary.Pass || !res.Verdicts[0].SteadyFailed || res.Verdicts[0].WindowFailed {
		t.Fatalf("shift-eu-to-us under -policy static: want a steady_ratio failure only, got %+v", res.Summary)
	}
	var steady string
	for _, f := range res.Summary.Failures {
		if strings.Contains(f, "steady_ratio") {
			steady = f
		}
	}
	t.Logf("static: %s", steady)
	if !strings.Contains(steady, "key acme: steady_ratio 0.") {
		t.Fatalf("unclear reason: %q", steady)
	}
}

// A region every enforcer lists but none of whose enforcers ever reports keeps its
// default share, however long: the README's "a key sending 19.9/s under a 20/s limit from
// two of three listed regions is held to about two thirds of it" (issue 28). ap-south is
// cut off from the control plane from the first second to the last (the balancer never
// hears it, as if it had no enforcer), past shares.stale_after, and its share stays 1/3.
func TestListedSilentRegionKeepsItsShare(t *testing.T) {
	t.Parallel()
	sc, err := scenario.Parse([]byte(`
name: listed-silent-region
duration: 400s
seed: 5
regions:
  us-east:  {enforcers: 1}
  eu-west:  {enforcers: 1}
  ap-south: {enforcers: 1}
keys:
  - name: k
    limit: {rate: 20, per: 1s, burst: 20}
    phases:
      - {at: 0s, offered: {us-east: 9.95, eu-west: 9.95}}
faults:
  - {at: 0s, for: 400s, kind: region-isolated, region: ap-south}
`), "listed-silent-region")
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, sc, PolicyBalancer)
	var offered, admitted int64
	for s := range res.Seconds {
		if sh := res.Cell(0, s, 2).Share; math.Abs(sh-1.0/3) > 1e-9 {
			t.Fatalf("second %d: ap-south's share %g, want its default 1/3 while it never reports", s, sh)
		}
		if sum := res.Cell(0, s, 0).Share + res.Cell(0, s, 1).Share; sum > 2.0/3+1e-9 {
			t.Fatalf("second %d: us-east and eu-west hold %g, more than the 2/3 ap-south does not", s, sum)
		}
		for r := range 2 {
			offered += res.Cell(0, s, r).Offered
			admitted += res.Cell(0, s, r).Admitted
		}
	}
	limit := 20 * float64(res.Seconds)
	t.Logf("offered %.2f/s, admitted %.2f/s: %.3f of the 20/s limit", float64(offered)/float64(res.Seconds),
		float64(admitted)/float64(res.Seconds), float64(admitted)/limit)
	if got := float64(admitted) / limit; got < 0.6 || got > 0.7 {
		t.Errorf("admitted %.3f of the limit, the README says about two thirds", got)
	}
}

// Small bursts split between regions keep their fractions (rules.FractionBelow): the
// 10,000-key population's keys k05000–k05999 of a burst of at most 6 offered from two
// regions (164 keys, long-tail.yaml's own lines and arrivals) come within 0.04 of what
// their bucket split in proportion to their traffic admits (steady_split), but for at most
// two. Held to whole requests, 7 were further short (up to 0.069), 1 is now (0.043).
func TestSmallBurstsKeepTheirFractions(t *testing.T) {
	t.Parallel()
	sc := load(t, "long-tail.yaml")
	sc.Keys = slices.DeleteFunc(sc.Keys, func(k scenario.Key) bool {
		return k.Name < "k05000" || k.Name >= "k06000" || k.Limit.Burst > 6 || len(k.Phases) != 1 || k.Phases[0].Regions() != 2
	})
	res := run(t, sc, PolicyBalancer)
	var short []string
	for _, k := range res.Verdicts {
		if gap := k.SteadySplit - k.SteadyRatio; gap > 0.04 {
			short = append(short, fmt.Sprintf("%s %.3f of %.3f", k.Key, k.SteadyRatio, k.SteadySplit))
		}
		if k.MaxWindowRatio > 1.01 {
			t.Errorf("%s: max_window_ratio %.3f", k.Key, k.MaxWindowRatio)
		}
	}
	t.Logf("%d keys; more than 0.04 short of their split reference: %v", len(res.Verdicts), short)
	if len(res.Verdicts) != 164 || len(short) > 2 {
		t.Errorf("%d keys, %d more than 0.04 short of their split reference, want 164 and at most 2: %v", len(res.Verdicts), len(short), short)
	}
}

// The same seed gives byte-identical summaries and CSVs (with a fault, and the balancer's
// reports, recomputes and publications on the virtual clock); another seed does not.
func TestDeterminism(t *testing.T) {
	t.Parallel()
	sc := load(t, "redis-outage.yaml")
	var js, csv [2]bytes.Buffer
	for i := range 2 {
		res := run(t, sc, PolicyBalancer)
		if err := res.WriteJSON(&js[i]); err != nil {
			t.Fatal(err)
		}
		if err := res.WriteCSV(&csv[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(js[0].Bytes(), js[1].Bytes()) {
		t.Fatalf("summaries differ:\n%s\n%s", js[0].String(), js[1].String())
	}
	if !bytes.Equal(csv[0].Bytes(), csv[1].Bytes()) {
		t.Fatal("CSVs differ")
	}
	sc.Seed++
	var other bytes.Buffer
	if err := run(t, sc, PolicyBalancer).WriteCSV(&other); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(other.Bytes(), csv[0].Bytes()) {
		t.Fatal("another seed gave the same CSV")
	}
}

// many-keys, the shipped seed: at most two of its 24 moves take more than 3 s (issue 21
// §2 asks for 3: 23 do; four did when an enforcer's early report waited 2 s after its last
// report and 10 refused tokens) and none more than 8 s — a move's last few percent wait on
// a second's Poisson reading of the region the traffic left (a 15/s region read at 20/s
// holds a 50/s key at 94% until the interval's recompute) — and, once steady, the
// balancer publishes at most one version an interval (§3). One seed is one sample: the
// count over 3 s moves by one or two from seed to seed (from 0 to 5 of 24 over seeds
// 1–20), so the distribution is BenchmarkManyKeysSeeds's, and BENCHMARKS.md's.
func TestManyKeysMovesFastAndQuiet(t *testing.T) {
	t.Parallel()
	sc := load(t, "many-keys.yaml")
	if testing.Short() {
		t.Skip("many-keys is long: it runs without -short")
	}
	res := run(t, sc, PolicyBalancer) // 20 s under -race: make test runs it
	if !res.Summary.Pass {
		t.Errorf("many-keys failed under the balancer:\n%s", strings.Join(res.Summary.Failures, "\n"))
	}
	moves, over3 := 0, 0
	for _, v := range res.Verdicts {
		for i, r := range v.RecoveryS {
			if i == 0 {
				continue // a key's first phase starts from nothing: not a move
			}
			moves++
			if r > 3 {
				over3++
			}
			if r > 8 {
				t.Errorf("key %s: move %d recovered in %v s, want ≤ 8", v.Key, i, r)
			}
		}
	}
	t.Logf("%d moves, %d over 3 s; %.2f versions per steady interval", moves, over3, res.Summary.ControlPlane.SteadyVersionsPerInterval)
	if over3 > 2 {
		t.Errorf("%d of %d moves took more than 3 s, want at most 2", over3, moves)
	}
	if v := res.Summary.ControlPlane.SteadyVersionsPerInterval; v > 1 {
		t.Errorf("%.2f versions per steady interval, want ≤ 1", v)
	}
}

// The balancer's core is ticked as balancer.Service ticks it: at once when an early or
// acknowledging report is in (a move's continuation goes out on its acknowledgements,
// not on a timer's grid), else TickEvery after the last tick. A simulator that ticked on
// a 250 ms grid answered every round of a move up to 250 ms late and published what the
// service would not: its figures were not the shipped balancer's.
func TestBalancerTickedAsTheServiceTicksIt(t *testing.T) {
	bp, w := balancerWorld(t, load(t, "shift-eu-to-us.yaml"))
	w.run()
	w.close()
	if len(bp.versionsAt) < 2 {
		t.Fatalf("%d versions: the shift moved nothing", len(bp.versionsAt))
	}
	offGrid, quick := 0, 0
	for i, at := range bp.versionsAt {
		if at%(250*time.Millisecond) != 0 {
			offGrid++ // a kick's tick: ReportDelay after a report's send, not a timer's
		}
		if i > 0 && at-bp.versionsAt[i-1] < TickEvery {
			quick++ // a continuation on its acknowledgements
		}
	}
	t.Logf("versions at %v: %d off a timer's grid, %d within TickEvery of the one before", bp.versionsAt, offGrid, quick)
	if offGrid == 0 || quick == 0 {
		t.Errorf("every version on a 250 ms grid (%d off it) or none within %v of the last (%d): the core is not ticked on the reports that ask for it", offGrid, TickEvery, quick)
	}
}

// balancerWorld builds sc's world under the balancer's control plane (summaries only).
func balancerWorld(t *testing.T, sc *scenario.Scenario) (*balancerPlane, *world) {
	t.Helper()
	bp, err := newBalancerPlane(sc, false)
	if err != nil {
		t.Fatal(err)
	}
	w, err := newWorld(sc, bp, true)
	if err != nil {
		t.Fatal(err)
	}
	return bp, w
}

// The regions' lanes (world.run): one region a goroutine, or, for an odd number of
// regions over two cores, one region's slice halved between two lanes, and the
// coordinator on a goroutine of its own; every layout is the same run,
// byte for byte (three regions, with faults and the balancer, directly and through
// aggregators: one goroutine a region against the halved layout on two cores).
func TestLanesGiveTheSameRun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		regions, workers int
		want             string
	}{
		{3, 2, "[[{2 1} {0 0}] [{1 0} {2 2}] [{-1 0}]]"},
		{5, 2, "[[{4 1} {0 0} {1 0}] [{2 0} {3 0} {4 2}] [{-1 0}]]"},
		{2, 2, "[[{0 0}] [{1 0}] [{-1 0}]]"},
		{4, 2, "[[{0 0}] [{1 0}] [{2 0}] [{3 0}] [{-1 0}]]"},
		{3, 1, "[[{0 0}] [{1 0}] [{2 0}] [{-1 0}]]"},
		{3, 4, "[[{0 0}] [{1 0}] [{2 0}] [{-1 0}]]"},
	} {
		if got := fmt.Sprint(lanes(c.regions, c.workers)); got != c.want {
			t.Errorf("lanes(%d regions, %d workers) = %s, want %s", c.regions, c.workers, got, c.want)
		}
	}
	sc := load(t, "region-restart.yaml")
	if len(sc.Regions) != 3 {
		t.Fatalf("%s has %d regions, want 3 (the halved layout)", sc.Name, len(sc.Regions))
	}
	for _, aggregate := range []bool{false, true} {
		var csv [2]bytes.Buffer
		for i, workers := range []int{2, 3} {
			res, err := Run(sc, Options{Policy: PolicyBalancer, workers: workers, Aggregate: aggregate})
			if err != nil {
				t.Fatal(err)
			}
			if err := res.WriteCSV(&csv[i]); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(csv[0].Bytes(), csv[1].Bytes()) {
			t.Fatalf("aggregate %v: the halved layout's run differs from one goroutine a region's", aggregate)
		}
	}
}
