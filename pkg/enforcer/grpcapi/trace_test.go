package grpcapi

import (
	"context"
	"fmt"
	"testing"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/tracing"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"
)

// TestChecksJoinTheCallersTrace: over the wire (Codec, the pooled Envoy path), a check
// whose RPC carries a traceparent — Envoy's, when it traces — is a child of that span, on
// both services; one span per descriptor.
func TestChecksJoinTheCallersTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	rig := enforcertest.New(t, testRules, func(c *enforcer.Config) { c.Tracer = tp.Tracer("test") })
	cc := serve(t, New(rig.E, Config{}))

	gw, span := tp.Tracer("envoy").Start(context.Background(), "envoy ingress")
	span.End()
	ctx := tracing.InjectGRPC(gw)
	if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k1"), desc("api_key", "k2")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := allotv1.NewAllotClient(cc).Check(ctx, &allotv1.CheckRequest{ApiKey: "k3"}); err != nil {
		t.Fatal(err)
	}
	// Without a traceparent a check starts its own trace.
	if _, err := allotv1.NewAllotClient(cc).Check(metadata.NewOutgoingContext(context.Background(), nil), &allotv1.CheckRequest{ApiKey: "k4"}); err != nil {
		t.Fatal(err)
	}
	var checks []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanCheck {
			checks = append(checks, s)
		}
	}
	if len(checks) != 4 {
		t.Fatalf("%d check spans, want 4 (two descriptors, two allot checks)", len(checks))
	}
	for i, s := range checks[:3] {
		if s.Parent().SpanID() != span.SpanContext().SpanID() || !s.Parent().IsRemote() || s.SpanContext().TraceID() != span.SpanContext().TraceID() {
			t.Errorf("check %d: parent %v, want Envoy's remote span %v", i, s.Parent().SpanID(), span.SpanContext().SpanID())
		}
	}
	if p := checks[3].Parent(); p.IsValid() {
		t.Errorf("a check without traceparent has parent %v", p.SpanID())
	}
}

// discard drops the spans it is given: the benchmark measures the handler's part of
// tracing, not an exporter's.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkShouldRateLimitTraced is BenchmarkShouldRateLimit with tracing on: the
// sampler keeps ratio of the checks (parentbased_traceidratio), the request carries
// gRPC metadata but no traceparent (an Envoy that does not trace), spans are batched to
// an exporter that drops them.
func BenchmarkShouldRateLimitTraced(b *testing.B) {
	for _, ratio := range []float64{0, 0.01, 1} {
		b.Run(fmt.Sprintf("ratio=%g", ratio), func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}),
				sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
			defer tp.Shutdown(context.Background())
			rig := enforcertest.New(b, `
rules:
  - id: default
    limits: [{name: second, rate: 1000000, per: 1s}]
`, func(c *enforcer.Config) { c.Tracer = tp.Tracer("bench") })
			s := New(rig.E, Config{})
			req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				desc("api_key", "k1", "remote_address", "192.0.2.7", "method", "GET", "path", "/v1/items"),
			}}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("content-type", "application/grpc", "user-agent", "envoy"))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
