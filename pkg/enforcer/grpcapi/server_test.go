package grpcapi

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testRules = `
rules:
  - id: default
    limits: [{name: minute, rate: 120, per: 1m, burst: 2}]
  - id: per-ip
    by: ip
    limits: [{name: second, rate: 100, per: 1s}]
  - id: shadow-tight
    mode: shadow
    limits: [{name: second, rate: 1, per: 1s}]
`

// serve starts s on 127.0.0.1:0 as cmd/enforcer does (RecoverUnary, Codec) and returns a
// client connection; both end at cleanup.
func serve(t *testing.T, s *Server) *grpc.ClientConn {
	t.Helper()
	return serveConn(t, s, grpc.ChainUnaryInterceptor(RecoverUnary(hclog.NewNullLogger())), grpc.ForceServerCodecV2(Codec()))
}

// serveConn is serve with the server's options given.
func serveConn(t *testing.T, s *Server, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	s.Register(g)
	done := make(chan struct{})
	go func() { defer close(done); g.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		g.GracefulStop()
		<-done
	})
	return cc
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func headerMap(hs []*corev3.HeaderValue) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.Key] = h.Value
	}
	return m
}

func TestEnvoyRLSOKThenOverLimit(t *testing.T) {
	rig := enforcertest.New(t, testRules)
	cli := rlsv3.NewRateLimitServiceClient(serve(t, New(rig.E, Config{})))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("api_key", "k1", "remote_address", "192.0.2.7", "method", "GET", "path", "/v1/items?q=1", "x-unknown", "ignored"),
	}}
	for i := 0; i < 2; i++ {
		resp, err := cli.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 1 || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v, want OK", i, resp)
		}
		st := resp.Statuses[0]
		if st.CurrentLimit.GetName() != "default/minute" || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND ||
			st.CurrentLimit.GetRequestsPerUnit() != 2 || st.LimitRemaining != uint32(1-i) {
			t.Fatalf("call %d status %v, want default/minute 2/s with %d left", i, st, 1-i)
		}
		h := headerMap(resp.ResponseHeadersToAdd)
		if h["RateLimit-Policy"] != `"default/minute";q=2;w=1` || h["RateLimit"] != `"default/minute";r=`+string(rune('1'-i))+`;t=`+string(rune('1'-i)) {
			t.Fatalf("call %d headers %v", i, h)
		}
	}
	resp, err := cli.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	h := headerMap(resp.ResponseHeadersToAdd)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third call %v, want OVER_LIMIT", resp)
	}
	if h["Retry-After"] != "1" || h["X-RateLimit-Rule"] != "default" || h["RateLimit"] != `"default/minute";r=0;t=0` {
		t.Fatalf("third call headers %v", h)
	}
	// Another key is unaffected: a caller only sees its own budget.
	req.Descriptors[0] = desc("api_key", "k2", "remote_address", "192.0.2.7")
	if resp, err = cli.ShouldRateLimit(ctx, req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("k2: %v %v, want OK", resp, err)
	}
}

func TestEnvoyRLSPerDescriptorStatuses(t *testing.T) {
	rig := enforcertest.New(t, testRules)
	s := New(rig.E, Config{})
	ctx := context.Background()
	// Exhaust k1.
	for i := 0; i < 2; i++ {
		s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k1")}})
	}
	resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("api_key", "k2"), desc("api_key", "k1"), desc("generic_key", "nothing-matches-by-endpoint"),
		{Entries: desc("api_key", "k3").Entries, IsNegativeHits: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	codes := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK}
	for i, st := range resp.Statuses {
		if st.Code != codes[i] {
			t.Errorf("status %d: %v, want %v", i, st.Code, codes[i])
		}
	}
	// A descriptor with neither key nor IP is counted by the default rule as anonymous
	// (one bucket set for all such requests), never unlimited.
	if l := resp.Statuses[2].CurrentLimit; l == nil || l.Name != "default/minute" {
		t.Errorf("keyless, addressless descriptor: limit %v, want the default rule's (anonymous)", l)
	}
	if resp.Statuses[3].CurrentLimit != nil {
		t.Errorf("a negative-hits descriptor carries a limit: %v", resp.Statuses[3])
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || headerMap(resp.ResponseHeadersToAdd)["X-RateLimit-Rule"] != "default" {
		t.Fatalf("overall %v headers %v, want OVER_LIMIT by default", resp.OverallCode, resp.ResponseHeadersToAdd)
	}
}

func TestEnvoyRLSHitsAddend(t *testing.T) {
	rig := enforcertest.New(t, testRules)
	s := New(rig.E, Config{})
	ctx := context.Background()
	resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("hits 2: %v %v, want OK with 0 left", resp, err)
	}
	d := desc("api_key", "k9")
	d.HitsAddend = wrapperspb.UInt64(3) // more than the burst of 2: can never pass
	resp, err = s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || headerMap(resp.ResponseHeadersToAdd)["Retry-After"] != "" {
		t.Fatalf("descriptor hits 3 > burst: %v %v, want OVER_LIMIT without Retry-After", resp, err)
	}
}

