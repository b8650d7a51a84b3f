package report

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv/poll"
	"github.com/allot-dev/allot/pkg/tracing"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func traceparent(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

func reportSpans(rec *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanReport {
			out = append(out, s)
		}
	}
	return out
}

// TestReportSpans: each report is one client span — its retry included — and every RPC of
// it carries the span's traceparent, so the balancer's span of the report is its child.
// A final report (Leave) is one too.
func TestReportSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	lead := startBalancer(t, true, "")
	lead.failNext = 1
	g := newRig(t, StaticLeader(lead.addr), func(c *ReporterConfig) { c.Tracer = tp.Tracer("test") })
	g.tb.ObserveTake(rule("default", 10), "key:k1", 3, true, false, 0, t0)
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "the report's span", func() bool { return len(reportSpans(rec)) == 1 })
	if err := g.rep.Leave(); err != nil {
		t.Fatal(err)
	}
	spans := reportSpans(rec)
	if len(spans) != 2 {
		t.Fatalf("%d report spans, want 2 (the report, the final one)", len(spans))
	}
	lead.mu.Lock()
	parents := append([]string(nil), lead.parents...)
	lead.mu.Unlock()
	if len(parents) != 3 {
		t.Fatalf("%d RPCs, want 3 (a failure, its retry, the final report)", len(parents))
	}
	s, final := spans[0], spans[1]
	want := traceparent(s.SpanContext())
	if parents[0] != want || parents[1] != want || parents[2] != traceparent(final.SpanContext()) {
		t.Fatalf("traceparents %q, want %q twice then the final span's", parents, want)
	}
	a := attrs(s)
	if s.SpanKind() != trace.SpanKindClient || a[tracing.AttrRegion].AsString() != "us-east" ||
		a[tracing.AttrEnforcerID].AsString() != "e1" || a[tracing.AttrIdentities].AsInt64() != 1 ||
		a[tracing.AttrAttempts].AsInt64() != 2 || a[tracing.AttrResult].AsString() != "sent" ||
		a[tracing.AttrShareVersion].AsInt64() != 9 || a[tracing.AttrSeq].AsInt64() != int64(t0.UnixMilli())+1 {
		t.Errorf("report span: kind %v attributes %v", s.SpanKind(), a)
	}
	if len(s.Events()) != 1 {
		t.Errorf("events %v, want one failed attempt", s.Events())
	}
	if fa := attrs(final); !fa[tracing.AttrFinal].AsBool() || fa[tracing.AttrResult].AsString() != "sent" {
		t.Errorf("final report span attributes %v", fa)
	}
}

// TestReportSpanDropped: a report dropped after its retry ends its span with an error.
func TestReportSpanDropped(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	lead := startBalancer(t, true, "")
	lead.failNext = 2
	g := newRig(t, StaticLeader(lead.addr), func(c *ReporterConfig) { c.Tracer = tp.Tracer("test") })
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "the report's span", func() bool { return len(reportSpans(rec)) == 1 })
	s := reportSpans(rec)[0]
	if a := attrs(s); a[tracing.AttrResult].AsString() != "dropped" || a[tracing.AttrAttempts].AsInt64() != 2 || s.Status().Code != otelcodes.Error {
		t.Fatalf("dropped report's span: attributes %v status %v", a, s.Status())
	}
}

// TestNoTracerNoTraceContext: without a Tracer no traceparent goes with a report.
func TestNoTracerNoTraceContext(t *testing.T) {
	lead := startBalancer(t, true, "")
	g := newRig(t, StaticLeader(lead.addr), nil)
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a report", func() bool { return len(lead.reports()) == 1 })
	lead.mu.Lock()
	defer lead.mu.Unlock()
	if lead.parents[0] != "" {
		t.Fatalf("traceparent %q sent without a tracer", lead.parents[0])
	}
}
