package enforcer

import (
	"github.com/allot-dev/allot/pkg/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// checkStart are a check span's start options, made once: a variadic argument built at
// the call would be allocated for every check.
var checkStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// endSpan ends a check's span (tracing.SpanCheck, started by Check when the enforcer has
// a Tracer). The sampler decided at the start; only a sampled (recording) span is given
// attributes, so a check that is not sampled costs the sampler's decision and a
// non-recording span, and nothing of the decision is formatted for it.
func (e *Enforcer) endSpan(span trace.Span, req *Request, d *Decision, err *error) {
	if span.IsRecording() {
		e.annotate(span, req, d, *err)
	}
	span.End()
}

// annotate states a check's outcome on its span: the deciding rule, limit, source and
// verdict, and the identity by its digest only (the one the refusal logs carry).
func (e *Enforcer) annotate(span trace.Span, req *Request, d *Decision, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error()) // names a field and a bound, never a value
		return
	}
	verdict := "allowed"
	if !d.Allowed {
		verdict = "refused"
	}
	hits := req.Hits
	if hits == 0 {
		hits = 1
	}
	kv := make([]attribute.KeyValue, 0, 9)
	kv = append(kv, tracing.AttrVerdict.String(verdict), tracing.AttrSource.String(d.Source.String()),
		tracing.AttrHits.Int64(hits))
	if d.Rule != "" {
		kv = append(kv, tracing.AttrRule.String(d.Rule), tracing.AttrLimit.String(d.Limit),
			tracing.AttrCountedBy.String(d.CountedBy))
	}
	if d.identity != "" {
		kv = append(kv, tracing.AttrIdentityDigest.String(e.digest(d.identity)))
	}
	if !d.Allowed {
		kv = append(kv, tracing.AttrRetryAfterMs.Int64(d.RetryAfter.Milliseconds()))
	}
	if n := d.ShadowRefusedCount(); n > 0 {
		kv = append(kv, tracing.AttrShadowRefused.Int(n))
	}
	span.SetAttributes(kv...)
}

// Traced reports whether checks are spans (Config.Tracer is set): front ends then read
// the gateway's trace context from the request (pkg/tracing) for the span's parent, and
// pay nothing for it otherwise.
func (e *Enforcer) Traced() bool { return e.tracer != nil }
