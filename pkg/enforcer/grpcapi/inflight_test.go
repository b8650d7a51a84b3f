package grpcapi

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const inflightRules = `
rules:
  - id: exports
    limits: [{name: inflight, concurrent: 1, timeout: 30s}]
`

// allot.v1 over the wire: Check acquires and answers a handle; Release gives it back once.
func TestAllotCheckHandleAndRelease(t *testing.T) {
	rig := enforcertest.New(t, inflightRules)
	cli := allotv1.NewAllotClient(serve(t, New(rig.E, Config{})))
	ctx := context.Background()
	resp, err := cli.Check(ctx, &allotv1.CheckRequest{ApiKey: "k"})
	if err != nil || !resp.GetAllowed() || resp.GetHandle() == "" || resp.GetLimit() != "exports/inflight" {
		t.Fatalf("Check: %v %v", resp, err)
	}
	if r, err := cli.Check(ctx, &allotv1.CheckRequest{ApiKey: "k"}); err != nil || r.GetAllowed() || r.GetHandle() != "" {
		t.Fatalf("second Check while the first is in flight: %v %v, want refused", r, err)
	}
	if _, err := cli.Release(ctx, &allotv1.ReleaseRequest{Handle: resp.GetHandle()}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := cli.Release(ctx, &allotv1.ReleaseRequest{Handle: resp.GetHandle()}); status.Code(err) != codes.NotFound {
		t.Fatalf("second Release: %v, want NotFound", err)
	}
	for _, h := range []string{"", "junk", "h1.x.!!"} {
		if _, err := cli.Release(ctx, &allotv1.ReleaseRequest{Handle: h}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Release(%q): %v, want InvalidArgument", h, err)
		}
	}
	if r, err := cli.Check(ctx, &allotv1.CheckRequest{ApiKey: "k"}); err != nil || !r.GetAllowed() {
		t.Fatalf("Check after the release: %v %v", r, err)
	}
}

// Envoy: a descriptor's check acquires; the same descriptor with is_negative_hits, sent
// when the stream is done, releases the identity's oldest slot and is answered OK.
func TestEnvoyNegativeHitsRelease(t *testing.T) {
	rig := enforcertest.New(t, inflightRules)
	mem := rig.Store.(*bucket.Memory)
	cli := rlsv3.NewRateLimitServiceClient(serve(t, New(rig.E, Config{})))
	ctx := context.Background()
	start := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k")}}
	done := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: desc("api_key", "k").Entries, IsNegativeHits: true}}}
	if r, err := cli.ShouldRateLimit(ctx, start); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v %v", r, err)
	}
	if r, err := cli.ShouldRateLimit(ctx, start); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second request while the first is in flight: %v %v, want OVER_LIMIT", r, err)
	}
	for i := range 2 { // the second finds nothing held: still OK
		if r, err := cli.ShouldRateLimit(ctx, done); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Fatalf("stream done %d: %v %v", i, r, err)
		}
		if n := mem.Held("key:k", "exports/inflight"); n != 0 {
			t.Fatalf("stream done %d: %d slots held, want 0", i, n)
		}
	}
	if r, err := cli.ShouldRateLimit(ctx, start); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("request after the release: %v %v", r, err)
	}
}