func TestEnvoyRLSInvalidArgument(t *testing.T) {
	rig := enforcertest.New(t, testRules)
	cli := rlsv3.NewRateLimitServiceClient(serve(t, New(rig.E, Config{Domain: "api"})))
	ctx := context.Background()
	many := make([]*ratelimitv3.RateLimitDescriptor, 9)
	for i := range many {
		many[i] = desc("api_key", "k")
	}
	manyEntries := desc()
	for i := 0; i < 9; i++ {
		manyEntries.Entries = append(manyEntries.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "x", Value: "y"})
	}
	long := strings.Repeat("v", 257)
	for _, tc := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Domain: "api"}, "no descriptors"},
		{&rlsv3.RateLimitRequest{Domain: "other", Descriptors: many[:1]}, `domain "other" is not served here`},
		{&rlsv3.RateLimitRequest{Domain: strings.Repeat("d", 129), Descriptors: many[:1]}, "domain is 129 bytes"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: many}, "9 descriptors, more than 8"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{manyEntries}}, "descriptor 0 has 9 entries, more than 8"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", long)}}, "value is 257 bytes, more than 256"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(strings.Repeat("k", 65), "v")}}, "key is 65 bytes, more than 64"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "not-an-ip")}}, `"not-an-ip" is not an IP address`},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "a", "x-api-key", "b")}}, "api_key given twice"},
		{&rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 1001, Descriptors: many[:1]}, "hits_addend 1001, more than 1000"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{nil}}, "descriptor 0 has no entries"},
		{&rlsv3.RateLimitRequest{Descriptors: many[:1]}, "domain is empty"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k", "", "v")}}, "descriptor 0 entry 1: key is empty"},
	} {
		_, err := cli.ShouldRateLimit(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ShouldRateLimit: %v, want InvalidArgument containing %q", err, tc.want)
		}
	}
}

func TestAllotCheck(t *testing.T) {
	rig := enforcertest.New(t, testRules)
	cli := allotv1.NewAllotClient(serve(t, New(rig.E, Config{})))
	ctx := context.Background()
	req := &allotv1.CheckRequest{ApiKey: "k", Ip: "2001:db8::7", Endpoint: "GET /v1/items"}
	resp, err := cli.Check(ctx, req)
	if err != nil || !resp.Allowed || resp.Rule != "default" || resp.Remaining != 1 || resp.Source != allotv1.Source_SOURCE_MEMORY {
		t.Fatalf("first: %v %v", resp, err)
	}
	if len(resp.ShadowRefused) != 0 {
		t.Fatalf("first: shadow refused %v", resp.ShadowRefused)
	}
	resp, err = cli.Check(ctx, req)
	if err != nil || !resp.Allowed || len(resp.ShadowRefused) != 1 || resp.ShadowRefused[0] != "shadow-tight" {
		t.Fatalf("second: %v %v, want allowed with shadow-tight would-refuse", resp, err)
	}
	resp, err = cli.Check(ctx, req)
	if err != nil || resp.Allowed || resp.Rule != "default" || resp.RetryAfterMs != 500 || resp.Quota != 2 || resp.WindowSeconds != 1 {
		t.Fatalf("third: %v %v, want refused by default, retry 500ms", resp, err)
	}
	got := map[string]string{}
	for _, h := range resp.Headers {
		got[h.Name] = h.Value
	}
	if got["Retry-After"] != "1" || got["X-RateLimit-Rule"] != "default" || got["RateLimit-Policy"] != `"default/minute";q=2;w=1` {
		t.Fatalf("third headers %v", got)
	}
	for _, bad := range []*allotv1.CheckRequest{{Ip: "300.1.1.1"}, {Hits: 5000}, {ApiKey: strings.Repeat("a", 300)}} {
		if _, err := cli.Check(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Check(%v): %v, want InvalidArgument", bad, err)
		}
	}
}

