package grpcapi

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// serveWith is serveConn's client of the Envoy service.
func serveWith(t *testing.T, s *Server, opts ...grpc.ServerOption) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(serveConn(t, s, opts...))
}

// TestWireWithAndWithoutCodec: the pooled wire path answers the same with Codec and with
// gRPC's protobuf codec (a server built without it), interceptor or not, and as the
// handler called directly.
func TestWireWithAndWithoutCodec(t *testing.T) {
	servers := map[string][]grpc.ServerOption{
		"codec":             {grpc.ForceServerCodecV2(Codec())},
		"codec+interceptor": {grpc.ForceServerCodecV2(Codec()), grpc.ChainUnaryInterceptor(RecoverUnary(hclog.NewNullLogger()))},
		"proto":             nil,
		"proto+interceptor": {grpc.ChainUnaryInterceptor(RecoverUnary(hclog.NewNullLogger()))},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reqs := []*rlsv3.RateLimitRequest{
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k1", "remote_address", "192.0.2.7")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k1")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k1")}}, // over the burst of 2
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k2"), desc("ip", "::1"), desc("method", "GET", "path", "/x", "org", "o")}},
	}
	var want []*rlsv3.RateLimitResponse
	{
		rig := enforcertest.New(t, testRules)
		s := New(rig.E, Config{})
		for _, r := range reqs {
			resp, err := s.ShouldRateLimit(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, resp)
		}
	}
	for name, opts := range servers {
		t.Run(name, func(t *testing.T) {
			rig := enforcertest.New(t, testRules)
			cli := serveWith(t, New(rig.E, Config{}), opts...)
			for i, r := range reqs {
				got, err := cli.ShouldRateLimit(ctx, r)
				if err != nil {
					t.Fatal(i, err)
				}
				if !proto.Equal(got, want[i]) {
					t.Fatalf("call %d: %v\nwant %v", i, got, want[i])
				}
			}
			if _, err := cli.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{}); err == nil {
				t.Fatal("an empty request was answered")
			}
		})
	}
}

// TestWirePoolsUnderConcurrency: many callers at once, each with its own key, each sees
// its own budget count down by one per call — a pooled request or reply handed to two calls
// at once would mix them (and -race would see it).
func TestWirePoolsUnderConcurrency(t *testing.T) {
	rig := enforcertest.New(t, `
rules:
  - id: default
    limits: [{name: hour, rate: 100, per: 1h, burst: 100000}]
`)
	cli := serveWith(t, New(rig.E, Config{}), grpc.ForceServerCodecV2(Codec()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const callers, calls = 8, 150
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("caller-%d", c)
			req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", key)}}
			last := uint32(100000)
			for i := range calls {
				resp, err := cli.ShouldRateLimit(ctx, req)
				if err != nil {
					errs <- err
					return
				}
				st := resp.GetStatuses()
				if len(st) != 1 || st[0].LimitRemaining >= last || st[0].LimitRemaining < last-2 {
					errs <- fmt.Errorf("%s call %d: %v after %d left", key, i, resp, last)
					return
				}
				last = st[0].LimitRemaining
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
