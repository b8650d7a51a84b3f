package enforcer

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// rig is an Enforcer over a memory store and a fake clock.
type rig struct {
	e     *Enforcer
	clk   *clock.Fake
	reg   *prometheus.Registry
	store bucket.Store
	h     *rules.Holder
}

func compile(t testing.TB, yaml string, now time.Time) *rules.Snapshot {
	t.Helper()
	set, err := rules.ParseYAML([]byte(yaml))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	snap, err := rules.Compile(set, rules.CompileOptions{Region: "us-east", Now: now})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return snap
}

func newRig(t testing.TB, yaml string, store func(clock.Clock) bucket.Store, mod ...func(*Config)) *rig {
	t.Helper()
	clk := clock.NewFake(t0)
	r := &rig{clk: clk, reg: prometheus.NewRegistry()}
	if store == nil {
		store = func(c clock.Clock) bucket.Store { return bucket.NewMemory(c, 0) }
	}
	r.store = store(clk)
	r.h = rules.NewHolder(compile(t, yaml, t0))
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules, cfg.Store, cfg.Clock, cfg.Registerer = "us-east", r.h, r.store, clk, r.reg
	for _, f := range mod {
		f(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r.e = e
	return r
}

func (r *rig) check(t testing.TB, a rules.Attrs) Decision {
	t.Helper()
	d, err := r.e.Check(context.Background(), &Request{Attrs: a})
	if err != nil {
		t.Fatalf("Check(%+v): %v", a, err)
	}
	return d
}

const layered = `
rules:
  - id: default
    limits: [{name: second, rate: 10, per: 1s}]
  - id: pro
    match: {plan: pro}
    limits: [{name: second, rate: 5, per: 1s}]
  - id: pro-search
    match: {plan: pro, endpoint: "GET /v1/search"}
    limits: [{name: second, rate: 3, per: 1s}]
  - id: key-abc
    match: {api_key: abc}
    expires_at: 2026-03-01T12:00:10Z
    reason: incident 42
    limits: [{name: second, rate: 1, per: 1s}]
`

// admitted counts how many of n checks at one instant pass.
func (r *rig) admitted(t testing.TB, n int, a rules.Attrs) (int, Decision) {
	t.Helper()
	var last Decision
	ok := 0
	for i := 0; i < n; i++ {
		last = r.check(t, a)
		if last.Allowed {
			ok++
		}
	}
	return ok, last
}

func TestMostSpecificRuleWins(t *testing.T) {
	for _, tc := range []struct {
		name  string
		attrs rules.Attrs
		want  int
		rule  string
	}{
		{"default", rules.Attrs{APIKey: "k1", Plan: "free"}, 10, "default"},
		{"plan", rules.Attrs{APIKey: "k2", Plan: "pro", Endpoint: "GET /v1/items"}, 5, "pro"},
		{"plan+endpoint", rules.Attrs{APIKey: "k3", Plan: "pro", Endpoint: "GET /v1/search"}, 3, "pro-search"},
		{"key override beats plan+endpoint", rules.Attrs{APIKey: "abc", Plan: "pro", Endpoint: "GET /v1/search"}, 1, "key-abc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, layered, nil)
			got, last := r.admitted(t, 20, tc.attrs)
			if got != tc.want {
				t.Errorf("admitted %d of 20, want %d", got, tc.want)
			}
			if last.Allowed || last.Rule != tc.rule || last.Limit != tc.rule+"/second" {
				t.Errorf("last decision %+v, want a refusal by %s/second", last, tc.rule)
			}
			if last.Source != SourceMemory || last.RetryAfter <= 0 {
				t.Errorf("refusal source %v retry-after %v, want memory and > 0", last.Source, last.RetryAfter)
			}
		})
	}
}

func TestOverrideExpiresOnTime(t *testing.T) {
	r := newRig(t, layered, nil)
	a := rules.Attrs{APIKey: "abc", Plan: "free"}
	if d := r.check(t, a); d.Rule != "key-abc" {
		t.Fatalf("before expiry: rule %q, want key-abc", d.Rule)
	}
	r.clk.Set(t0.Add(10*time.Second - time.Microsecond))
	if d := r.check(t, a); d.Rule != "key-abc" {
		t.Fatalf("1µs before expiry: rule %q, want key-abc", d.Rule)
	}
	r.clk.Set(t0.Add(10 * time.Second))
	if d := r.check(t, a); d.Rule != "default" || !d.Allowed {
		t.Fatalf("at expiry: %+v, want allowed by default", d)
	}
}

const multi = `
rules:
  - id: per-key
    limits: [{name: second, rate: 2, per: 1s}]
  - id: everyone
    by: global
    limits: [{name: second, rate: 3, per: 1s}]
`

func TestEveryEnforcingRuleMustAllow(t *testing.T) {
	r := newRig(t, multi, nil)
	// Key a: 2 pass (per-key), the third is refused by its own rule and must not spend the
	// shared global bucket.
	if n, last := r.admitted(t, 5, rules.Attrs{APIKey: "a"}); n != 2 || last.Rule != "per-key" {
		t.Fatalf("key a: admitted %d, last %+v; want 2 and a refusal by per-key", n, last)
	}
	// The global bucket has 3 - 2 = 1 left: key b gets one, then the global rule refuses.
	d := r.check(t, rules.Attrs{APIKey: "b"})
	if !d.Allowed || d.Rule != "everyone" || d.Remaining != 0 {
		t.Fatalf("key b first: %+v, want allowed with everyone the tightest (0 left)", d)
	}
	d = r.check(t, rules.Attrs{APIKey: "b"})
	if d.Allowed || d.Rule != "everyone" {
		t.Fatalf("key b second: %+v, want refused by everyone", d)
	}
}

func TestAllowedReportsTightestLimit(t *testing.T) {
	r := newRig(t, `
rules:
  - id: key
    limits:
      - {name: second, rate: 10, per: 1s, burst: 10}
      - {name: minute, rate: 30, per: 1m, burst: 4}
  - id: all
    by: global
    limits: [{name: second, rate: 100, per: 1s}]
`, nil)
	d := r.check(t, rules.Attrs{APIKey: "k"})
	if !d.Allowed || d.Limit != "key/minute" || d.Remaining != 3 || d.Quota != 4 || d.Window != 8 {
		t.Fatalf("got %+v, want key/minute with 3 left, q=4 w=8", d)
	}
}

const shadowRules = `
rules:
  - id: base
    limits: [{name: second, rate: 5, per: 1s}]
  - id: strict-shadow
    mode: shadow
    limits: [{name: second, rate: 1, per: 1s}]
`

func TestShadowNeverRefuses(t *testing.T) {
	r := newRig(t, shadowRules, nil)
	a := rules.Attrs{APIKey: "k"}
	d := r.check(t, a)
	if !d.Allowed || d.ShadowRefusedCount() != 0 || d.Rule != "base" {
		t.Fatalf("first: %+v, want allowed by base, no shadow refusal", d)
	}
	for i := 0; i < 4; i++ {
		d = r.check(t, a)
		if !d.Allowed {
			t.Fatalf("check %d refused by %s: shadow must not refuse", i+2, d.Rule)
		}
		if got := d.ShadowRefused(); len(got) != 1 || got[0] != "strict-shadow" {
			t.Fatalf("check %d: shadow refused %v, want [strict-shadow]", i+2, got)
		}
	}
	if d := r.check(t, a); d.Allowed || d.Rule != "base" {
		t.Fatalf("sixth: %+v, want refused by base (the enforcing rule)", d)
	}
	want := `
# HELP allot_enforcer_shadow_decisions_total Shadow rule evaluations: would-allow, would-refuse, or error (store failed). Never enforced.
# TYPE allot_enforcer_shadow_decisions_total counter
allot_enforcer_shadow_decisions_total{result="error"} 0
allot_enforcer_shadow_decisions_total{result="would-allow"} 1
allot_enforcer_shadow_decisions_total{result="would-refuse"} 4
`
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(want), "allot_enforcer_shadow_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

func TestShadowOnlyRulesetNeverRefuses(t *testing.T) {
	r := newRig(t, `
rules:
  - id: only-shadow
    mode: shadow
    by: ip
    limits: [{name: second, rate: 1, per: 1s}]
`, nil)
	for i := 0; i < 10; i++ {
		d := r.check(t, rules.Attrs{IP: netip.MustParseAddr("2001:db8::1")})
		if !d.Allowed || d.Rule != "" || d.Source != SourceNone {
			t.Fatalf("check %d: %+v, want allowed with no enforcing rule", i, d)
		}
	}
}

func TestHeaders(t *testing.T) {
	r := newRig(t, `
rules:
  - id: api
    limits: [{name: minute, rate: 60, per: 1m, burst: 3}]
`, nil, func(c *Config) { c.ResetJitterMax, c.ResetJitterRatio = 0, 0 })
	a := rules.Attrs{APIKey: "k"}
	d := r.check(t, a)
	got := d.AppendHeaders(nil)
	want := []Header{
		{"RateLimit-Policy", `"api/minute";q=3;w=3`},
		{"RateLimit", `"api/minute";r=2;t=2`}, // 2 tokens last 2 s at 1 a second
		{"X-RateLimit-Counted-By", "api_key"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("allowed headers %v, want %v", got, want)
	}
	r.check(t, a)
	r.check(t, a)
	d = r.check(t, a)
	got = d.AppendHeaders(nil)
	want = []Header{
		{"RateLimit-Policy", `"api/minute";q=3;w=3`},
		{"RateLimit", `"api/minute";r=0;t=0`},
		{"X-RateLimit-Counted-By", "api_key"},
		{"Retry-After", "1"},
		{"X-RateLimit-Rule", "api"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("refused headers %v, want %v", got, want)
	}
	// 0.4 s later one token is still 0.6 s away: Retry-After rounds up to 1.
	r.clk.Advance(400 * time.Millisecond)
	if d = r.check(t, a); d.Allowed || d.RetryAfterSeconds() != 1 || d.RetryAfter != 600*time.Millisecond {
		t.Fatalf("after 0.4s: %+v, want refused with retry-after 600ms (header 1)", d)
	}
	var none Decision
	none.Allowed = true
	if h := none.AppendHeaders(nil); len(h) != 0 {
		t.Fatalf("no-rule decision headers %v, want none", h)
	}
}

// TestEffectiveWindow: the RateLimit field's t (draft-ietf-httpapi-ratelimit-headers-11,
// the effective window) is how long the remaining tokens last at the limit's rate, rounded
// up, so r/t never exceeds the rate; on a refusal it never points past Retry-After.
func TestEffectiveWindow(t *testing.T) {
	for _, tc := range []struct {
		remaining int64
		rate      float64
		allowed   bool
		retry     time.Duration
		want      int64
	}{
		{remaining: 39, rate: 20, allowed: true, want: 2},        // 1.95 s
		{remaining: 40, rate: 20, allowed: true, want: 2},        // a full bucket reads as the policy: q=40;w=2
		{remaining: 1, rate: 20, allowed: true, want: 1},         // 50 ms, rounded up
		{remaining: 0, rate: 20, allowed: true, want: 0},         // nothing left: no window
		{remaining: 1, rate: 2.0 / 60, allowed: true, want: 30},  // 2 a minute
		{remaining: 5, rate: 1, retry: 2 * time.Second, want: 2}, // cost 7, 5.x left: 5 s, held to Retry-After
		{remaining: 0, rate: 1, retry: 600 * time.Millisecond, want: 0},
		{remaining: 3, rate: 1, want: 3},                               // refused for good (cost over the burst): no Retry-After to hold it to
		{remaining: 1 << 50, rate: 1e-9, allowed: true, want: 1 << 30}, // bounded, not overflowed
	} {
		d := Decision{Rule: "r", Allowed: tc.allowed, Remaining: tc.remaining, RetryAfter: tc.retry,
			Effective: effectiveWindow(tc.remaining, tc.rate)}
		if got := d.EffectiveSeconds(); got != tc.want {
			t.Errorf("r=%d at %g/s (allowed %v, retry %v): t=%d, want %d", tc.remaining, tc.rate, tc.allowed, tc.retry, got, tc.want)
		}
		if got := d.EffectiveSeconds(); got > 0 && got < 1<<30 && tc.retry == 0 && float64(tc.remaining)/float64(got) > tc.rate+1e-9 {
			t.Errorf("r=%d over t=%d is faster than the rate %g", tc.remaining, got, tc.rate)
		}
	}
}

func TestHeaderValuesAreSafe(t *testing.T) {
	d := Decision{Rule: "a\"b\\c\r\nX: y\xff", Limit: "a\"b\\c\r\n/min\xff", Quota: 1, Window: 1}
	for _, h := range d.AppendHeaders(nil) {
		for i := 0; i < len(h.Value); i++ {
			if c := h.Value[i]; c < 0x20 || c > 0x7e {
				t.Fatalf("%s has byte %#x: %q", h.Name, c, h.Value)
			}
		}
	}
	if got := string(d.AppendPolicy(nil)); got != `"a\"b\\c__/min_";q=1;w=1` {
		t.Fatalf("policy %s", got)
	}
}

func TestResetJitterIsSmallLaterAndPerKey(t *testing.T) {
	const max, ratio = time.Second, 0.1
	seen := map[time.Duration]bool{}
	for i := 0; i < 1000; i++ {
		id := "key:" + string(rune('a'+i%26)) + strings.Repeat("x", i%7) + string(rune('0'+i%10))
		for _, reset := range []time.Duration{0, time.Millisecond, 3 * time.Second, time.Minute, time.Hour} {
			j := jitter(id, reset, max, ratio)
			bound := min(max, time.Duration(float64(reset)*ratio))
			if j < 0 || (bound > 0 && j >= bound) || (bound == 0 && j != 0) {
				t.Fatalf("jitter(%q, %v) = %v, want in [0, %v)", id, reset, j, bound)
			}
			if j2 := jitter(id, reset, max, ratio); j2 != j {
				t.Fatalf("jitter(%q, %v) not deterministic: %v then %v", id, reset, j, j2)
			}
			if reset == time.Hour {
				seen[j] = true
			}
		}
	}
	if len(seen) < 20 {
		t.Fatalf("only %d distinct jitters over 1000 keys: not spread", len(seen))
	}
	// Through the enforcer: reset is never earlier than the store's.
	r := newRig(t, `
rules:
  - id: api
    limits: [{name: hour, rate: 3600, per: 1h, burst: 10}]
`, nil)
	for i := 0; i < 50; i++ {
		d := r.check(t, rules.Attrs{APIKey: "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))})
		// burst 10 at 1/s with one taken: the store says full again in 1 s.
		if d.Reset < time.Second || d.Reset >= time.Second+100*time.Millisecond {
			t.Fatalf("reset %v, want in [1s, 1.1s)", d.Reset)
		}
	}
}

func TestInputLimits(t *testing.T) {
	r := newRig(t, layered, nil)
	long := strings.Repeat("x", DefaultInputLimits().MaxValueLen+1)
	for _, tc := range []struct {
		req  Request
		want string
	}{
		{Request{Attrs: rules.Attrs{APIKey: long}}, "api_key is 257 bytes, more than 256"},
		{Request{Attrs: rules.Attrs{Plan: long}}, "plan is 257 bytes"},
		{Request{Attrs: rules.Attrs{Org: long}}, "org is 257 bytes"},
		{Request{Attrs: rules.Attrs{Endpoint: long}}, "endpoint is 257 bytes"},
		{Request{Hits: 1001}, "hits 1001, must be in [0, 1000]"},
		{Request{Hits: -1}, "hits -1"},
	} {
		_, err := r.e.Check(context.Background(), &tc.req)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check: error %v, want ErrInvalid containing %q", err, tc.want)
		}
	}
}

func TestTooLargeIsRefusedNotRetried(t *testing.T) {
	r := newRig(t, `
rules:
  - id: api
    limits: [{name: second, rate: 5, per: 1s}]
`, nil)
	d, err := r.e.Check(context.Background(), &Request{Attrs: rules.Attrs{APIKey: "k"}, Hits: 6})
	if err != nil || d.Allowed || d.Source != SourceTooLarge || d.RetryAfterSeconds() != 0 || d.Rule != "api" {
		t.Fatalf("got %+v, %v; want refused too-large by api without Retry-After", d, err)
	}
	d, err = r.e.Check(context.Background(), &Request{Attrs: rules.Attrs{APIKey: "k"}, Hits: 5})
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("hits=burst: %+v, %v; want allowed with 0 left", d, err)
	}
}

// failing is a store that cannot answer.
type failing struct{}

func (failing) Take(context.Context, *bucket.Request) (bucket.Result, error) {
	return bucket.Result{}, errors.New("redis: connection refused")
}

// unavailable is a layer that cannot reach the store and knows when it will next try
// (pkg/fallback on an open breaker, for a fail-closed request).
type unavailable struct{ retry time.Duration }

func (u unavailable) Take(context.Context, *bucket.Request) (bucket.Result, error) {
	return bucket.Result{Source: bucket.SourceFailClosed, RetryAfter: u.retry}, bucket.ErrUnavailable
}

// TestFailClosedIsDecidedHere: the fail mode is decided in the enforcer only; the wait a
// layer gives with ErrUnavailable becomes the Retry-After, else FailClosedRetryAfter.
func TestFailClosedIsDecidedHere(t *testing.T) {
	for _, c := range []struct {
		retry time.Duration
		want  int64
	}{{3 * time.Second, 3}, {0, 1}} {
		r := newRig(t, `
rules:
  - id: login
    fail_mode: closed
    limits: [{name: minute, rate: 5, per: 1m}]
`, func(clock.Clock) bucket.Store { return unavailable{c.retry} })
		d := r.check(t, rules.Attrs{APIKey: "k"})
		if d.Allowed || d.Source != SourceFailClosed || d.RetryAfterSeconds() != c.want {
			t.Errorf("layer retry %v: %+v, want refused fail-closed, retry-after %ds", c.retry, d, c.want)
		}
	}
}

func TestStoreFailureFollowsFailMode(t *testing.T) {
	r := newRig(t, `
rules:
  - id: login
    match: {endpoint: "POST /login"}
    fail_mode: closed
    limits: [{name: minute, rate: 5, per: 1m}]
  - id: api
    limits: [{name: second, rate: 5, per: 1s}]
`, func(clock.Clock) bucket.Store { return failing{} })
	d := r.check(t, rules.Attrs{APIKey: "k", Endpoint: "POST /login"})
	if d.Allowed || d.Source != SourceFailClosed || d.Rule != "login" || d.RetryAfterSeconds() != 1 {
		t.Fatalf("fail-closed: %+v, want refused by login, source fail-closed, retry-after 1", d)
	}
	d = r.check(t, rules.Attrs{APIKey: "k", Endpoint: "GET /v1/items"})
	if !d.Allowed || d.Source != SourceFailOpen || d.Rule != "api" || d.Remaining != 5 {
		t.Fatalf("fail-open: %+v, want allowed by api, source fail-open, 5 remaining", d)
	}
	want := `
# HELP allot_enforcer_store_errors_total Takes the store could not answer even with the fallback layer, by the rule's fail mode (open: allowed, closed: refused).
# TYPE allot_enforcer_store_errors_total counter
allot_enforcer_store_errors_total{fail_mode="closed"} 1
allot_enforcer_store_errors_total{fail_mode="open"} 1
`
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(want), "allot_enforcer_store_errors_total"); err != nil {
		t.Fatal(err)
	}
}

// cancelled is a store that fails because the caller's context ended.
type cancelled struct{}

func (cancelled) Take(ctx context.Context, _ *bucket.Request) (bucket.Result, error) {
	return bucket.Result{}, ctx.Err()
}

func TestCallerCancellationIsAnError(t *testing.T) {
	r := newRig(t, layered, func(clock.Clock) bucket.Store { return cancelled{} })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.e.Check(ctx, &Request{Attrs: rules.Attrs{APIKey: "k"}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Check with a cancelled context: %v, want context.Canceled", err)
	}
}

func TestEmptySnapshotAllows(t *testing.T) {
	r := newRig(t, layered, nil)
	r.e.cfg.Rules = rules.NewHolder(nil)
	if d := r.check(t, rules.Attrs{APIKey: "k"}); !d.Allowed || d.Rule != "" || d.Source != SourceNone {
		t.Fatalf("empty snapshot: %+v, want allowed, no rule", d)
	}
}

type usageLog struct {
	mu    sync.Mutex // mu guards takes
	takes []string
}

func (u *usageLog) ObserveTake(rule *rules.Compiled, identity string, tokens int64, allowed, low bool, src Source, _ time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	res := "refused"
	if allowed {
		res = "allowed"
	}
	u.takes = append(u.takes, rule.ID+" "+identity+" "+res+" "+src.String()+" "+string(rune('0'+tokens)))
}

func TestUsageObserverSeesEveryEnforcingTake(t *testing.T) {
	u := &usageLog{}
	r := newRig(t, multi, nil, func(c *Config) { c.Usage = u })
	r.admitted(t, 3, rules.Attrs{APIKey: "a"})
	want := []string{
		"per-key key:a allowed memory 1", "everyone global allowed memory 1",
		"per-key key:a allowed memory 1", "everyone global allowed memory 1",
		"per-key key:a refused memory 1",
	}
	if strings.Join(u.takes, "\n") != strings.Join(want, "\n") {
		t.Fatalf("usage:\n%s\nwant:\n%s", strings.Join(u.takes, "\n"), strings.Join(want, "\n"))
	}
}

// lowLog records UsageObserver's low for each admitted take.
type lowLog struct {
	mu  sync.Mutex
	low []bool
}

func (u *lowLog) ObserveTake(_ *rules.Compiled, _ string, _ int64, allowed, low bool, _ Source, _ time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if allowed {
		u.low = append(u.low, low)
	}
}

// low is set on a take of the store that leaves the bucket under half its burst, and only
// for a burst of DrainMinBurst tokens or more (half of a smaller one is a clump of a few
// requests).
func TestUsageObserverIsToldOfABurstSpent(t *testing.T) {
	const yaml = `
rules:
  - id: default
    limits: [{name: second, rate: 20, per: 1s}]
  - id: small
    match: {plan: small}
    limits: [{name: second, rate: 8, per: 1s}]
`
	u := &lowLog{}
	r := newRig(t, yaml, nil, func(c *Config) { c.Usage = u })
	if n, _ := r.admitted(t, 20, rules.Attrs{APIKey: "a"}); n != 20 {
		t.Fatalf("admitted %d of 20", n)
	}
	for i, low := range u.low { // take i+1 leaves 19 - i tokens of 20
		if want := 2*(19-i) < 20; low != want {
			t.Fatalf("take %d (remaining %d of 20): low %v, want %v", i+1, 19-i, low, want)
		}
	}
	u.low = nil
	r.admitted(t, 8, rules.Attrs{APIKey: "b", Plan: "small"})
	if slices.Contains(u.low, true) {
		t.Fatalf("a burst of 8 (< DrainMinBurst %d) told low: %v", DrainMinBurst, u.low)
	}
}

func TestDecisionMetrics(t *testing.T) {
	r := newRig(t, layered, nil)
	r.admitted(t, 12, rules.Attrs{APIKey: "k"})
	if got := r.e.metrics.checks.decided(1, SourceMemory); got != 10 {
		t.Errorf("allowed/memory = %v, want 10", got)
	}
	if got := r.e.metrics.checks.decided(0, SourceMemory); got != 2 {
		t.Errorf("refused/memory = %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(r.reg, "allot_enforcer_check_seconds", "allot_enforcer_rules_info", "allot_enforcer_rules_age_seconds", "allot_enforcer_rules"); err != nil || n != 4 {
		t.Errorf("gathered %d series (%v), want 4", n, err)
	}
}

func TestConfigValidate(t *testing.T) {
	base := DefaultConfig()
	base.Region, base.Rules, base.Store, base.Registerer = "r", rules.NewHolder(nil), failing{}, prometheus.NewRegistry()
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Region = "" }, "region is empty"},
		{func(c *Config) { c.Rules = nil }, "rules holder is nil"},
		{func(c *Config) { c.Store = nil }, "store is nil"},
		{func(c *Config) { c.Registerer = nil }, "registerer is nil"},
		{func(c *Config) { c.ResetJitterRatio = 0.9 }, "reset jitter ratio 0.9"},
		{func(c *Config) { c.Limits.MaxHits = 0 }, "max hits 0"},
		{func(c *Config) { c.Limits.MaxValueLen = 1000 }, "max value length 1000"},
	} {
		c := base
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate: %v, want %q", err, tc.want)
		}
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("base config: %v", err)
	}
}
