package balancer

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	"github.com/allot-dev/allot/pkg/tracing"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func named(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func linksTo(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.SpanID() == sc.SpanID() && l.SpanContext.TraceID() == sc.TraceID() {
			return true
		}
	}
	return false
}

// TestEtcdSpans: a leader's span of a report is a child of the enforcer's report span
// (whose trace context came in the RPC's metadata); the report that asked for a tick is
// linked from the recompute it caused, and a publication from the recompute of its tick.
func TestEtcdSpans(t *testing.T) {
	e := testenv.Etcd(t, 1)
	cli := client(t, e.Endpoints()...)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())

	cfg := DefaultServiceConfig()
	cfg.Core = testConfig()
	cfg.Core.Interval, cfg.Core.Learning, cfg.Core.EarlyGap = time.Second, time.Minute, time.Second
	cfg.Etcd, cfg.Advertise = cli, "b1:7070"
	cfg.ElectionPrefix, cfg.SharesPrefix = "/tr/election", "/tr/shares/"
	cfg.SessionTTL, cfg.TickEvery = testSessionTTL, 200*time.Millisecond
	cfg.Registerer, cfg.Tracer = prometheus.NewRegistry(), tp.Tracer("test")
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: logWriter{t}})
	s, err := NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	poll.True(t, 5*time.Second, "leadership", func() bool { ok, _ := s.Leading(); return ok })
	_, rev := s.Leading()

	// The enforcer's side: its report span, sent in the RPC's metadata.
	enfCtx, enfSpan := tp.Tracer("enforcer").Start(context.Background(), tracing.SpanReport)
	md, _ := metadata.FromOutgoingContext(tracing.InjectGRPC(enfCtx))
	now := time.Now()
	// Two regions first, then the third's early report: the learning period ends with it
	// (every region heard) and it asks for the tick that recomputes.
	for i, region := range regions3 {
		rate := 0.0
		if region == "us-east" {
			rate = 900
		}
		ctx, req := context.Background(), report(region, "e-"+region, 1, now, use("key:hot", rate, 0))
		if i == 0 {
			continue
		}
		if _, err := s.Report(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	req := report("us-east", "e-us-east", 1, now, use("key:hot", 900, 0))
	req.Early = true
	resp, err := s.Report(metadata.NewIncomingContext(context.Background(), md), req)
	if err != nil || !resp.Accepted {
		t.Fatalf("report: %v %v", resp, err)
	}
	enfSpan.End()

	var reportSpan sdktrace.ReadOnlySpan
	for _, sp := range named(rec, tracing.SpanBalancerReport) {
		if sp.Parent().IsValid() {
			reportSpan = sp
		}
	}
	if reportSpan == nil {
		t.Fatal("no balancer report span with a parent")
	}
	a := spanAttrs(reportSpan)
	if reportSpan.Parent().SpanID() != enfSpan.SpanContext().SpanID() || !reportSpan.Parent().IsRemote() ||
		reportSpan.SpanContext().TraceID() != enfSpan.SpanContext().TraceID() || reportSpan.SpanKind() != trace.SpanKindServer {
		t.Fatalf("balancer report span: parent %v (remote %v) kind %v, want a server span under the enforcer's %v",
			reportSpan.Parent().SpanID(), reportSpan.Parent().IsRemote(), reportSpan.SpanKind(), enfSpan.SpanContext().SpanID())
	}
	if a[tracing.AttrResult].AsString() != "accepted" || a[tracing.AttrRegion].AsString() != "us-east" ||
		!a[tracing.AttrEarly].AsBool() || a[tracing.AttrTerm].AsInt64() != rev || a[tracing.AttrIdentities].AsInt64() != 1 {
		t.Fatalf("balancer report span attributes %v", a)
	}

	// The recompute the report asked for links to it; a publication of a new version links
	// to the recompute of its tick (the first recomputes of a key may publish nothing: its
	// demand is smoothed over windows).
	var recompute, publish sdktrace.ReadOnlySpan
	poll.True(t, 20*time.Second, "the recompute linked to the report, and a changed publication linked to a recompute", func() bool {
		recomputes := map[trace.SpanID]sdktrace.ReadOnlySpan{}
		for _, sp := range named(rec, tracing.SpanBalancerRecompute) {
			recomputes[sp.SpanContext().SpanID()] = sp
			if linksTo(sp, reportSpan.SpanContext()) {
				recompute = sp
			}
		}
		for _, sp := range named(rec, tracing.SpanBalancerPublish) {
			for _, l := range sp.Links() {
				if recomputes[l.SpanContext.SpanID()] != nil && spanAttrs(sp)[tracing.AttrChanged].AsBool() {
					publish = sp
				}
			}
		}
		return recompute != nil && publish != nil
	})
	if ra := spanAttrs(recompute); ra[tracing.AttrTerm].AsInt64() != rev || ra[tracing.AttrTracked].AsInt64() != 1 {
		t.Errorf("recompute span attributes %v", ra)
	}
	if pa := spanAttrs(publish); pa[tracing.AttrResult].AsString() != "ok" || pa[tracing.AttrTerm].AsInt64() != rev ||
		pa[tracing.AttrVersion].AsInt64() < 2 || pa[tracing.AttrEntries].AsInt64() != 1 || pa[tracing.AttrPhase].AsString() == "" {
		t.Errorf("publish span attributes %v", pa)
	}

	// A report's answer says the newest set the leader has made (a cut-off enforcer rejoins
	// only once it applies it: ReportResponse.share_version).
	resp, err = s.Report(context.Background(), report("eu-west", "e-eu-west", 2, now.Add(time.Second)))
	if err != nil || !resp.Accepted || resp.ShareLeaderRev != rev || int64(resp.ShareVersion) < spanAttrs(publish)[tracing.AttrVersion].AsInt64() {
		t.Errorf("answer %v, %v: want share_leader_rev %d and share_version at least the published %d",
			resp, err, rev, spanAttrs(publish)[tracing.AttrVersion].AsInt64())
	}
}
