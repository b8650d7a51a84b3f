package grpcapi

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// answerRules are descriptor rules of domain d: plain, quota and shadow limits of 5 a
// minute (burst 5: one token back every 12 s), and a week, a month and a year.
const answerRules = `
rules:
  - id: plain
    match: {domain: d, descriptor: [{key: k}]}
    limits: [{name: minute, rate: 5, per: 1m}]
  - id: plain2
    match: {domain: d, descriptor: [{key: k2}]}
    limits: [{name: minute, rate: 5, per: 1m}]
  - id: quota
    match: {domain: d, descriptor: [{key: q}]}
    quota: true
    limits: [{name: minute, rate: 1, per: 1m}]
  - id: quota2
    match: {domain: d, descriptor: [{key: q2}]}
    quota: true
    limits: [{name: minute, rate: 1, per: 1m}]
  - id: shadow
    match: {domain: d, descriptor: [{key: s}]}
    mode: shadow
    limits: [{name: minute, rate: 1, per: 1m}]
  - id: weekly
    match: {domain: d, descriptor: [{key: w}]}
    limits: [{name: week, rate: 3, per: 168h}]
  - id: monthly
    match: {domain: d, descriptor: [{key: m}]}
    limits: [{name: month, rate: 1000, per: 720h}]
  - id: yearly
    match: {domain: d, descriptor: [{key: y}]}
    limits: [{name: year, rate: 2, per: 8760h}]
`

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func hitsDesc(hits *uint64, kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := desc(kv...)
	if hits != nil {
		d.HitsAddend = wrapperspb.UInt64(*hits)
	}
	return d
}

func u64(v uint64) *uint64 { return &v }

// The descriptor's hits_addend wins over the request's, zero included; zero takes nothing
// and says whether one more request would pass now.
func TestEnvoyRLSHitsAddendLevels(t *testing.T) {
	rig := enforcertest.New(t, answerRules)
	s := New(rig.E, Config{})
	ctx := context.Background()
	steps := []struct {
		name      string
		reqHits   uint32
		descHits  *uint64
		advance   time.Duration
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
		reset     int64 // duration_until_reset, seconds
	}{
		{"request level 2", 2, nil, 0, ok, 3, 24},
		{"descriptor 1 beats request 2", 2, u64(1), 0, ok, 2, 36},
		{"descriptor 0: takes nothing", 2, u64(0), 0, ok, 2, 36},
		{"descriptor 0 again: still nothing", 0, u64(0), 0, ok, 2, 36},
		{"descriptor 2 spends the rest", 0, u64(2), 0, ok, 0, 60},
		{"descriptor 0 on an empty bucket: over", 5, u64(0), 0, over, 0, 60},
		{"request level 0 means 1: over", 0, nil, 0, over, 0, 60},
		{"a token back after 12 s: 0 says OK", 0, u64(0), 12 * time.Second, ok, 1, 48},
		{"and 1 takes it", 0, u64(1), 0, ok, 0, 60},
	}
	for _, st := range steps {
		rig.Clock.Advance(st.advance)
		resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: st.reqHits,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{hitsDesc(st.descHits, "k", "a")}})
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got := resp.Statuses[0]
		if resp.OverallCode != st.code || got.Code != st.code || got.LimitRemaining != st.remaining || got.DurationUntilReset.GetSeconds() != st.reset {
			t.Fatalf("%s: overall %v status %v remaining %d reset %v; want %v, %d, %ds", st.name, resp.OverallCode, got.Code,
				got.LimitRemaining, got.DurationUntilReset, st.code, st.remaining, st.reset)
		}
	}
	// A zero on a descriptor never seen: a full bucket, nothing made.
	resp, err := s.ShouldRateLimit(ctx, rls("d", hitsDesc(u64(0), "k", "fresh")))
	if err != nil || resp.Statuses[0].Code != ok || resp.Statuses[0].LimitRemaining != 5 {
		t.Fatalf("fresh descriptor, hits 0: %v %v", resp, err)
	}
	// In one request, each descriptor its own hits.
	resp, err = s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		hitsDesc(nil, "k", "b"), hitsDesc(u64(0), "k", "c"), hitsDesc(u64(5), "k2", "b")}})
	if err != nil {
		t.Fatal(err)
	}
	if r := []uint32{resp.Statuses[0].LimitRemaining, resp.Statuses[1].LimitRemaining, resp.Statuses[2].LimitRemaining}; r[0] != 2 || r[1] != 5 || r[2] != 0 {
		t.Fatalf("remaining %v, want [2 5 0]", r)
	}
}

