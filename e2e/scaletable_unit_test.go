package e2e

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The scale benchmark's knobs: the default steps parse, and a bad value is refused with a
// message naming the variable and what was wrong.
func TestScaleKnobs(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	k, err := scaleKnobsFrom(env())
	if err != nil {
		t.Fatal(err)
	}
	if len(k.seqs) != 3 || k.seqs[0].name != "enforcers" || k.seqs[0].steps[5] != (scaleStep{1000, 1000, 0}) ||
		k.seqs[2].steps[0] != (scaleStep{30, 1000, 10000}) || k.interval != 2*time.Second || len(k.apply) != 3 {
		t.Fatalf("defaults: %+v", k)
	}
	k, err = scaleKnobsFrom(env("ALLOT_SCALE_STEPS", "a=3x10 b=6x100/500", "ALLOT_SCALE_APPLY", "0", "ALLOT_SCALE_INTERVAL", "5s"))
	if err != nil || len(k.seqs) != 2 || k.seqs[1].steps[0] != (scaleStep{6, 100, 500}) || len(k.apply) != 0 || k.interval != 5*time.Second {
		t.Fatalf("set: %+v, %v", k, err)
	}
	for _, tc := range []struct{ kv []string }{
		{[]string{"ALLOT_SCALE_STEPS", "a=2x10"}},                   // fewer enforcers than regions
		{[]string{"ALLOT_SCALE_STEPS", "a=30x20000"}},               // past max_entries
		{[]string{"ALLOT_SCALE_STEPS", "a=3000x10000"}},             // past ALLOT_SCALE_MAX_PAIRS
		{[]string{"ALLOT_SCALE_STEPS", "a=30x1000/50"}},             // population under the hot keys
		{[]string{"ALLOT_SCALE_STEPS", "30x1000"}},                  // no name
		{[]string{"ALLOT_SCALE_INTERVAL", "1100ms"}},                // not whole slots
		{[]string{"ALLOT_SCALE_WARM", "0"}},                         //
		{[]string{"ALLOT_SCALE_RATE", "-1"}},                        //
		{[]string{"ALLOT_SCALE_APPLY", "10k"}},                      //
		{[]string{"ALLOT_SCALE_STEPS", "a=30x1000", "X", "unused"}}, // the control: valid
	} {
		_, err := scaleKnobsFrom(env(tc.kv...))
		valid := len(tc.kv) > 2
		if valid != (err == nil) {
			t.Errorf("%v: err = %v", tc.kv, err)
		}
		if err != nil && !strings.Contains(err.Error(), tc.kv[0]) {
			t.Errorf("%v: %v does not name %s", tc.kv, err, tc.kv[0])
		}
	}
}

// The mix: the hot keys' rates follow the Zipf law over the fleet's rate, the five
// busiest are over the limit, every enforcer reports ids identities, and a population
// wraps the tail keys.
func TestScaleMix(t *testing.T) {
	m := newScaleMix(scaleStep{enforcers: 30, ids: 1000}, 1000)
	sum := 0.0
	for _, r := range m.hotRate {
		sum += r
	}
	if len(m.hot) != 100 || math.Abs(sum-30_000) > 1e-6 || m.perEnf != 900 || len(m.tail) != 30*900 {
		t.Fatalf("mix: %d hot summing to %v/s, %d a enforcer, %d tail keys", len(m.hot), sum, m.perEnf, len(m.tail))
	}
	for k, r := range m.hotRate {
		if over := r > m.limit; over != (k < 5) {
			t.Errorf("hot key %d at %.1f/s, limit %.0f: over %v", k, r, m.limit, over)
		}
	}
	if m.tailTok[0] != 4 || m.tailTok[len(m.tail)-1] != 1 {
		t.Errorf("tail tokens %d … %d, want 4 … 1", m.tailTok[0], m.tailTok[len(m.tail)-1])
	}
	if p := newScaleMix(scaleStep{enforcers: 300, ids: 1000, population: 10_000}, 1000); len(p.tail) != 9_900 {
		t.Errorf("population 10,000: %d tail keys, want 9,900", len(p.tail))
	}
}

// The table and the fit: one column per step that ran, the skipped ones said, and the
// extrapolation recovers a leader whose CPU is a sum of a cost per identity-report and
// one per identity tracked.
func TestScaleTable(t *testing.T) {
	row := func(e, ids int, reps, tracked float64, p99 float64) *scaleRow {
		return &scaleRow{Sequence: "s", Enforcers: e, IdentitiesPerReport: ids, Reports: 100, P99ms: p99,
			IdentityReportsPerInterval: reps, Tracked: int(tracked), Recomputes: 5, RecomputeMeanMs: tracked / 1000,
			LeaderCPUPerInterval: (2*reps + 5*tracked) / 1e6, LeaderRSSMiB: 20 + tracked/1000}
	}
	r := &scaleReport{Rows: []*scaleRow{
		row(10, 1000, 10_000, 9_000, 50), row(30, 1000, 30_000, 27_000, 300), row(100, 1000, 100_000, 20_000, 2000),
		{Sequence: "s", Enforcers: 300, IdentitiesPerReport: 1000, Skipped: "sequence stopped at 100x1000"}}}
	r.Extrapolation = r.extrapolate()
	f := r.Extrapolation
	if math.Abs(f.CPUPerReportUs-2) > 1e-6 || math.Abs(f.CPUPerTrackedUs-5) > 1e-6 || math.Abs(f.RecomputeMsPer100k-100) > 1e-6 ||
		math.Abs(f.RSSMiBPer100k-100) > 1e-6 || math.Abs(f.RSSBaseMiB-20) > 1e-6 || f.HeldStep != "s 30×1000" {
		t.Fatalf("fit %+v", f)
	}
	out := r.table()
	for _, want := range []string{"| enforcers × identities per report | 10×1000 | 30×1000 | 100×1000 |",
		"| held (p99 ≤ 1 s, no attempt failed) | yes | yes | no: report p99 2000 ms > 1 s |",
		"not run: s 300×1000 (sequence stopped at 100x1000)",
		"largest fan-in one leader held (report p99 ≤ 1 s, no attempt failed): 30000 identity-reports per interval (s 30×1000)"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
}
