package sim

import (
	"math"
	"strings"
	"testing"
)

func flat(n int, v float64) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = v
	}
	return s
}

var defaults = Expect{1.01, 0.97, 15}

func TestJudgeExactLimitPasses(t *testing.T) {
	k := &KeySeries{Key: "k", Rate: 100, Burst: 100, Offered: flat(120, 150), Admitted: flat(120, 100), Phases: []int{0}}
	v := Judge(k, nil, defaults)
	if len(v.Failures) != 0 {
		t.Fatalf("failures %v", v.Failures)
	}
	// 10 s × 100/s = 1000 admitted against 100 × 10 + 100 allowed.
	if want := 1000.0 / 1100; math.Abs(v.MaxWindowRatio-want) > 1e-12 {
		t.Fatalf("max_window_ratio %g, want %g", v.MaxWindowRatio, want)
	}
	if v.SteadyRatio != 1 || v.SteadySeconds != 90 {
		t.Fatalf("steady %g over %d s", v.SteadyRatio, v.SteadySeconds)
	}
	if len(v.RecoveryS) != 1 || v.RecoveryS[0] != 0 {
		t.Fatalf("recovery %v", v.RecoveryS)
	}
	if v.Offered != 18000 || v.Admitted != 12000 {
		t.Fatalf("totals %d %d", v.Offered, v.Admitted)
	}
}

func TestJudgeCatchesOverAdmission(t *testing.T) {
	// Limit 100/s burst 100; two regions each admitting their whole limit from 50 s to 60 s:
	// the window 50–60 admits 2000 against 1100 allowed.
	adm := flat(120, 100)
	for s := 50; s < 60; s++ {
		adm[s] = 200
	}
	k := &KeySeries{Key: "acme", Rate: 100, Burst: 100, Offered: flat(120, 300), Admitted: adm, Phases: []int{0}}
	v := Judge(k, nil, defaults)
	if want := 2000.0 / 1100; math.Abs(v.MaxWindowRatio-want) > 1e-12 || v.MaxWindowAt != 50 {
		t.Fatalf("max_window_ratio %g at %d, want %g at 50", v.MaxWindowRatio, v.MaxWindowAt, want)
	}
	if len(v.Failures) != 1 || !strings.Contains(v.Failures[0], "max_window_ratio 1.8182 above 1.01") ||
		!strings.Contains(v.Failures[0], "50s–60s") || !strings.Contains(v.Failures[0], "key acme") {
		t.Fatalf("failures %q", v.Failures)
	}
	// One second over by one token per second for ten seconds is still caught at 1.01.
	adm = flat(120, 100)
	for s := 70; s < 80; s++ {
		adm[s] = 112
	}
	k.Admitted = adm
	if v := Judge(k, nil, defaults); v.MaxWindowRatio <= 1.01 || len(v.Failures) != 1 {
		t.Fatalf("1120/1100 not caught: %g %v", v.MaxWindowRatio, v.Failures)
	}
}

func TestJudgeSlowRecoveryMeasuredToTheSecond(t *testing.T) {
	// Phase 1 starts at 60 s; the key is held at 50/s of its 100/s until 83 s, then full.
	// The window 82–87 admits 50 + 4 × 100 = 450 < 0.95 × 500 = 475; the window 83–88
	// admits 500: recovery is 83 - 60 = 23 s.
	adm := flat(180, 100)
	for s := 60; s < 83; s++ {
		adm[s] = 50
	}
	k := &KeySeries{Key: "k", Rate: 100, Burst: 100, Offered: flat(180, 200), Admitted: adm, Phases: []int{0, 60}}
	v := Judge(k, nil, defaults)
	if len(v.RecoveryS) != 2 || v.RecoveryS[0] != 0 || v.RecoveryS[1] != 23 {
		t.Fatalf("recovery %v, want [0 23]", v.RecoveryS)
	}
	if len(v.Failures) != 1 || !strings.Contains(v.Failures[0], "phase 1 (from 60s) recovered after 23s, more than 15s by 8s") {
		t.Fatalf("failures %q", v.Failures)
	}
	// 95% is the threshold: a window at 475 of 500 recovers.
	adm = flat(180, 100)
	for s := 60; s < 70; s++ {
		adm[s] = 50
	}
	adm[70] = 75
	k.Admitted = adm
	if v := Judge(k, nil, defaults); v.RecoveryS[1] != 10 {
		t.Fatalf("recovery %v, want 10 (window 70–75 admits 475 of 500)", v.RecoveryS)
	}
}