// A descriptor's hits_addend above the bound is InvalidArgument naming it.
func TestEnvoyRLSHitsAddendBound(t *testing.T) {
	rig := enforcertest.New(t, answerRules)
	s := New(rig.E, Config{})
	_, err := s.ShouldRateLimit(context.Background(), rls("d", desc("k", "a"), hitsDesc(u64(1001), "k", "b")))
	if err == nil || !strings.Contains(err.Error(), "descriptor 1: hits_addend 1001, more than 1000") {
		t.Fatalf("got %v", err)
	}
}

// quota_mode: a quota descriptor over its limit says so in its status, and refuses the
// request only when every quota descriptor does, or a non-quota descriptor refuses.
func TestEnvoyRLSQuotaMode(t *testing.T) {
	rig := enforcertest.New(t, answerRules)
	s := New(rig.E, Config{})
	ctx := context.Background()
	check := func(name string, req *rlsv3.RateLimitRequest, overall rlsv3.RateLimitResponse_Code, codes ...rlsv3.RateLimitResponse_Code) {
		t.Helper()
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resp.OverallCode != overall || !equalCodes(codesOf(resp), codes) {
			t.Fatalf("%s: overall %v statuses %v, want %v %v", name, resp.OverallCode, codesOf(resp), overall, codes)
		}
	}
	check("quota, first", rls("d", desc("q", "a")), ok, ok)
	check("the only quota descriptor over: refused", rls("d", desc("q", "a")), over, over)
	check("one quota descriptor of two over: admitted", rls("d", desc("q", "a"), desc("q2", "a")), ok, over, ok)
	check("both over: refused", rls("d", desc("q", "a"), desc("q2", "a")), over, over, over)
	for range 5 {
		s.ShouldRateLimit(ctx, rls("d", desc("k", "a")))
	}
	check("a quota descriptor within, a plain one over: refused", rls("d", desc("q", "b"), desc("k", "a")), over, ok, over)

	// Globally (their QUOTA_MODE), every descriptor is a quota one.
	g := New(rig.E, Config{QuotaMode: true})
	resp, err := g.ShouldRateLimit(ctx, rls("d", desc("k", "a"), desc("k", "fresh")))
	if err != nil || resp.OverallCode != ok || !equalCodes(codesOf(resp), []rlsv3.RateLimitResponse_Code{over, ok}) {
		t.Fatalf("global quota mode: %v %v", resp, err)
	}
	if h := headerMap(resp.ResponseHeadersToAdd); h["Retry-After"] != "" {
		t.Errorf("an admitted request's headers name a refusal: %v", h)
	}
}

func equalCodes(a, b []rlsv3.RateLimitResponse_Code) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Global shadow mode: every check runs and is counted, the statuses say what was decided,
// the request is admitted.
func TestEnvoyRLSGlobalShadow(t *testing.T) {
	rig := enforcertest.New(t, answerRules)
	s := New(rig.E, Config{Shadow: true})
	ctx := context.Background()
	var resp *rlsv3.RateLimitResponse
	var err error
	for i := range 7 {
		resp, err = s.ShouldRateLimit(ctx, rls("d", desc("k", "a")))
		if err != nil || resp.OverallCode != ok {
			t.Fatalf("request %d: %v %v, want OK", i, resp, err)
		}
	}
	if resp.Statuses[0].Code != over || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Fatalf("the status says what was decided: %v", resp.Statuses[0])
	}
	h := headerMap(resp.ResponseHeadersToAdd)
	if h["Retry-After"] != "" || h["X-RateLimit-Rule"] != "" || h["RateLimit"] != `"plain/minute";r=0;t=0` {
		t.Errorf("headers of an admitted request: %v", h)
	}
	if n := counter(t, rig, "allot_enforcer_global_shadow_total"); n != 2 {
		t.Errorf("allot_enforcer_global_shadow_total = %v, want 2", n)
	}
}

