package grpcapi

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/rules"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const settleRules = `
rules:
  - id: llm
    match: {plan: pro}
    limits: [{name: minute, rate: 100, per: 1m}]
  - id: llm-tokens
    match: {domain: llm, descriptor: [{key: api_key}]}
    limits: [{name: minute, rate: 100, per: 1m}]
    settle: true
`

// allot.v1 over the wire: a check with an estimate answers a settle handle; Settle takes
// the difference once; again, or an unknown handle, is NOT_FOUND; junk INVALID_ARGUMENT.
func TestAllotSettle(t *testing.T) {
	rig := enforcertest.New(t, settleRules)
	cli := allotv1.NewAllotClient(serve(t, New(rig.E, Config{})))
	ctx := context.Background()
	resp, err := cli.Check(ctx, &allotv1.CheckRequest{ApiKey: "k", Plan: "pro", Hits: 10, Settle: true})
	if err != nil || !resp.GetAllowed() || resp.GetSettleHandle() == "" || resp.GetRemaining() != 90 {
		t.Fatalf("Check: %v %v", resp, err)
	}
	if r, err := cli.Check(ctx, &allotv1.CheckRequest{ApiKey: "k", Plan: "pro"}); err != nil || r.GetSettleHandle() != "" {
		t.Fatalf("a check that did not ask: %v %v, want no settle handle", r, err)
	}
	r, err := cli.Settle(ctx, &allotv1.SettleRequest{Handle: resp.GetSettleHandle(), Cost: 40})
	if err != nil || r.GetSettled() != 1 || r.GetRule() != "llm" || r.GetLimit() != "llm/minute" || r.GetRemaining() != 59 {
		t.Fatalf("Settle 40 of 10: %v %v, want 59 left (100 − 1 − 40)", r, err)
	}
	if _, err := cli.Settle(ctx, &allotv1.SettleRequest{Handle: resp.GetSettleHandle(), Cost: 0}); status.Code(err) != codes.NotFound {
		t.Fatalf("second Settle: %v, want NotFound", err)
	}
	for _, h := range []string{"", "junk", "s1.x.!!"} {
		if _, err := cli.Settle(ctx, &allotv1.SettleRequest{Handle: h}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Settle(%q): %v, want InvalidArgument", h, err)
		}
	}
	if _, err := cli.Settle(ctx, &allotv1.SettleRequest{Handle: resp.GetSettleHandle(), Cost: -1}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("negative cost: %v, want InvalidArgument", err)
	}
}

// Envoy: a settle: true descriptor's hits, sent on stream done, are taken whatever the
// bucket holds and answered OK; its peek (hits_addend 0, on the request path) is refused
// while the bucket is in debt; negative hits give tokens back, never above the burst.
func TestEnvoySettleOnStreamDone(t *testing.T) {
	rig := enforcertest.New(t, settleRules)
	cli := rlsv3.NewRateLimitServiceClient(serve(t, New(rig.E, Config{})))
	ctx := context.Background()
	d := func(hits uint64, negative bool) *rlsv3.RateLimitRequest {
		x := desc("api_key", "k")
		x.HitsAddend = wrapperspb.UInt64(hits)
		x.IsNegativeHits = negative
		return &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*ratelimitv3.RateLimitDescriptor{x}}
	}
	code := func(what string, req *rlsv3.RateLimitRequest, want rlsv3.RateLimitResponse_Code) *rlsv3.RateLimitResponse {
		t.Helper()
		r, err := cli.ShouldRateLimit(ctx, req)
		if err != nil || r.GetOverallCode() != want {
			t.Fatalf("%s: %v %v, want %v", what, r, err, want)
		}
		return r
	}
	code("peek before any use", d(0, false), rlsv3.RateLimitResponse_OK)
	for range 3 { // 3 × 80 tokens of a burst of 100: the last two go into debt
		code("stream-done hits", d(80, false), rlsv3.RateLimitResponse_OK)
	}
	r := code("peek in debt", d(0, false), rlsv3.RateLimitResponse_OVER_LIMIT)
	if st := r.GetStatuses()[0]; st.GetLimitRemaining() != 0 {
		t.Fatalf("remaining in debt: %v", st)
	}
	// Negative hits: 240 taken, the bucket held 100 − 240 = −100 (the debt bound). 150
	// back leaves 50; a peek of 50 passes, of 51 does not.
	if r := code("negative hits", d(150, true), rlsv3.RateLimitResponse_OK); r.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("negative hits answered with a limit: %v", r)
	}
	got, err := rig.E.Check(ctx, peekOf(50))
	if err != nil || !got.Allowed || got.Remaining != 50 {
		t.Fatalf("after 150 back: %+v %v, want 50", got, err)
	}
	code("negative hits past the burst", d(1000, true), rlsv3.RateLimitResponse_OK)
	if got, _ := rig.E.Check(ctx, peekOf(1)); got.Remaining != 100 {
		t.Fatalf("a refund of 1000: %+v, want the burst 100", got)
	}
}

func peekOf(hits int64) *enforcer.Request {
	return &enforcer.Request{Attrs: rules.Attrs{Domain: "llm", Entries: []rules.Entry{{Key: "api_key", Value: "k"}}}, Hits: hits, Peek: true}
}

// Negative hits on a rule with an in-flight limit release a slot and give no rate tokens
// back: the in-flight behaviour is kept.
func TestEnvoyNegativeHitsKeepInflightTokens(t *testing.T) {
	rig := enforcertest.New(t, `
rules:
  - id: exports
    limits:
      - {name: second, rate: 5, per: 1s}
      - {name: inflight, concurrent: 5, timeout: 30s}
`)
	cli := rlsv3.NewRateLimitServiceClient(serve(t, New(rig.E, Config{})))
	ctx := context.Background()
	start := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k")}}
	done := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: desc("api_key", "k").Entries, IsNegativeHits: true}}}
	for range 5 {
		if r, err := cli.ShouldRateLimit(ctx, start); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request: %v %v", r, err)
		}
		if r, err := cli.ShouldRateLimit(ctx, done); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("stream done: %v %v", r, err)
		}
	}
	// Five slots released, but the five tokens of the second stay taken.
	if r, err := cli.ShouldRateLimit(ctx, start); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("sixth request in the second: %v %v, want OVER_LIMIT by the rate", r, err)
	}
}
