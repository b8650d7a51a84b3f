package grpcapi

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// descriptorRules are descriptor rules beside a named-dimension rule.
const descriptorRules = `
rules:
  - id: per-key
    limits: [{name: second, rate: 100, per: 1s}]
  - id: marketing
    match:
      domain: messaging
      descriptor: [{key: message_type, value: marketing}, {key: to_number}]
    limits: [{name: day, rate: 2, per: 24h}]
  - id: specific
    match: {domain: messaging, descriptor: [{key: k1, value: v1}, {key: user, value: bob}]}
    limits: [{name: second, rate: 1, per: 1s}]
  - id: override
    match: {domain: messaging, descriptor: [{key: k2, value: v2}, {key: user, value: bob}]}
    replaces: [specific]
    limits: [{name: second, rate: 3, per: 1s}]
`

func rls(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func codesOf(resp *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	var out []rlsv3.RateLimitResponse_Code
	for _, st := range resp.Statuses {
		out = append(out, st.Code)
	}
	return out
}

// Every entry of every descriptor reaches the descriptor rules, beside the key map's
// attributes: an entry allot's key map does not know (message_type) selects the rule, and
// each number has its own bucket.
func TestEnvoyRLSDescriptorRules(t *testing.T) {
	rig := enforcertest.New(t, descriptorRules)
	s := New(rig.E, Config{})
	ctx := context.Background()
	for _, n := range []string{"2061111111", "2062222222"} {
		req := rls("messaging", desc("message_type", "marketing", "to_number", n))
		for i := 0; i < 3; i++ {
			resp, err := s.ShouldRateLimit(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			want := rlsv3.RateLimitResponse_OK
			if i == 2 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if resp.OverallCode != want || resp.Statuses[0].CurrentLimit.GetName() != "marketing/day" {
				t.Fatalf("%s call %d: %v, want %v by marketing/day", n, i, resp, want)
			}
		}
	}
	// Another domain has none of these rules: only the named default counts it.
	resp, err := s.ShouldRateLimit(ctx, rls("other", desc("message_type", "marketing", "to_number", "2061111111")))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit.GetName() != "per-key/second" {
		t.Fatalf("other domain: %v %v", resp, err)
	}
}

// A rule matching one descriptor replaces a rule matching another descriptor of the same
// request (envoyproxy/ratelimit's README example of replaces).
func TestEnvoyRLSReplacesAcrossDescriptors(t *testing.T) {
	rig := enforcertest.New(t, descriptorRules)
	s := New(rig.E, Config{})
	ctx := context.Background()
	both := rls("messaging", desc("k1", "v1", "user", "bob"), desc("k2", "v2", "user", "bob"))
	for i := 0; i < 3; i++ {
		resp, err := s.ShouldRateLimit(ctx, both)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit.GetName() != "per-key/second" ||
			resp.Statuses[1].CurrentLimit.GetName() != "override/second" {
			t.Fatalf("call %d: %v; want specific replaced by override", i, resp)
		}
	}
	resp, _ := s.ShouldRateLimit(ctx, both)
	if c := codesOf(resp); c[0] != rlsv3.RateLimitResponse_OK || c[1] != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("fourth call: %v, want the override's limit of 3 only", c)
	}
	// Alone, k1's descriptor has its own limit of 1.
	alone := rls("messaging", desc("k1", "v1", "user", "bob"))
	resp, _ = s.ShouldRateLimit(ctx, alone)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit.GetName() != "specific/second" {
		t.Fatalf("alone: %v", resp)
	}
	if resp, _ = s.ShouldRateLimit(ctx, alone); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("alone, second call: %v", resp)
	}
}

// BenchmarkShouldRateLimitDescriptor is BenchmarkShouldRateLimit with a nested descriptor
// rule (envoyproxy/ratelimit's "messaging" example) beside the named-dimension default:
// the descriptor's entries go to the descriptor rules as well as through the key map.
func BenchmarkShouldRateLimitDescriptor(b *testing.B) {
	rig := enforcertest.New(b, `
rules:
  - id: default
    limits: [{name: second, rate: 1000000, per: 1s}]
  - id: marketing
    match:
      domain: messaging
      descriptor: [{key: message_type, value: marketing}, {key: to_number}]
    limits: [{name: second, rate: 1000000, per: 1s}]
`)
	s := New(rig.E, Config{})
	req := rls("messaging", desc("message_type", "marketing", "to_number", "2061111111"))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