func TestJudgeNeverRecovers(t *testing.T) {
	adm := flat(100, 100)
	for s := 40; s < 100; s++ {
		adm[s] = 10
	}
	k := &KeySeries{Key: "k", Rate: 100, Burst: 100, Offered: flat(100, 100), Admitted: adm, Phases: []int{0, 40}}
	v := Judge(k, nil, defaults)
	if v.RecoveryS[1] != 60 {
		t.Fatalf("recovery %v, want the remaining 60 s", v.RecoveryS)
	}
	found := false
	for _, f := range v.Failures {
		found = found || strings.Contains(f, "phase 1 (from 40s) never recovered")
	}
	if !found {
		t.Fatalf("failures %q", v.Failures)
	}
}

func TestJudgeSteadyRatio(t *testing.T) {
	// Offered 100 at a limit of 1000: min(offered, rate) = 100; admitted 90 → 0.9.
	k := &KeySeries{Key: "k", Rate: 1000, Burst: 1000, Offered: flat(100, 100), Admitted: flat(100, 90), Phases: []int{0}}
	v := Judge(k, nil, defaults)
	if math.Abs(v.SteadyRatio-0.9) > 1e-12 || v.SteadySeconds != 70 {
		t.Fatalf("steady %g over %d", v.SteadyRatio, v.SteadySeconds)
	}
	if !strings.Contains(strings.Join(v.Failures, "\n"), "steady_ratio 0.9000 below 0.97") {
		t.Fatalf("failures %q", v.Failures)
	}
	// Seconds within 30 s of a fault's start or end are not steady; a fault over the whole
	// unsteady stretch excludes recovery windows too.
	adm := flat(100, 90)
	k.Admitted = adm
	v = Judge(k, []Span{{40, 50}}, defaults)
	// steady: 30–40 and 80–100 = 30 s
	if v.SteadySeconds != 30 {
		t.Fatalf("steady seconds %d, want 30", v.SteadySeconds)
	}
}

func TestJudgeFaultWindowsExcludedFromRecovery(t *testing.T) {
	// Phase 1 from 20 s is under-admitted until 40 s, but a fault covers 20–40: the first
	// eligible window starts at 40 and recovers there, 0 s after the fault ended (time
	// under the fault is the fault's).
	adm := flat(100, 100)
	for s := 20; s < 38; s++ {
		adm[s] = 0
	}
	k := &KeySeries{Key: "k", Rate: 100, Burst: 100, Offered: flat(100, 100), Admitted: adm, Phases: []int{0, 20}}
	v := Judge(k, []Span{{20, 40}}, Expect{1.01, 0, 30})
	if v.RecoveryS[1] != 0 || len(v.Failures) != 0 {
		t.Fatalf("recovery %v failures %q", v.RecoveryS, v.Failures)
	}
	// Still under for 7 s after the fault: recovery counts those 7 s, from its end.
	for s := 38; s < 47; s++ {
		adm[s] = 0
	}
	v = Judge(k, []Span{{20, 40}}, Expect{1.01, 0, 30})
	if v.RecoveryS[1] != 7 || len(v.Failures) != 0 {
		t.Fatalf("under until 47 s: recovery %v failures %q, want 7", v.RecoveryS, v.Failures)
	}
	for s := 38; s < 47; s++ {
		adm[s] = 100
	}
	// A phase wholly inside a fault is not judged.
	v = Judge(k, []Span{{15, 100}}, Expect{1.01, 0, 30})
	if v.RecoveryS[1] != 80 || len(v.Failures) != 0 {
		t.Fatalf("recovery %v failures %q", v.RecoveryS, v.Failures)
	}
}

func TestJudgeShortRun(t *testing.T) {
	k := &KeySeries{Key: "k", Rate: 10, Burst: 20, Offered: flat(3, 30), Admitted: []float64{20, 10, 10}, Phases: []int{0}}
	v := Judge(k, nil, defaults)
	if want := 40.0 / 50; v.MaxWindowRatio != want {
		t.Fatalf("ratio %g want %g", v.MaxWindowRatio, want)
	}
	if v.SteadyRatio != 1 || v.RecoveryS[0] != 0 {
		t.Fatalf("%+v", v)
	}
}

