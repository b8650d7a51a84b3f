package report

import (
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/rules"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

var t0 = time.Unix(1_700_000_000, 0)

func rule(id string, rate float64) *rules.Compiled {
	return &rules.Compiled{ID: id, Limits: []bucket.Limit{{Name: "s", Rate: rate, Burst: rate}}}
}

func newTable(t testing.TB, mod func(*Config)) *Table {
	t.Helper()
	cfg := DefaultConfig()
	if mod != nil {
		mod(&cfg)
	}
	tb, err := NewTable(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func byKey(r *allotv1.ReportRequest) map[string]*allotv1.IdentityUsage {
	m := make(map[string]*allotv1.IdentityUsage, len(r.Usage))
	for _, u := range r.Usage {
		m[u.Rule+"|"+u.Identity] = u
	}
	return m
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"Stripes":          func(c *Config) { c.Stripes = 3 },
		"Capacity":         func(c *Config) { c.Capacity = 100 },
		"Interval":         func(c *Config) { c.Interval = 0 },
		"MaxIdentities":    func(c *Config) { c.MaxIdentities = 0 },
		"PressureFraction": func(c *Config) { c.PressureFraction = 0 },
		"EarlyGap":         func(c *Config) { c.EarlyGap = -time.Second },
		"EarlyMinRefused":  func(c *Config) { c.EarlyMinRefused = 0 },
		"EarlyFactor":      func(c *Config) { c.EarlyFactor = 0.5 },
	} {
		c := DefaultConfig()
		mod(&c)
		if _, err := NewTable(c, t0); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want one naming the field", name, err)
		}
	}
}

func TestExactBelowCapacity(t *testing.T) {
	tb := newTable(t, nil)
	a, b := rule("a", 1000), rule("b", 1000)
	tb.ObserveTake(a, "k1", 3, true, false, bucket.SourceRedis, t0)
	tb.ObserveTake(a, "k1", 2, false, false, bucket.SourceRefusalCache, t0)
	tb.ObserveTake(b, "k1", 7, true, false, bucket.SourceLease, t0)
	tb.ObserveTake(a, "k2", 1, true, false, bucket.SourceRedis, t0)
	tb.ObserveTake(a, "k3", 0, true, false, bucket.SourceRedis, t0) // counts nothing
	tb.ObserveTake(nil, "k3", 5, true, false, bucket.SourceRedis, t0)
	r := tb.Report(t0.Add(10 * time.Second))
	if r.IntervalStartMs != t0.UnixMilli() || r.IntervalEndMs != t0.Add(10*time.Second).UnixMilli() {
		t.Fatalf("interval [%d, %d)", r.IntervalStartMs, r.IntervalEndMs)
	}
	got := byKey(r)
	want := map[string][3]float64{"a|k1": {3, 2, 0}, "b|k1": {7, 0, 0}, "a|k2": {1, 0, 0}}
	if len(got) != len(want) {
		t.Fatalf("got %d identities, want %d: %v", len(got), len(want), r.Usage)
	}
	for k, w := range want {
		u := got[k]
		if u == nil || u.Admitted != w[0] || u.Refused != w[1] || u.Error != w[2] || u.RegionalRate != 1000 {
			t.Errorf("%s = %v, want admitted/refused/error %v rate 1000", k, u, w)
		}
	}
	if r.OmittedIdentities != 0 || r.OmittedTokens != 0 {
		t.Errorf("omitted %d/%v, want 0/0", r.OmittedIdentities, r.OmittedTokens)
	}
	// The interval was drained: the next one starts empty at the last report.
	r = tb.Report(t0.Add(15 * time.Second))
	if len(r.Usage) != 0 || r.IntervalStartMs != t0.Add(10*time.Second).UnixMilli() {
		t.Fatalf("second report %v", r)
	}
}

// A new compiled rule with the same id (a rules reload) counts into the same pair and
// the drain sees the latest rule.
func TestRuleReloadSamePair(t *testing.T) {
	var seen *rules.Compiled
	tb := newTable(t, func(c *Config) {
		c.RegionalRate = func(r *rules.Compiled, _ string, _ time.Time) float64 { seen = r; return r.Limits[0].Rate }
	})
	old, cur := rule("a", 10), rule("a", 20)
	tb.ObserveTake(old, "k", 1, true, false, 0, t0)
	tb.ObserveTake(cur, "k", 1, true, false, 0, t0)
	r := tb.Report(t0.Add(time.Second))
	if len(r.Usage) != 1 || r.Usage[0].Admitted != 2 || seen != cur || r.Usage[0].RegionalRate != 20 {
		t.Fatalf("report %v, hook saw %p want %p", r.Usage, seen, cur)
	}
}

// The hook runs at drain time only, once per pair.
func TestRegionalRateOnlyAtDrain(t *testing.T) {
	calls := 0
	tb := newTable(t, func(c *Config) {
		c.RegionalRate = func(*rules.Compiled, string, time.Time) float64 { calls++; return 5 }
	})
	a := rule("a", 1)
	for i := 0; i < 100; i++ {
		tb.ObserveTake(a, "k"+strconv.Itoa(i%3), 1, i%2 == 0, false, 0, t0)
	}
	if calls != 0 {
		t.Fatalf("hook called %d times on the check path", calls)
	}
	tb.Report(t0.Add(time.Second))
	if calls != 3 {
		t.Fatalf("hook called %d times at drain, want 3", calls)
	}
}

func TestPressureFirstThenVolume(t *testing.T) {
	// Interval 10 s; rate 10/s → allowance 100 tokens; pressure above 50 admitted.
	tb := newTable(t, func(c *Config) { c.MaxIdentities = 3 })
	r10 := rule("r", 10)
	big := rule("big", 1e6)
	tb.ObserveTake(big, "huge", 5000, true, false, 0, t0)  // busiest, not pressured
	tb.ObserveTake(big, "large", 4000, true, false, 0, t0) // second, not pressured
	tb.ObserveTake(r10, "refused", 1, false, false, 0, t0) // pressured: a refusal
	tb.ObserveTake(r10, "hot", 51, true, false, 0, t0)     // pressured: 51 > 0.5 × 10 × 10
	tb.ObserveTake(r10, "warm", 50, true, false, 0, t0)    // not: 50 is not above 50
	tb.ObserveTake(big, "small", 10, true, false, 0, t0)   // not
	r := tb.Report(t0.Add(10 * time.Second))
	var order []string
	for _, u := range r.Usage {
		order = append(order, u.Identity)
	}
	if fmt.Sprint(order) != "[hot refused huge]" {
		t.Fatalf("order %v, want [hot refused huge]", order)
	}
	if r.OmittedIdentities != 3 || r.OmittedTokens != 4000+50+10 {
		t.Fatalf("omitted %d identities %v tokens, want 3 and 4060", r.OmittedIdentities, r.OmittedTokens)
	}
}

// The pressure test uses the interval's real length: an early report after 2 s judges
// against 2 s of allowance.
func TestPressureScalesWithIntervalLength(t *testing.T) {
	tb := newTable(t, func(c *Config) { c.MaxIdentities = 1 })
	r10 := rule("r", 10)
	tb.ObserveTake(rule("big", 1e6), "busy", 1000, true, false, 0, t0)
	tb.ObserveTake(r10, "hot", 11, true, false, 0, t0) // > 0.5 × 10/s × 2 s
	r := tb.Report(t0.Add(2 * time.Second))
	if len(r.Usage) != 1 || r.Usage[0].Identity != "hot" {
		t.Fatalf("usage %v, want only hot", r.Usage)
	}
}

// Ties in volume are broken by rule then identity, so reports are deterministic.
func TestCapOrderingTies(t *testing.T) {
	tb := newTable(t, func(c *Config) { c.MaxIdentities = 4 })
	for _, id := range []string{"d", "b", "c", "a", "e"} {
		tb.ObserveTake(rule("x", 1e9), id, 7, true, false, 0, t0)
	}
	r := tb.Report(t0.Add(time.Second))
	var order []string
	for _, u := range r.Usage {
		order = append(order, u.Identity)
	}
	if fmt.Sprint(order) != "[a b c d]" || r.OmittedIdentities != 1 || r.OmittedTokens != 7 {
		t.Fatalf("order %v omitted %d/%v", order, r.OmittedIdentities, r.OmittedTokens)
	}
}

// One stripe of two pairs: a third pair evicts the minimum and inherits its count as error.
func TestEvictionInheritsMinimum(t *testing.T) {
	tb := newTable(t, func(c *Config) { c.Capacity, c.Stripes, c.MaxIdentities = 2, 1, 10 })
	a := rule("a", 1e9)
	tb.ObserveTake(a, "x", 5, true, false, 0, t0)
	tb.ObserveTake(a, "y", 3, false, false, 0, t0)
	tb.ObserveTake(a, "z", 4, true, false, 0, t0) // evicts y (count 3): z count 7, error 3
	tb.ObserveTake(a, "y", 1, true, false, 0, t0) // evicts x (count 5): y count 6, error 5
	r := tb.Report(t0.Add(time.Second))
	got := byKey(r)
	if z := got["a|z"]; z == nil || z.Admitted != 4 || z.Error != 3 {
		t.Fatalf("z = %v, want admitted 4 error 3", z)
	}
	if y := got["a|y"]; y == nil || y.Admitted != 1 || y.Refused != 0 || y.Error != 5 {
		t.Fatalf("y = %v, want admitted 1 error 5", y)
	}
	if r.OmittedIdentities != 2 || r.OmittedTokens != 5+3 {
		t.Fatalf("omitted %d/%v, want 2 evictions and 8 tokens", r.OmittedIdentities, r.OmittedTokens)
	}
}

// A stripe keeps its pairs unordered until it fills and builds its heap then: every
// eviction still takes a pair of the least count. Were it to take another, the newcomer
// would inherit more than some tracked pair's count (error ≤ c_min, the bound the package
// doc states), which is checked after every observation of a fixed pseudo-random stream
// of 64 identities into one stripe of 16.
func TestEvictionTakesTheMinimumOnceFull(t *testing.T) {
	tb := newTable(t, func(c *Config) { c.Capacity, c.Stripes = 16, 1 })
	a := rule("a", 1e9)
	x := uint64(1)
	next := func(n uint64) uint64 { x = x*6364136223846793005 + 1442695040888963407; return (x >> 33) % n }
	st := tb.stripes[0].cur
	for i := range 5000 {
		id := "k" + strconv.FormatUint(next(64), 10)
		tb.ObserveTake(a, id, int64(1+next(5)), true, false, 0, t0)
		minCount := int64(1 << 62)
		for _, e := range st.heap {
			minCount = min(minCount, e.count())
		}
		for j, e := range st.heap {
			if e.err > minCount {
				t.Fatalf("observation %d: %s inherited error %d over the least count %d", i, e.key.identity, e.err, minCount)
			}
			if e.heap != j || st.heaped && j > 0 && st.heap[(j-1)/2].count() > e.count() {
				t.Fatalf("observation %d: heap order broken at %d", i, j)
			}
		}
		if len(st.heap) < 16 && st.heaped {
			t.Fatalf("observation %d: heaped before the stripe filled", i)
		}
	}
	if !st.heaped {
		t.Fatal("never heaped: the stripe never filled")
	}
}

// A pair whose take left its region's bucket under half its burst (low) in the span its
// recent rate counts is reported draining (IdentityUsage.draining); one low earlier in
// the interval, or never, is not. A low take is not a jump: the report carries it.
func TestDrainingIsReported(t *testing.T) {
	tb := newTable(t, nil)
	a := rule("a", 100)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tb.ObserveTake(a, "now", 5, true, true, 0, at(9500*time.Millisecond))
	tb.ObserveTake(a, "before", 5, true, true, 0, at(8*time.Second))
	tb.ObserveTake(a, "before", 5, true, false, 0, at(9500*time.Millisecond))
	tb.ObserveTake(a, "never", 5, true, false, 0, at(9500*time.Millisecond))
	tb.ObserveTake(a, "refused", 5, false, false, 0, at(9500*time.Millisecond))
	if tb.Jumped() {
		t.Fatal("a low take jumped")
	}
	got := byKey(tb.Report(at(10 * time.Second)))
	for id, want := range map[string]bool{"now": true, "before": false, "never": false, "refused": false} {
		if d := got["a|"+id].GetDraining(); d != want {
			t.Errorf("%s: draining %v, want %v", id, d, want)
		}
	}
	// The next interval starts afresh.
	tb.ObserveTake(a, "now", 5, true, false, 0, at(10500*time.Millisecond))
	if got := byKey(tb.Report(at(11 * time.Second))); got["a|now"].GetDraining() {
		t.Error("draining carried into the next interval")
	}
}

func TestWantEarly(t *testing.T) {
	// EarlyGap 2 s (the default is 1 s): the scaling of a short interval's refusals below
	// is worked out for it.
	tb := newTable(t, func(c *Config) { c.EarlyMinRefused, c.EarlyFactor, c.EarlyGap = 100, 2, 2*time.Second })
	a := rule("a", 10)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if tb.WantEarly(at(5 * time.Second)) {
		t.Fatal("early with no refusals")
	}
	// A pair refused nothing last interval jumps past earlyJump (6) refused tokens, under
	// EarlyMinRefused: a small key's move is refused some 8 a second an enforcer.
	tb.ObserveTake(a, "k", earlyJump, false, false, 0, t0)
	if tb.WantEarly(at(5 * time.Second)) {
		t.Fatal("early at exactly earlyJump refused")
	}
	tb.ObserveTake(a, "k", 5, false, false, 0, t0) // 11 > 6: a jump
	select {
	case <-tb.Early():
	default:
		t.Fatal("Early channel not poked")
	}
	if tb.WantEarly(at(1999 * time.Millisecond)) {
		t.Fatal("early before EarlyGap")
	}
	if !tb.WantEarly(at(2 * time.Second)) {
		t.Fatal("no early report at EarlyGap after a jump")
	}
	// An early report after 2 s: 11 refused scale to 55 a 10 s interval; the next jump
	// for k needs refused > max(2 × 55, min(100, 55 + 4√55 + 6 = 90)) = 110.
	tb.Report(at(2 * time.Second))
	if tb.WantEarly(at(10 * time.Second)) {
		t.Fatal("early still wanted after the report")
	}
	// (Counted at the interval's end, where the test against the time passed asks as much.)
	tb.ObserveTake(a, "k", 110, false, false, 0, at(12*time.Second))
	if tb.WantEarly(at(12 * time.Second)) {
		t.Fatal("110 refused is not above 2 × last interval's 55")
	}
	tb.ObserveTake(a, "k", 1, false, false, 0, at(12*time.Second))
	if !tb.WantEarly(at(12 * time.Second)) {
		t.Fatal("111 refused is above 2 × 55: want early")
	}
	// k refused 111 over 10 s: its next jump needs > max(222, min(100, 111+42+6)) = 222.
	tb.Report(at(12 * time.Second))
	tb.ObserveTake(a, "k", 222, false, false, 0, at(22*time.Second))
	if tb.WantEarly(at(22 * time.Second)) {
		t.Fatal("222 refused is not above 2 × last interval's 111")
	}
	// Another identity starting to be refused jumps on its own.
	tb.ObserveTake(a, "other", 11, false, false, 0, at(12*time.Second))
	if tb.WantEarly(at(13*time.Second)) || !tb.WantEarly(at(14*time.Second)) {
		t.Fatal("a new identity's refusals above earlyJump should want early after EarlyGap")
	}
}

// TestWantEarlyKeepsEarlyMinRefused: a pair refused steadily (40 a 10 s interval) jumps
// at EarlyMinRefused when that is under its Poisson margin (40 + 4√40 + 6 = 71), and
// at EarlyFactor × its refusals when that is over.
func TestWantEarlyKeepsEarlyMinRefused(t *testing.T) {
	tb := newTable(t, func(c *Config) { c.EarlyMinRefused, c.EarlyFactor = 60, 1 })
	a := rule("a", 10)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tb.ObserveTake(a, "k", 40, false, false, 0, t0)
	tb.Report(at(10 * time.Second))                                 // 40 refused over a whole interval
	tb.ObserveTake(a, "k", 60, false, false, 0, at(20*time.Second)) // at the interval's end
	if tb.WantEarly(at(13 * time.Second)) {
		t.Fatal("60 refused is not above EarlyMinRefused 60")
	}
	tb.ObserveTake(a, "k", 1, false, false, 0, at(20*time.Second))
	if !tb.WantEarly(at(13 * time.Second)) {
		t.Fatal("61 refused: above EarlyMinRefused (60 < 71): want early")
	}
}

// A jump is measured against the part of the interval that has passed
// (Table.jumpedSoFar): a 50/s key's move to a region of three enforcers refuses some 15
// tokens a second at each where 7 an interval were refused before; the whole-interval
// threshold (7 + 4√7 + 6 = 24) took it about 2 s, against the time passed it takes
// under one. A pair refused steadily at its usual rate never jumps, however the interval
// is cut.
func TestJumpMeasuredAgainstTheTimePassed(t *testing.T) {
	tb := newTable(t, nil)
	a := rule("a", 10)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tb.ObserveTake(a, "moved", 7, false, false, 0, at(5*time.Second))
	tb.ObserveTake(a, "steady", 150, false, false, 0, at(5*time.Second))
	tb.Report(at(10 * time.Second)) // 7 and 150 refused over a whole interval
	jumpedAt := time.Duration(-1)
	for ms := 10_000; ms <= 20_000; ms += 100 {
		now := at(time.Duration(ms) * time.Millisecond)
		tb.ObserveTake(a, "steady", int64(1+(ms/100)%2), false, false, 0, now) // 15 a second, evenly
		if ms >= 10_300 {
			tb.ObserveTake(a, "moved", int64(1+(ms/100)%2), false, false, 0, now) // 15 a second from 10.3 s
		}
		if jumpedAt < 0 && tb.Jumped() {
			jumpedAt = time.Duration(ms-10_000) * time.Millisecond
		}
	}
	if jumpedAt < 0 || jumpedAt > 1300*time.Millisecond {
		t.Fatalf("a move refused 15 a second from 0.3 s into the interval jumped at %v, want within 1.3 s", jumpedAt)
	}
	// The steady pair alone, the interval after.
	tb.Report(at(20 * time.Second))
	for ms := 20_000; ms <= 30_000; ms += 100 {
		tb.ObserveTake(a, "steady", int64(1+(ms/100)%2), false, false, 0, at(time.Duration(ms)*time.Millisecond))
		if tb.Jumped() {
			t.Fatalf("a pair refused 15 a second as before jumped %v into the interval", time.Duration(ms-20_000)*time.Millisecond)
		}
	}
}

// FuzzSpaceSaving drives a small striped table with an arbitrary weighted stream and
// checks the package doc's bounds against the true counts, per stripe: every tracked
// pair's true admitted and refused lie in [reported, reported + error]; error ≤ N_s/m;
// every pair whose true tokens exceed N_s/m is reported; omitted_tokens is exact.
func FuzzSpaceSaving(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 1, 1, 1, 200, 3, 3}, uint8(0))
	f.Add([]byte("the quick brown fox jumps over the lazy dog again and again"), uint8(1))
	f.Add(make([]byte, 64), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, shape uint8) {
		stripes := 1 << (shape % 3)                 // 1, 2, 4
		capacity := stripes * (1 + int(shape>>2)%4) // 1..4 pairs a stripe
		tb := newTable(t, func(c *Config) {
			c.Capacity, c.Stripes, c.MaxIdentities = capacity, stripes, capacity
		})
		rs := []*rules.Compiled{rule("a", 1), rule("b", 1)}
		type truth struct{ admitted, refused int64 }
		true_ := map[pair]*truth{}
		for i := 0; i+1 < len(data); i += 2 {
			k, w := data[i], int64(data[i+1]%16)+1
			r := rs[k>>7]
			id := "id" + strconv.Itoa(int(k&0x0f)) // 16 identities × 2 rules
			allowed := k&0x10 == 0
			tb.ObserveTake(r, id, w, allowed, false, 0, t0)
			p := pair{r.ID, id}
			if true_[p] == nil {
				true_[p] = &truth{}
			}
			if allowed {
				true_[p].admitted += w
			} else {
				true_[p].refused += w
			}
		}
		// Per-stripe totals and bound N_s/m, from the same hash the table uses.
		m := int64(capacity / stripes)
		ns := make([]int64, stripes)
		stripeOf := func(id string) int { return int(maphash.String(tb.seed, id) & tb.mask) }
		var total int64
		for p, tr := range true_ {
			ns[stripeOf(p.identity)] += tr.admitted + tr.refused
			total += tr.admitted + tr.refused
		}
		rep := tb.Report(t0.Add(time.Second))
		got := byKey(rep)
		var reported int64
		for _, u := range rep.Usage {
			tr := true_[pair{u.Rule, u.Identity}]
			if tr == nil {
				t.Fatalf("reported a pair never seen: %v", u)
			}
			a, r, e := int64(u.Admitted), int64(u.Refused), int64(u.Error)
			if a > tr.admitted || tr.admitted > a+e || r > tr.refused || tr.refused > r+e ||
				tr.admitted+tr.refused > a+r+e {
				t.Fatalf("%s|%s: reported %d/%d ±%d, true %d/%d", u.Rule, u.Identity, a, r, e, tr.admitted, tr.refused)
			}
			if bound := ns[stripeOf(u.Identity)] / m; e > bound {
				t.Fatalf("%s|%s: error %d above N_s/m = %d", u.Rule, u.Identity, e, bound)
			}
			reported += a + r
		}
		for p, tr := range true_ {
			s := stripeOf(p.identity)
			if (tr.admitted+tr.refused)*m > ns[s] && got[p.rule+"|"+p.identity] == nil {
				t.Fatalf("heavy hitter %v (%d tokens > N_s/m = %d/%d) not reported", p, tr.admitted+tr.refused, ns[s], m)
			}
		}
		if int64(rep.OmittedTokens) != total-reported {
			t.Fatalf("omitted tokens %v, want %d", rep.OmittedTokens, total-reported)
		}
	})
}