// counter sums the series of counter name in rig's registry.
func counter(t *testing.T, rig *enforcertest.Rig, name string) float64 {
	t.Helper()
	mfs, err := rig.Reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
		return sum
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A shadow descriptor's limit is evaluated and counted, never refuses.
func TestEnvoyRLSShadowDescriptor(t *testing.T) {
	rig := enforcertest.New(t, answerRules)
	s := New(rig.E, Config{})
	ctx := context.Background()
	for i := range 3 {
		resp, err := s.ShouldRateLimit(ctx, rls("d", desc("s", "a")))
		if err != nil || resp.OverallCode != ok || resp.Statuses[0].Code != ok {
			t.Fatalf("request %d: %v %v, want OK", i, resp, err)
		}
	}
	if n := counter(t, rig, "allot_enforcer_shadow_decisions_total"); n != 3 {
		t.Errorf("shadow decisions %v, want 3 (1 would-allow, 2 would-refuse)", n)
	}
}

// Their response headers, when asked: limit, remaining and reset of the descriptor
// closest to its limit; under other names; or none.
func TestEnvoyRLSEnvoyHeaders(t *testing.T) {
	rig := enforcertest.New(t, answerRules)
	ctx := context.Background()
	s := New(rig.E, Config{Headers: Headers{Style: HeadersEnvoyRatelimit}})
	resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("k", "a"), hitsDesc(u64(3), "k2", "a"), desc("nothing", "x")}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"RateLimit-Limit": "5", "RateLimit-Remaining": "2", "RateLimit-Reset": "36"}
	if h := headerMap(resp.ResponseHeadersToAdd); len(h) != 3 || h["RateLimit-Limit"] != want["RateLimit-Limit"] ||
		h["RateLimit-Remaining"] != want["RateLimit-Remaining"] || h["RateLimit-Reset"] != want["RateLimit-Reset"] {
		t.Fatalf("headers %v, want %v", h, want)
	}
	// A refused non-quota descriptor is the one they describe, whatever the others hold
	// (its remaining: the 2 tokens it holds, short of the 3 asked; theirs would say 0).
	named := New(rig.E, Config{Headers: Headers{Style: HeadersEnvoyRatelimit, Limit: "X-RateLimit-Limit", Remaining: "X-RateLimit-Remaining", Reset: "X-RateLimit-Reset"}})
	resp, err = named.ShouldRateLimit(ctx, rls("d", desc("k", "fresh"), hitsDesc(u64(3), "k2", "a")))
	if err != nil || resp.OverallCode != over {
		t.Fatalf("%v %v", resp, err)
	}
	if h := headerMap(resp.ResponseHeadersToAdd); len(h) != 3 || h["X-RateLimit-Limit"] != "5" || h["X-RateLimit-Remaining"] != "2" || h["X-RateLimit-Reset"] != "36" {
		t.Fatalf("named headers %v", h)
	}
	none := New(rig.E, Config{Headers: Headers{Style: HeadersNone}})
	if resp, err = none.ShouldRateLimit(ctx, rls("d", desc("k", "a"))); err != nil || len(resp.ResponseHeadersToAdd) != 0 {
		t.Fatalf("no headers: %v %v", resp, err)
	}
	// Nothing limited, nothing said.
	if resp, err = s.ShouldRateLimit(ctx, rls("d", desc("nothing", "x"))); err != nil || len(resp.ResponseHeadersToAdd) != 0 {
		t.Fatalf("unlimited: %v %v", resp, err)
	}
}

