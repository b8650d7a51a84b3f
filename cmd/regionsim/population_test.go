package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/sim"
	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// The population is a valid scenario, the same bytes for the same flags, and its run's
// table sums a population up (distributions, the worst keys) instead of listing every key.
func TestPopulation(t *testing.T) {
	args := []string{"population", "-keys", "120", "-busy", "3", "-middle", "20", "-duration", "6m"}
	var a, b, errb bytes.Buffer
	if rc := run(args, &a, &errb); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errb.String())
	}
	if rc := run(args, &b, &errb); rc != 0 || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("two runs with the same flags differ (rc %d)", rc)
	}
	p := filepath.Join(t.TempDir(), "pop.yaml")
	if err := os.WriteFile(p, a.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sc, err := scenario.Load(p)
	if err != nil {
		t.Fatalf("the population does not load: %v", err)
	}
	if len(sc.Keys) != 120 || len(sc.Regions) != 3 || len(sc.Keys[0].Phases) < 2 {
		t.Fatalf("%d keys, %d regions, the first key's phases %d: want 120, 3 and a busy key that moves", len(sc.Keys), len(sc.Regions), len(sc.Keys[0].Phases))
	}
	var out bytes.Buffer
	dir := t.TempDir()
	run([]string{"run", "-scenario", p, "-out", dir}, &out, &errb)
	for _, want := range []string{"over 120 keys", "steady_ratio (≥ 0.97)", "the 25 worst of 120 keys:", "plots of the 25 worst keys in " + dir} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("the table lacks %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "\n  k0"); n > 25+25 {
		t.Fatalf("the table lists %d key lines, want at most the 25 worst (and 25 failures)", n)
	}
	// -out draws the keys the table lists, not every key; the CSV has every key.
	plots, _ := filepath.Glob(filepath.Join(dir, "*-admitted.png"))
	if len(plots) != 25 {
		t.Fatalf("%d keys plotted, want the table's 25 worst", len(plots))
	}
	for _, f := range plots {
		k := strings.TrimSuffix(filepath.Base(f), "-admitted.png")
		if !strings.Contains(out.String(), "\n  "+k+" ") {
			t.Errorf("%s is plotted but not among the table's worst keys", k)
		}
	}
	csv, err := os.ReadFile(filepath.Join(dir, sc.Name+"-balancer.csv"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range sc.Keys {
		if !bytes.Contains(csv, []byte(","+k.Name+",")) {
			t.Fatalf("the CSV lacks %s", k.Name)
		}
	}
	for _, bad := range [][]string{
		{"population", "-keys", "0"},
		{"population", "-busy", "90", "-middle", "20", "-keys", "100"},
		{"population", "-regions", "us-east"},
		{"population", "-regions", "us-east=0,eu-west=2"},
	} {
		errb.Reset()
		if rc := run(bad, &out, &errb); rc != 2 || !strings.Contains(errb.String(), "regionsim population: -") {
			t.Errorf("%v: rc %d, stderr %q: want 2 and the flag named", bad, rc, errb.String())
		}
	}
}

// Through report aggregators the leader publishes about as often as directly (issue 26
// §3): a forward's merge of several reports is tested as several reports, not as one
// (balancer's mergeShifted). Tested as one, a population's small keys showed the merge's
// summed noise as arrivals: 1,000 keys for a minute published 9.5 versions an interval
// through aggregators against 4.2 directly, with 24 recomputes against 11 (now 4.0, 8).
// The run through aggregators also repeats exactly (a forward lists its entries in a
// fixed order).
func TestAggregatedPopulationPublishesAsDirectly(t *testing.T) {
	sc := populationScenario(t, 1000, 2, 100)
	cp := func(aggregate bool) (*sim.ControlPlane, []byte) {
		res, err := sim.Run(sc, sim.Options{Policy: sim.PolicyBalancer, SummaryOnly: true, Aggregate: aggregate})
		if err != nil {
			t.Fatal(err)
		}
		out, err := json.Marshal(res.Summary)
		if err != nil {
			t.Fatal(err)
		}
		return res.Summary.ControlPlane, out
	}
	direct, _ := cp(false)
	agg, first := cp(true)
	t.Logf("1,000 keys, 1 min: versions an interval %.2f directly, %.2f through aggregators; recomputes %d, %d; bytes an interval %.0f, %.0f",
		direct.VersionsPerInterval, agg.VersionsPerInterval, direct.Recomputes, agg.Recomputes, direct.BytesPerInterval, agg.BytesPerInterval)
	if agg.VersionsPerInterval > 1.25*direct.VersionsPerInterval+0.5 || float64(agg.Recomputes) > 1.5*float64(direct.Recomputes)+2 {
		t.Errorf("through aggregators %.2f versions an interval and %d recomputes, against %.2f and %d directly: want at most 1.25× (+0.5) and 1.5× (+2)",
			agg.VersionsPerInterval, agg.Recomputes, direct.VersionsPerInterval, direct.Recomputes)
	}
	if _, again := cp(true); !bytes.Equal(first, again) {
		t.Error("two runs of the same population through aggregators differ")
	}
}