// Observers racing a drain lose and double-count nothing: over all reports, reported plus
// omitted tokens equal what was observed.
func TestConcurrentObserveAndReport(t *testing.T) {
	tb := newTable(t, func(c *Config) { c.Capacity, c.Stripes, c.MaxIdentities = 64, 4, 64 })
	a := rule("a", 1e9)
	const workers, each = 4, 5000
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				tb.ObserveTake(a, "k"+strconv.Itoa((i*7+w)%200), 1, i%3 != 0, false, 0, t0)
			}
		}(w)
	}
	var sum float64
	add := func(r *allotv1.ReportRequest) {
		for _, u := range r.Usage {
			sum += u.Admitted + u.Refused
		}
		sum += r.OmittedTokens
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for i := 1; ; i++ {
		select {
		case <-done:
			add(tb.Report(t0.Add(time.Duration(i) * time.Second)))
			if sum != workers*each {
				t.Fatalf("reports account for %v tokens, want %d", sum, workers*each)
			}
			if n := tb.Len(); n != 0 {
				t.Fatalf("Len %d after the last drain", n)
			}
			return
		default:
			add(tb.Report(t0.Add(time.Duration(i) * time.Second)))
		}
	}
}

func TestObserveTrackedDoesNotAllocate(t *testing.T) {
	tb := newTable(t, nil)
	a := rule("a", 10)
	id := "key:k_123"
	tb.ObserveTake(a, id, 1, true, false, 0, t0)
	if n := testing.AllocsPerRun(1000, func() {
		tb.ObserveTake(a, id, 1, true, false, 0, t0)
		tb.ObserveTake(a, id, 1, false, false, 0, t0)
	}); n != 0 {
		t.Fatalf("%v allocations per tracked observe", n)
	}
	// After a drain the table is refilled without growing its maps.
	tb.Report(t0.Add(time.Second))
	tb.ObserveTake(a, id, 1, true, false, 0, t0)
	if n := testing.AllocsPerRun(1000, func() { tb.ObserveTake(a, id, 1, true, false, 0, t0) }); n != 0 {
		t.Fatalf("%v allocations per tracked observe after a drain", n)
	}
}