func TestRecoverUnary(t *testing.T) {
	var logs strings.Builder
	ic := RecoverUnary(hclog.New(&hclog.LoggerOptions{Output: &logs}))
	_, err := ic(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/Y"}, func(context.Context, any) (any, error) {
		var m map[string]int
		m["boom"]++ // nil map write panics
		return nil, nil
	})
	if status.Code(err) != codes.Internal || !strings.Contains(logs.String(), "panic in gRPC handler") {
		t.Fatalf("got %v, logs %q", err, logs.String())
	}
}

func TestCurrentLimitUnits(t *testing.T) {
	for _, tc := range []struct {
		q, w int64
		rpu  uint32
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{100, 1, 100, rlsv3.RateLimitResponse_RateLimit_SECOND},
		{200, 2, 100, rlsv3.RateLimitResponse_RateLimit_SECOND},
		{5000, 60, 5000, rlsv3.RateLimitResponse_RateLimit_MINUTE}, // a burst that refills in a unit: as written
		{5000, 61, 81, rlsv3.RateLimitResponse_RateLimit_SECOND},   // any other: by its rate
		{10, 60, 10, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{10, 3600, 10, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{1, 86400, 1, rlsv3.RateLimitResponse_RateLimit_DAY},
		{1, 864000, 1, rlsv3.RateLimitResponse_RateLimit_DAY},
		{3, 7 * 86400, 3, rlsv3.RateLimitResponse_RateLimit_WEEK},
		{1000, 30 * 86400, 1000, rlsv3.RateLimitResponse_RateLimit_MONTH},
		{2, 365 * 86400, 2, rlsv3.RateLimitResponse_RateLimit_YEAR},
	} {
		d := enforcer.Decision{Rule: "r", Limit: "r/l", Quota: tc.q, Window: tc.w}
		cl := &rlsv3.RateLimitResponse_RateLimit{}
		setCurrentLimit(cl, &d)
		if cl.RequestsPerUnit != tc.rpu || cl.Unit != tc.unit {
			t.Errorf("q=%d w=%d: %d per %v, want %d per %v", tc.q, tc.w, cl.RequestsPerUnit, cl.Unit, tc.rpu, tc.unit)
		}
	}
}

func TestDescriptorMapping(t *testing.T) {
	lim := enforcer.DefaultInputLimits()
	var r enforcer.Request
	if _, err := descriptorRequest(DefaultKeyMap(), &lim, 0, desc("x-api-key", "k", "plan", "pro", "tenant", "acme",
		"method", "GET", "path", "/v1/search?q=x", "client_ip", "::ffff:192.0.2.1"), 3, &r); err != nil {
		t.Fatal(err)
	}
	a := r.Attrs
	if a.APIKey != "k" || a.Plan != "pro" || a.Org != "acme" || a.Endpoint != "GET /v1/search" || a.IP.String() != "192.0.2.1" || r.Hits != 3 {
		t.Fatalf("got %+v", r)
	}
	if _, err := descriptorRequest(DefaultKeyMap(), &lim, 0, desc("generic_key", "GET /v1/x", "method", "POST"), 0, &r); err != nil || r.Attrs.Endpoint != "GET /v1/x" {
		t.Fatalf("endpoint entry wins over method/path: %+v %v", r, err)
	}
}
