package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/sim"
	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// generate runs `regionsim population` with args and loads what it wrote.
func generate(t *testing.T, args ...string) (*scenario.Scenario, []byte) {
	t.Helper()
	var out, errb bytes.Buffer
	if rc := run(append([]string{"population"}, args...), &out, &errb); rc != 0 {
		t.Fatalf("population %v: rc %d: %s", args, rc, errb.String())
	}
	p := filepath.Join(t.TempDir(), "pop.yaml")
	if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sc, err := scenario.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return sc, out.Bytes()
}

// The shipped long-tail.yaml is the generator's output with its defaults, and -burst
// advised changes nothing but the bursts of the keys whose burst, cut in proportion to
// their traffic, refuses a region more than balancer.BurstShortAbove over one bucket of
// the limit: each such burst is the one balancer.BurstCost advises, and at it nothing more
// is advised.
func TestPopulationBurstAdvised(t *testing.T) {
	def, text := generate(t)
	shipped, err := os.ReadFile("../../configs/scenarios/long-tail.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(text, shipped) {
		t.Fatal("regionsim population no longer writes configs/scenarios/long-tail.yaml: regenerate it, or keep the defaults' bytes")
	}
	adv, text := generate(t, "-burst", "advised")
	if !strings.Contains(string(text), "-burst advised\n") || len(adv.Keys) != len(def.Keys) {
		t.Fatalf("the advised population's header or keys (%d) differ from the default's (%d)", len(adv.Keys), len(def.Keys))
	}
	raised := 0
	for i, k := range adv.Keys {
		d := def.Keys[i]
		if k.Name != d.Name || k.Limit.Rate != d.Limit.Rate || len(k.Phases) != len(d.Phases) || !slices.Equal(k.Phases[0].Offered, d.Phases[0].Offered) {
			t.Fatalf("%s: more than its burst changed", k.Name)
		}
		if k.Limit.Burst == d.Limit.Burst {
			continue
		}
		raised++
		if i < 20 || k.Phases[0].Regions() < 2 || k.Limit.Burst < d.Limit.Burst {
			t.Fatalf("%s (%d regions): burst %g → %g: only keys of several regions are raised", k.Name, k.Phases[0].Regions(), d.Limit.Burst, k.Limit.Burst)
		}
		total := 0.0
		for _, o := range k.Phases[0].Offered {
			total += o
		}
		shares := make([]float64, len(k.Phases[0].Offered))
		for r, o := range k.Phases[0].Offered {
			shares[r] = o / total
		}
		limit := func(burst float64) []bucket.Limit {
			return []bucket.Limit{{Name: "limit", Rate: k.Limit.Rate, Burst: burst}}
		}
		_, before := balancer.BurstCost(limit(d.Limit.Burst), 1, shares, k.Phases[0].Offered)
		_, after := balancer.BurstCost(limit(k.Limit.Burst), 1, shares, k.Phases[0].Offered)
		if before == nil || before.Burst != k.Limit.Burst || after != nil {
			t.Fatalf("%s: burst %g, advised %+v at the rate's burst and %+v at its own", k.Name, k.Limit.Burst, before, after)
		}
	}
	t.Logf("%d of %d keys raised", raised, len(adv.Keys))
	if raised != 2888 {
		t.Errorf("%d keys raised, want 2,888 (BENCHMARKS.md)", raised)
	}
	var out, errb bytes.Buffer
	if rc := run([]string{"population", "-burst", "twice"}, &out, &errb); rc != 2 || !strings.Contains(errb.String(), `-burst "twice": want rate or advised`) {
		t.Errorf("-burst twice: rc %d, %q", rc, errb.String())
	}
}

// The advised bursts serve the keys the split of a burst refuses: long-tail's keys
// k03000–k03999 used from two or three regions, run with the balancer for ten minutes
// with their bursts as written and as advised. As written most fail steady_ratio; as
// advised at most a few (the balancer's noise on a key of a few requests a second), and
// none goes over.
func TestAdvisedBurstsServeTheTail(t *testing.T) {
	if testing.Short() {
		t.Skip("two runs of 412 keys for ten minutes")
	}
	t.Parallel()
	pick := func(sc *scenario.Scenario) *scenario.Scenario {
		sc.Keys = slices.DeleteFunc(sc.Keys, func(k scenario.Key) bool {
			return k.Name < "k03000" || k.Name >= "k04000" || len(k.Phases) != 1 || k.Phases[0].Regions() < 2
		})
		return sc
	}
	def, _ := generate(t)
	adv, _ := generate(t, "-burst", "advised")
	failing := func(sc *scenario.Scenario) (steady, over int) {
		res, err := sim.Run(pick(sc), sim.Options{SummaryOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range res.Verdicts {
			if v.SteadyRatio < 0.97 {
				steady++
			}
			if v.MaxWindowRatio > 1.01 {
				over++
			}
		}
		return steady, over
	}
	s0, o0 := failing(def)
	s1, o1 := failing(adv)
	t.Logf("412 keys: failing steady_ratio %d with their bursts as written, %d as advised; over %d, %d", s0, s1, o0, o1)
	if o0+o1 > 0 || s0 < 150 || s1 > 8 {
		t.Errorf("failing steady_ratio %d as written (want 150 or more), %d as advised (want at most 8); over %d and %d (want none)", s0, s1, o0, o1)
	}
}

// -arrive spreads the middle and tail keys' first phases over its first seconds and
// changes nothing else: the busy keys, every key's limit and traffic are the default's.
func TestPopulationArrive(t *testing.T) {
	def, _ := generate(t, "-keys", "2000", "-busy", "4", "-middle", "200")
	arr, text := generate(t, "-keys", "2000", "-busy", "4", "-middle", "200", "-arrive", "60s")
	if !strings.Contains(string(text), " -arrive 1m0s\n") {
		t.Fatal("the header does not name -arrive")
	}
	late := 0
	for i, k := range arr.Keys {
		d := def.Keys[i]
		if k.Name != d.Name || k.Limit != d.Limit || len(k.Phases) != len(d.Phases) || !slices.Equal(k.Phases[0].Offered, d.Phases[0].Offered) {
			t.Fatalf("%s: more than its arrival changed", k.Name)
		}
		at := k.Phases[0].At
		switch {
		case i < 4 && at != 0:
			t.Fatalf("busy key %s arrives at %v, want 0 s", k.Name, at)
		case at < 0 || at >= time.Minute || at%time.Second != 0:
			t.Fatalf("%s arrives at %v, want a whole second of the first minute", k.Name, at)
		case at > 0:
			late++
		}
	}
	if late < 1900 {
		t.Fatalf("%d of 1,996 keys arrive after 0 s, want nearly all", late)
	}
	var errb bytes.Buffer
	if rc := run([]string{"population", "-arrive", "10m"}, &bytes.Buffer{}, &errb); rc != 2 || !strings.Contains(errb.String(), "-arrive 10m0s") {
		t.Fatalf("-arrive as long as the run: rc %d, %q", rc, errb.String())
	}
}
