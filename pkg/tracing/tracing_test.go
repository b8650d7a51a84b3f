package tracing

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

func spanContext(t *testing.T, state string) trace.SpanContext {
	t.Helper()
	ts, err := trace.ParseTraceState(state)
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		TraceState: ts,
	})
}

// TestGRPCRoundTrip: what InjectGRPC puts in the outgoing metadata, ExtractGRPC on the
// other side reads back as the remote parent: same trace, span, flags and state.
func TestGRPCRoundTrip(t *testing.T) {
	sc := spanContext(t, "vendor=v1")
	out := InjectGRPC(trace.ContextWithSpanContext(context.Background(), sc))
	md, ok := metadata.FromOutgoingContext(out)
	if !ok {
		t.Fatal("no outgoing metadata")
	}
	if got, want := md.Get("traceparent"), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; len(got) != 1 || got[0] != want {
		t.Fatalf("traceparent %q, want %q", got, want)
	}
	in := ExtractGRPC(metadata.NewIncomingContext(context.Background(), md))
	got := trace.SpanContextFromContext(in)
	if !got.IsRemote() || !got.Equal(sc.WithRemote(true)) {
		t.Fatalf("extracted %+v, want %+v (remote)", got, sc)
	}
	if got.TraceState().Get("vendor") != "v1" {
		t.Fatalf("tracestate %q lost", got.TraceState())
	}
}

// TestNoSpanNoMetadata: without a valid span context (no tracer, or a no-op one) nothing is
// sent and nothing is read.
func TestNoSpanNoMetadata(t *testing.T) {
	ctx := context.Background()
	if out := InjectGRPC(ctx); out != ctx {
		t.Fatal("InjectGRPC changed a context with no span")
	}
	if _, ok := metadata.FromOutgoingContext(InjectGRPC(ctx)); ok {
		t.Fatal("metadata added without a span")
	}
	for _, md := range []metadata.MD{nil, metadata.Pairs("traceparent", "garbage"), metadata.Pairs("x", "y")} {
		in := metadata.NewIncomingContext(ctx, md)
		if out := ExtractGRPC(in); out != in {
			t.Fatalf("ExtractGRPC(%v) changed the context", md)
		}
	}
}

func TestHTTPExtract(t *testing.T) {
	sc := spanContext(t, "")
	h := http.Header{}
	h.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	got := trace.SpanContextFromContext(ExtractHTTP(context.Background(), h))
	if !got.Equal(sc.WithRemote(true)) {
		t.Fatalf("extracted %+v, want %+v", got, sc)
	}
}

// BenchmarkExtractGRPCNone is what a check pays with tracing on for a request that
// carries no trace context.
func BenchmarkExtractGRPCNone(b *testing.B) {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("content-type", "application/grpc", "user-agent", "envoy"))
	b.ReportAllocs()
	for b.Loop() {
		_ = ExtractGRPC(ctx)
	}
}
