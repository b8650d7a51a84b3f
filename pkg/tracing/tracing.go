// Package tracing is allot's vocabulary for OpenTelemetry traces, shared by the enforcer
// and the balancer: the names of the spans each process starts and of their attributes,
// and the propagation of the W3C trace context (traceparent, tracestate) over gRPC
// metadata and HTTP headers. Like pkg/contract it is a contract between the processes:
// the enforcer's usage report span is the parent of the balancer's only because both
// sides propagate it the same way.
//
// It depends on OpenTelemetry's API only (go.opentelemetry.io/otel/trace and
// propagation), never on its SDK: what records and exports spans — the tracer provider,
// the OTLP exporter, the OTEL_* variables that configure them — is the processes' shell's
// (pkg/appkit). A library user of pkg/enforcer passes any trace.Tracer, or none.
//
// # The spans
//
//	allot.check              enforcer, one per check (an Envoy RLS request of n
//	                         descriptors is n checks), kind server; a child of the
//	                         gateway's span when the request carries a traceparent
//	allot.report             enforcer, one per usage report (its retry included), kind
//	                         client; its context goes with the report RPC
//	allot.balancer.report    balancer, one per report RPC received, kind server; a child
//	                         of the enforcer's allot.report
//	allot.balancer.recompute balancer leader, one per recompute of the shares
//	allot.balancer.publish   balancer leader, one per share set (or head refresh) written
//	                         to etcd; linked to the recompute of the same tick
//
// A recompute and a publication are each the root of a trace of their own (many reports
// feed one recompute); both link to the balancer's span of the last report that asked for
// a tick at once (early, an acknowledgement, a final report), so a trace search from an
// enforcer's report reaches the share set it caused.
//
// No span or attribute carries an identity in clear: a check span names the deciding
// identity by AttrIdentityDigest, the keyed digest the sampled refusal logs carry
// (pkg/enforcer Config.IdentityDigestKey), and the balancer's spans carry counts only.
package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/metadata"
)

// Span names.
const (
	SpanCheck             = "allot.check"
	SpanReport            = "allot.report"
	SpanBalancerReport    = "allot.balancer.report"
	SpanBalancerRecompute = "allot.balancer.recompute"
	SpanBalancerPublish   = "allot.balancer.publish"
)

// Attribute keys. Values are bounded: rule and limit ids come from the rules, sources and
// verdicts from fixed sets, the rest are numbers.
const (
	// Check spans.
	AttrRule           = attribute.Key("allot.rule")            // the deciding rule's id
	AttrLimit          = attribute.Key("allot.limit")           // the deciding limit ("<rule>/<limit>")
	AttrSource         = attribute.Key("allot.source")          // where the answer came from: redis, lease, refusal-cache, fallback, ...
	AttrVerdict        = attribute.Key("allot.verdict")         // "allowed" or "refused"
	AttrCountedBy      = attribute.Key("allot.counted_by")      // api_key, ip, anonymous, org, endpoint, global
	AttrIdentityDigest = attribute.Key("allot.identity_digest") // keyed digest of the deciding identity, never the identity
	AttrHits           = attribute.Key("allot.hits")            // requests the check stood for
	AttrShadowRefused  = attribute.Key("allot.shadow_refused")  // shadow rules that would have refused
	AttrRetryAfterMs   = attribute.Key("allot.retry_after_ms")  // a refusal's Retry-After

	// Report spans (both sides).
	AttrRegion       = attribute.Key("allot.region")
	AttrEnforcerID   = attribute.Key("allot.enforcer_id")
	AttrSeq          = attribute.Key("allot.report.seq")
	AttrIdentities   = attribute.Key("allot.report.identities") // identities in the report
	AttrEarly        = attribute.Key("allot.report.early")
	AttrAck          = attribute.Key("allot.report.ack")
	AttrFinal        = attribute.Key("allot.report.final")
	AttrShareVersion = attribute.Key("allot.report.share_version") // the share set the enforcer applies
	AttrAttempts     = attribute.Key("allot.report.attempts")      // RPC attempts (enforcer)
	AttrResult       = attribute.Key("allot.result")               // see each span

	// Balancer spans.
	AttrTerm      = attribute.Key("allot.balancer.term")       // the leader's fencing token (election revision)
	AttrTracked   = attribute.Key("allot.balancer.identities") // identities tracked
	AttrPending   = attribute.Key("allot.balancer.pending")    // identities whose change plan is not finished
	AttrVersion   = attribute.Key("allot.balancer.version")    // the share set's version
	AttrEntries   = attribute.Key("allot.balancer.entries")    // identities listed in it
	AttrChanged   = attribute.Key("allot.balancer.changed")    // a new version (false: a head refresh)
	AttrPhase     = attribute.Key("allot.balancer.phase")      // "decrease" or "target"
	AttrPublishes = attribute.Key("allot.balancer.publishes")  // the recompute's tick has a share set to write
)

// propagator is the one way allot carries a trace context between processes: W3C Trace
// Context. Baggage is not carried.
var propagator propagation.TraceContext

// InjectGRPC returns ctx with the trace context of its span added to the outgoing gRPC
// metadata (traceparent, tracestate), for the next RPC made with it. Without a valid span
// context (no span, or a no-op tracer's) it returns ctx as it is.
func InjectGRPC(ctx context.Context) context.Context {
	var c outgoing
	propagator.Inject(ctx, &c)
	if c.n == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, c.kv[:c.n]...)
}

// ExtractGRPC returns ctx with the remote span context the incoming gRPC metadata carries
// (traceparent, tracestate), which a span started from it takes as its parent. Without a
// valid traceparent it returns ctx as it is, and without any it allocates nothing.
func ExtractGRPC(ctx context.Context) context.Context {
	tp := metadata.ValueFromIncomingContext(ctx, traceparent)
	if len(tp) == 0 {
		return ctx
	}
	c := incoming{traceparent: tp[0]}
	if ts := metadata.ValueFromIncomingContext(ctx, tracestate); len(ts) > 0 {
		c.tracestate = ts[0]
	}
	return propagator.Extract(ctx, &c)
}

// ExtractHTTP is ExtractGRPC for an HTTP request's headers.
func ExtractHTTP(ctx context.Context, h http.Header) context.Context {
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// outgoing collects what the propagator sets: at most traceparent and tracestate.
type outgoing struct {
	kv [4]string
	n  int
}

func (c *outgoing) Get(string) string { return "" }
func (c *outgoing) Keys() []string    { return nil }
func (c *outgoing) Set(k, v string) {
	if c.n+2 <= len(c.kv) {
		c.kv[c.n], c.kv[c.n+1] = k, v
		c.n += 2
	}
}

// The W3C Trace Context fields, as gRPC metadata keys (lower case).
const (
	traceparent = "traceparent"
	tracestate  = "tracestate"
)

// incoming is what the propagator reads: the trace context fields of the incoming
// metadata.
type incoming struct{ traceparent, tracestate string }

func (c *incoming) Get(k string) string {
	switch k {
	case traceparent:
		return c.traceparent
	case tracestate:
		return c.tracestate
	}
	return ""
}
func (c *incoming) Keys() []string  { return []string{traceparent, tracestate} }
func (c *incoming) Set(_, _ string) {}