// Memory stays bounded whatever the key count: the table never tracks more than Capacity.
func TestBoundedWhateverTheKeys(t *testing.T) {
	tb := newTable(t, func(c *Config) { c.Capacity, c.Stripes = 256, 16 })
	a := rule("a", 10)
	for i := 0; i < 20000; i++ {
		tb.ObserveTake(a, "k"+strconv.Itoa(i), 1, true, false, 0, t0)
	}
	if n := tb.Len(); n > 256 {
		t.Fatalf("Len %d above Capacity 256", n)
	}
	r := tb.Report(t0.Add(time.Second))
	if len(r.Usage) > 256 || r.OmittedTokens+float64(len(r.Usage)) != 20000 {
		t.Fatalf("%d identities, %v omitted tokens", len(r.Usage), r.OmittedTokens)
	}
}

// The recent rate is a pair's tokens over about the last second: a key whose traffic just
// arrived reads its new rate, not the interval's average; one whose traffic left reads 0.
func TestRecentRate(t *testing.T) {
	tb := newTable(t, nil)
	a := rule("default", 1e6)
	for i := range 50 { // 0–5 s: 100 tokens every 100 ms, then nothing (the traffic left)
		tb.ObserveTake(a, "left", 100, true, false, 0, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	for i := range 10 { // 9–10 s: 150 tokens every 100 ms, refused (it just arrived)
		tb.ObserveTake(a, "arrived", 150, false, false, 0, t0.Add(9*time.Second+time.Duration(i)*100*time.Millisecond))
	}
	r := tb.Report(t0.Add(10 * time.Second))
	got, tokens := map[string]float64{}, map[string]float64{}
	for _, u := range r.Usage {
		got[u.Identity], tokens[u.Identity] = u.RecentRate, u.RecentTokens
	}
	// The count behind the rate (the balancer's shift test judges a change by it): the
	// slots from 9.25 s, the 750 ms the rate is measured over at a slot's boundary.
	if tokens["arrived"] != 1050 || tokens["left"] != 0 || got["arrived"] != 1050/0.75 {
		t.Errorf("recent tokens arrived %g (rate %g), left %g: want 1050 over 0.75 s, and 0", tokens["arrived"], got["arrived"], tokens["left"])
	}
	if got["left"] != 0 {
		t.Errorf("left: recent rate %g, want 0 (its traffic stopped 5 s before)", got["left"])
	}
	if x := got["arrived"]; x < 1400 || x > 1600 {
		t.Errorf("arrived: recent rate %g, want ≈ 1500/s (the interval's average is 150/s)", x)
	}
}

// A pair whose traffic stopped just before a report is in the next report as a quiet
// entry (no tokens, the recent rate of what is left of its last second), so the balancer
// hears that the traffic left at once; a pair quiet for longer, or never busy, is not.
func TestQuietEntry(t *testing.T) {
	tb := newTable(t, nil)
	a := rule("default", 1e6)
	for i := range 10 { // 9–10 s: 100 tokens every 100 ms
		tb.ObserveTake(a, "left", 100, true, false, 0, t0.Add(9*time.Second+time.Duration(i)*100*time.Millisecond))
	}
	tb.ObserveTake(a, "stays", 1, true, false, 0, t0.Add(9*time.Second))
	if r := tb.Report(t0.Add(10 * time.Second)); len(r.Usage) != 2 {
		t.Fatalf("first report: %d entries, want 2", len(r.Usage))
	}
	tb.ObserveTake(a, "stays", 1, true, false, 0, t0.Add(10*time.Second+500*time.Millisecond))
	r := tb.Report(t0.Add(10*time.Second + 600*time.Millisecond))
	got := byKey(r)
	q := got["default|left"]
	if q == nil {
		t.Fatalf("no quiet entry for the pair whose traffic stopped: %v", r.Usage)
	}
	if q.Admitted != 0 || q.Refused != 0 || q.RegionalRate != 1e6 {
		t.Errorf("quiet entry %v, want no tokens and the rule's regional rate", q)
	}
	// Part of its last second (1,000/s) is left in the recent window, by whole slots.
	if q.RecentRate < 100 || q.RecentRate >= 1000 {
		t.Errorf("quiet entry recent rate %g, want in (100, 1000): what is left of its last second", q.RecentRate)
	}
	if r.OmittedIdentities != 0 || r.OmittedTokens != 0 {
		t.Errorf("a quiet entry is not an omission: %d identities, %g tokens", r.OmittedIdentities, r.OmittedTokens)
	}
	// A report later: the pair had no tokens at the last report either, so no entry.
	if r := tb.Report(t0.Add(20 * time.Second)); byKey(r)["default|left"] != nil {
		t.Errorf("a pair quiet for two reports is still reported: %v", r.Usage)
	}
}

// Quiet entries only fill the room the busy ones leave: MaxIdentities bounds the report.
func TestQuietEntriesBounded(t *testing.T) {
	tb := newTable(t, func(c *Config) { c.MaxIdentities = 3 })
	a := rule("default", 1e6)
	for k := range 3 {
		tb.ObserveTake(a, fmt.Sprint("old", k), 10, true, false, 0, t0.Add(9500*time.Millisecond))
	}
	tb.Report(t0.Add(10 * time.Second))
	for k := range 2 {
		tb.ObserveTake(a, fmt.Sprint("new", k), 10, true, false, 0, t0.Add(10100*time.Millisecond))
	}
	r := tb.Report(t0.Add(10200 * time.Millisecond))
	got := byKey(r)
	if len(r.Usage) != 3 || got["default|new0"] == nil || got["default|new1"] == nil || got["default|old0"] == nil {
		t.Fatalf("report %v, want new0, new1 and the first quiet pair (old0)", r.Usage)
	}
}