// current_limit states week, month and year limits as written, and duration_until_reset
// is the time until the bucket is full, whatever the unit.
func TestEnvoyRLSLongUnits(t *testing.T) {
	rig := enforcertest.New(t, answerRules)
	s := New(rig.E, Config{})
	for _, tc := range []struct {
		key   string
		rpu   uint32
		unit  rlsv3.RateLimitResponse_RateLimit_Unit
		reset int64 // after one request: one token's refill, unit / rpu
	}{
		{"w", 3, rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 86400 / 3},
		{"m", 1000, rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * 86400 / 1000},
		{"y", 2, rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 86400 / 2},
	} {
		resp, err := s.ShouldRateLimit(context.Background(), rls("d", desc(tc.key, "a")))
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Statuses[0]
		if st.CurrentLimit.GetRequestsPerUnit() != tc.rpu || st.CurrentLimit.GetUnit() != tc.unit || st.LimitRemaining != tc.rpu-1 ||
			st.DurationUntilReset.GetSeconds() != tc.reset {
			t.Errorf("%s: %v, want %d per %v, %d left, reset in %ds", tc.key, st, tc.rpu, tc.unit, tc.rpu-1, tc.reset)
		}
	}
}

func withLimit(d *ratelimitv3.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

// A descriptor's limit override, when the configuration allows it: in a configured
// domain it takes the place of the descriptor rules; otherwise the rules decide.
func TestEnvoyRLSLimitOverride(t *testing.T) {
	rig := enforcertest.New(t, answerRules)
	ctx := context.Background()
	off := New(rig.E, Config{})
	resp, err := off.ShouldRateLimit(ctx, rls("d", withLimit(desc("k", "a"), 2, typev3.RateLimitUnit_SECOND)))
	if err != nil || resp.Statuses[0].CurrentLimit.GetName() != "plain/minute" {
		t.Fatalf("overrides off: %v %v, want the rule's limit", resp, err)
	}
	// Over the wire: the codec keeps the override.
	cli := rlsv3.NewRateLimitServiceClient(serve(t, New(rig.E, Config{LimitOverrides: true})))
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
		resp, err := cli.ShouldRateLimit(ctx, rls("d", withLimit(desc("k", "b"), 2, typev3.RateLimitUnit_SECOND)))
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Statuses[0]
		if st.Code != want || st.CurrentLimit.GetName() != "override.second.2/second" || st.CurrentLimit.GetRequestsPerUnit() != 2 ||
			st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
			t.Fatalf("request %d: %v, want %v under 2 a second", i, st, want)
		}
	}
	rig.Clock.Advance(time.Second)
	s := New(rig.E, Config{LimitOverrides: true})
	if resp, err = s.ShouldRateLimit(ctx, rls("d", withLimit(desc("k", "b"), 2, typev3.RateLimitUnit_SECOND))); err != nil || resp.OverallCode != ok {
		t.Fatalf("a second later: %v %v", resp, err)
	}
	// Zero requests a unit refuses; a domain with no rules is not limited, as with them.
	if resp, err = s.ShouldRateLimit(ctx, rls("d", withLimit(desc("k", "c"), 0, typev3.RateLimitUnit_HOUR))); err != nil || resp.OverallCode != over {
		t.Fatalf("0 an hour: %v %v", resp, err)
	}
	if resp, err = s.ShouldRateLimit(ctx, rls("unknown", withLimit(desc("k", "c"), 0, typev3.RateLimitUnit_HOUR))); err != nil || resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unconfigured domain: %v %v", resp, err)
	}
	// A unit that is none is named.
	_, err = s.ShouldRateLimit(ctx, rls("d", desc("k", "a"), withLimit(desc("k", "c"), 5, typev3.RateLimitUnit_UNKNOWN)))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 1: limit override unit 0 is not a unit") {
		t.Fatalf("unit UNKNOWN: %v", err)
	}
	_, err = s.ShouldRateLimit(ctx, rls("d", withLimit(desc("k", "c"), 2_000_000_000, typev3.RateLimitUnit_SECOND)))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 0: limit override") {
		t.Fatalf("a rate past the bound: %v", err)
	}
}
