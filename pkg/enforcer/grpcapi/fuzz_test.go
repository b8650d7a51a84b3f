package grpcapi

import (
	"context"
	"errors"
	"testing"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FuzzShouldRateLimit feeds arbitrary wire bytes to the Envoy RLS handler: it never
// panics, and every error is InvalidArgument.
func FuzzShouldRateLimit(f *testing.F) {
	seed := func(r *rlsv3.RateLimitRequest) {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k", "remote_address", "10.1.2.3")}})
	seed(&rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 7, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("method", "GET", "path", "/x"), desc("ip", "::1")}})
	d := desc("generic_key", "g")
	d.HitsAddend = wrapperspb.UInt64(1 << 40)
	seed(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	f.Add([]byte{0x12, 0x00})

	rig := enforcertest.New(f, testRules)
	s := New(rig.E, Config{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		resp, err := s.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
	})
}

// FuzzDescriptorRequest maps one descriptor of arbitrary keys and values: it never
// panics, errors wrap enforcer.ErrInvalid, and what it accepts is within the limits.
func FuzzDescriptorRequest(f *testing.F) {
	f.Add("api_key", "k", "remote_address", "192.0.2.1", uint32(1), uint64(0))
	f.Add("method", "GET", "path", "/v1/x?y", uint32(0), uint64(5))
	f.Add("ip", "fe80::1%eth0", "ip", "::ffff:1.2.3.4", uint32(2000), uint64(0))
	lim := enforcer.DefaultInputLimits()
	km := DefaultKeyMap()
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string, hits uint32, dHits uint64) {
		d := desc(k1, v1, k2, v2)
		if dHits > 0 {
			d.HitsAddend = wrapperspb.UInt64(dHits)
		}
		var r enforcer.Request
		_, err := descriptorRequest(km, &lim, 0, d, hits, &r)
		if err != nil {
			if !errors.Is(err, enforcer.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if r.Hits < 0 || r.Hits > lim.MaxHits {
			t.Fatalf("hits %d accepted", r.Hits)
		}
		for _, v := range []string{r.Attrs.APIKey, r.Attrs.Plan, r.Attrs.Org, r.Attrs.Endpoint} {
			if len(v) > lim.MaxValueLen {
				t.Fatalf("value of %d bytes accepted", len(v))
			}
		}
	})
}

// FuzzAllotCheck feeds arbitrary wire bytes to allot.v1 Check.
func FuzzAllotCheck(f *testing.F) {
	b, _ := proto.Marshal(&allotv1.CheckRequest{ApiKey: "k", Ip: "1.2.3.4", Hits: 2, Endpoint: "GET /"})
	f.Add(b)
	rig := enforcertest.New(f, testRules)
	s := New(rig.E, Config{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req allotv1.CheckRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		if _, err := s.Check(context.Background(), &req); err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("error %v, want InvalidArgument", err)
		}
	})
}

// BenchmarkShouldRateLimit is the RLS handler alone (no transport) over the memory store:
// descriptor mapping, one check, the response and its headers.
func BenchmarkShouldRateLimit(b *testing.B) {
	rig := enforcertest.New(b, `
rules:
  - id: default
    limits: [{name: second, rate: 1000000, per: 1s}]
`)
	s := New(rig.E, Config{})
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("api_key", "k1", "remote_address", "192.0.2.7", "method", "GET", "path", "/v1/items"),
	}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
