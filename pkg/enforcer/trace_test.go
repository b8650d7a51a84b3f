package enforcer

import (
	"context"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestCheckSpans: a sampled check is one server span, a child of the span in the check's
// context, naming the deciding rule, limit, source and verdict, and the identity by its
// digest only — the API key appears nowhere in it.
func TestCheckSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	r := newRig(t, `
rules:
  - id: tight
    limits: [{name: second, rate: 1, per: 1s}]
`, nil, func(c *Config) { c.Tracer, c.IdentityDigestKey = tp.Tracer("test"), []byte("k") })
	if !r.e.Traced() {
		t.Fatal("Traced() = false with a Tracer")
	}
	const key = "sk_live_secret_key"
	parent, ps := tp.Tracer("gateway").Start(context.Background(), "gateway")
	for range 2 { // allowed, then refused (burst 1)
		if _, err := r.e.Check(parent, &Request{Attrs: rules.Attrs{APIKey: key}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := r.e.Check(parent, &Request{Attrs: rules.Attrs{APIKey: key}, Hits: -1})
	if err == nil {
		t.Fatal("Hits -1 accepted")
	}
	ps.End()

	var checks []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanCheck {
			checks = append(checks, s)
		}
	}
	if len(checks) != 3 {
		t.Fatalf("%d check spans, want 3", len(checks))
	}
	digest := r.e.digest("key:" + key)
	for i, want := range []struct{ verdict, source string }{{"allowed", "memory"}, {"refused", "memory"}} {
		s := checks[i]
		a := spanAttrs(s)
		if s.SpanKind() != trace.SpanKindServer || s.Parent().SpanID() != ps.SpanContext().SpanID() {
			t.Errorf("check %d: kind %v parent %v, want server, child of the gateway's span", i, s.SpanKind(), s.Parent().SpanID())
		}
		if a[tracing.AttrVerdict].AsString() != want.verdict || a[tracing.AttrSource].AsString() != want.source ||
			a[tracing.AttrRule].AsString() != "tight" || a[tracing.AttrLimit].AsString() != "tight/second" ||
			a[tracing.AttrCountedBy].AsString() != "api_key" || a[tracing.AttrIdentityDigest].AsString() != digest ||
			a[tracing.AttrHits].AsInt64() != 1 {
			t.Errorf("check %d: attributes %v, want %s from %s by rule tight, digest %s", i, a, want.verdict, want.source, digest)
		}
		for k, v := range a {
			if strings.Contains(v.Emit(), key) {
				t.Errorf("check %d: attribute %s carries the API key: %q", i, k, v.Emit())
			}
		}
	}
	if _, ok := spanAttrs(checks[1])[tracing.AttrRetryAfterMs]; !ok {
		t.Error("the refusal's span has no retry-after")
	}
	if st := checks[2].Status(); st.Code != codes.Error || !strings.Contains(st.Description, "hits -1") {
		t.Errorf("invalid check's span status %+v, want an error naming hits", st)
	}
}

// TestCheckNotSampled: a check the sampler drops is no span at all for the exporter, and
// its decision is the same.
func TestCheckNotSampled(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.NeverSample()))
	defer tp.Shutdown(context.Background())
	r := newRig(t, layered, nil, func(c *Config) { c.Tracer = tp.Tracer("test") })
	d := r.check(t, rules.Attrs{APIKey: "k", Plan: "pro"})
	if !d.Allowed || d.Rule == "" {
		t.Fatalf("decision %+v", d)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans recorded, want none", n)
	}
}

// discard is an exporter that drops what it is given: the benchmarks measure the check
// path's part of tracing, not an exporter's.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkCheckTraced is BenchmarkCheck with a tracer whose sampler keeps ratio of the
// checks (parentbased_traceidratio, as OTEL_TRACES_SAMPLER sets it; the checks here have
// no parent), spans batched to an exporter that discards them. BenchmarkCheck is the
// same check with tracing off.
func BenchmarkCheckTraced(b *testing.B) {
	for _, bc := range []struct {
		name  string
		ratio float64
	}{{"ratio=0", 0}, {"ratio=0.01", 0.01}, {"ratio=1", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}),
				sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(bc.ratio))))
			defer tp.Shutdown(context.Background())
			r := benchRig(b)
			r.e.tracer = tp.Tracer("bench")
			reqs := benchKeys(1024)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := r.e.Check(ctx, &reqs[i&1023]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