// A per-minute key that keeps 1.5× its rate up: its burst (a minute's worth) hides that
// from 10 s windows (1,500 / (1,000 + 6,000) = 0.21) and 60 s ones (9,000 / 12,000 =
// 0.75); only 300 s windows see it (45,000 / 36,000 = 1.25), and they fail the key.
func TestJudgeLongWindows(t *testing.T) {
	k := &KeySeries{Key: "umbrella", Rate: 100, Burst: 6000, Offered: flat(400, 150), Admitted: flat(400, 150), Phases: []int{0}}
	v := Judge(k, nil, defaults)
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"10s", v.MaxWindowRatio, 1500.0 / 7000}, {"60s", v.MaxWindowRatio60s, 9000.0 / 12000}, {"300s", v.MaxWindowRatio300s, 45000.0 / 36000}} {
		if math.Abs(c.got-c.want) > 1e-12 {
			t.Errorf("%s windows: ratio %g, want %g", c.name, c.got, c.want)
		}
	}
	if !v.WindowFailed || len(v.Failures) != 1 || !strings.Contains(v.Failures[0], "max_window_ratio_300s 1.2500 above 1.01") ||
		!strings.Contains(v.Failures[0], "0s–300s") {
		t.Fatalf("failures %q", v.Failures)
	}
	// Held to its rate, it passes at every length.
	k.Admitted = flat(400, 100)
	if v := Judge(k, nil, defaults); v.WindowFailed || v.MaxWindowRatio300s > 1 {
		t.Fatalf("held to the rate: %+v", v)
	}
	// One failure line per key, naming every window length that failed.
	k = &KeySeries{Key: "k", Rate: 1.0 / 60, Burst: 1, Offered: flat(600, 1), Admitted: make([]float64, 600), Phases: []int{0}}
	for s := 0; s < 600; s += 60 {
		k.Admitted[s] = 3 // three regions, one token each, every minute
	}
	v = Judge(k, nil, defaults)
	if len(v.Failures) != 1 || !strings.Contains(v.Failures[0], "max_window_ratio 2.5714") ||
		!strings.Contains(v.Failures[0], "also max_window_ratio_60s 1.5000 in 0s–60s, max_window_ratio_300s") {
		t.Fatalf("failures %q", v.Failures)
	}
	// A run shorter than a window is judged on one window of its length, as for 10 s.
	k = &KeySeries{Key: "k", Rate: 10, Burst: 20, Offered: flat(30, 30), Admitted: flat(30, 10), Phases: []int{0}}
	if v := Judge(k, nil, defaults); v.MaxWindowRatio60s != 300.0/320 || v.MaxWindowRatio300s != 300.0/320 {
		t.Fatalf("short run: %g %g", v.MaxWindowRatio60s, v.MaxWindowRatio300s)
	}
}

// Windows that overlap a fault never count as a recovery, even when the fault lets the
// key through (here at its full rate during a 10 s fault, as local limits may): phase 1
// from 20 s recovers at 60 s, not at the fault's 30 s — 20 s after the fault ended at 40 s,
// which is where its recovery is counted from.
func TestJudgeRecoveryNotCountedThroughAFault(t *testing.T) {
	adm := flat(120, 100)
	for s := 20; s < 60; s++ {
		if s < 30 || s >= 40 {
			adm[s] = 10
		}
	}
	k := &KeySeries{Key: "k", Rate: 100, Burst: 100, Offered: flat(120, 100), Admitted: adm, Phases: []int{0, 20}}
	v := Judge(k, []Span{{30, 40}}, Expect{1.01, 0, 60})
	if v.RecoveryS[1] != 20 {
		t.Fatalf("recovery %v, want phase 1 20 s after the fault ended", v.RecoveryS)
	}
}

// The split reference: a key's burst of 4 cut three ways holds 1⅓ a region; two arrivals
// a region 0.25 s apart take the first and refuse the second until a token refills
// (0.75 s at 4/3 a second), where the whole bucket would have taken both.
func TestSplitBucketSteps(t *testing.T) {
	b := stream{phases: []phaseRow{{splitRate: 4.0 / 3, splitBurst: 4.0 / 3}}, split: splitBucket{tokens: 4.0 / 3}}
	for _, st := range []struct {
		t    float64
		want bool
	}{{10, true}, {10.25, false}, {10.5, true}, {10.6, false}, {11.5, true}} {
		b.t = st.t
		if got := b.take(0); got != st.want {
			t.Fatalf("at %gs: take %v, want %v (tokens %g)", st.t, got, st.want, b.split.tokens)
		}
	}
	none := stream{phases: []phaseRow{{}}}
	none.t = 1
	if none.take(0) {
		t.Fatal("a region offered nothing holds no token of the split")
	}
	none.t = 2
	if none.take(-1) {
		t.Fatal("before the first phase no token of the split is held")
	}
}

func TestSteadySplitOverTheSteadySeconds(t *testing.T) {
	n := 100
	k := &KeySeries{Key: "k", Rate: 10, Burst: 10, Offered: make([]float64, n), Admitted: make([]float64, n), Split: make([]float64, n)}
	for s := range n {
		k.Offered[s], k.Admitted[s], k.Split[s] = 5, 5, 4
	}
	v := Judge(k, nil, Expect{SteadyRatio: 0.97})
	if v.SteadyRatio != 1 || v.SteadySplit != 0.8 {
		t.Fatalf("steady_ratio %g steady_split %g, want 1 and 0.8", v.SteadyRatio, v.SteadySplit)
	}
	k.Split = nil // live mode: not measured
	if v := Judge(k, nil, Expect{SteadyRatio: 0.97}); v.SteadySplit != 1 {
		t.Fatalf("no split series: steady_split %g, want 1", v.SteadySplit)
	}
}
