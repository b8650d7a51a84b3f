package inprocess

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	"github.com/allot-dev/allot/pkg/tracing"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	otlptrace "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// TestTracesReachTheCollector runs the binaries' wiring (each enforcer and the balancer
// an App, configured from OTEL_* variables as the commands are) against an OTLP receiver
// in the test's process, and checks what arrives there:
//
//   - a check is an allot.check span from allot-enforcer, a child of the gateway's span
//     its request named in traceparent, naming rule, source and verdict and no API key;
//   - each usage report is an allot.report span from allot-enforcer, and the balancer's
//     allot.balancer.report span (from allot-balancer) of it is its child, in its trace;
//   - the leader's recomputes and publications arrive as allot.balancer.recompute and
//     allot.balancer.publish spans, a publication linked to its tick's recompute.
func TestTracesReachTheCollector(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, a balancer and two enforcers")
	}
	col := testenv.StartOTLP(t)
	tc, err := appkit.TracingFromEnv(func(k string) string {
		return map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": col.Endpoint(),
			"OTEL_BSP_SCHEDULE_DELAY":     "100",
			"OTEL_RESOURCE_ATTRIBUTES":    "deployment.environment=test",
		}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Config{
		Regions:  []Region{{"us-east", 1}, {"eu-west", 1}},
		Rules:    []byte(testRules),
		Interval: time.Second,
		Logger:   hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Warn}),
		Tracing:  tc,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()

	cc, err := grpc.NewClient(s.Targets()["us-east"][0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	const gwTrace, gwSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(),
		"traceparent", fmt.Sprintf("00-%s-%s-01", gwTrace, gwSpan)), 30*time.Second)
	defer cancel()
	const key = "sk_live_do_not_trace"
	for range 5 {
		if _, err := allotv1.NewAllotClient(cc).Check(ctx, &allotv1.CheckRequest{ApiKey: key}); err != nil {
			t.Fatal(err)
		}
	}

	byName := func(name string) []testenv.OTLPSpan {
		var out []testenv.OTLPSpan
		for _, sp := range col.Spans() {
			if sp.Name == name {
				out = append(out, sp)
			}
		}
		return out
	}
	// A balancer report span whose parent is an enforcer report span, and a publication
	// linked to a recompute.
	var enfReport, balReport, publish testenv.OTLPSpan
	poll.True(t, 60*time.Second, "the report spans of both sides and the leader's publication", func() bool {
		reports := map[string]testenv.OTLPSpan{}
		for _, sp := range byName(tracing.SpanReport) {
			reports[sp.SpanID] = sp
		}
		balReport = testenv.OTLPSpan{}
		for _, sp := range byName(tracing.SpanBalancerReport) {
			if p, ok := reports[sp.ParentSpanID]; ok && sp.Attributes[string(tracing.AttrResult)] == "accepted" {
				enfReport, balReport = p, sp
			}
		}
		recomputes := map[string]bool{}
		for _, sp := range byName(tracing.SpanBalancerRecompute) {
			recomputes[sp.SpanID] = true
		}
		publish = testenv.OTLPSpan{}
		for _, sp := range byName(tracing.SpanBalancerPublish) {
			for _, l := range sp.Links {
				if recomputes[l] {
					publish = sp
				}
			}
		}
		return balReport.Name != "" && publish.Name != ""
	})

	checks := byName(tracing.SpanCheck)
	if len(checks) != 5 {
		t.Fatalf("%d check spans, want 5", len(checks))
	}
	for _, c := range checks {
		if c.TraceID != gwTrace || c.ParentSpanID != gwSpan || c.Kind != otlptrace.Span_SPAN_KIND_SERVER {
			t.Fatalf("check span in trace %s under %s (kind %v), want the gateway's %s under %s", c.TraceID, c.ParentSpanID, c.Kind, gwTrace, gwSpan)
		}
		if c.Resource["service.name"] != "allot-enforcer" || c.Resource["allot.region"] != "us-east" ||
			c.Resource["service.instance.id"] != "us-east-1" || c.Resource["deployment.environment"] != "test" {
			t.Fatalf("check span's resource %v", c.Resource)
		}
		if c.Attributes[string(tracing.AttrRule)] != "default" || c.Attributes[string(tracing.AttrVerdict)] != "allowed" ||
			c.Attributes[string(tracing.AttrSource)] != "memory" || c.Attributes[string(tracing.AttrIdentityDigest)] == "" {
			t.Fatalf("check span's attributes %v", c.Attributes)
		}
	}
	for _, sp := range col.Spans() {
		for k, v := range sp.Attributes {
			if strings.Contains(v, key) {
				t.Fatalf("span %s carries the API key in %s", sp.Name, k)
			}
		}
	}

	if enfReport.Resource["service.name"] != "allot-enforcer" || balReport.Resource["service.name"] != "allot-balancer" {
		t.Fatalf("report spans from %q and %q, want allot-enforcer and allot-balancer", enfReport.Resource["service.name"], balReport.Resource["service.name"])
	}
	if balReport.TraceID != enfReport.TraceID || balReport.Kind != otlptrace.Span_SPAN_KIND_SERVER || enfReport.Kind != otlptrace.Span_SPAN_KIND_CLIENT {
		t.Fatalf("balancer report span in trace %s (kind %v), enforcer's in %s (kind %v)", balReport.TraceID, balReport.Kind, enfReport.TraceID, enfReport.Kind)
	}
	for _, k := range []string{string(tracing.AttrRegion), string(tracing.AttrEnforcerID), string(tracing.AttrSeq)} {
		if enfReport.Attributes[k] == "" || enfReport.Attributes[k] != balReport.Attributes[k] {
			t.Fatalf("%s: enforcer's %q, balancer's %q", k, enfReport.Attributes[k], balReport.Attributes[k])
		}
	}
	if enfReport.Attributes[string(tracing.AttrResult)] != "sent" {
		t.Fatalf("enforcer report span's attributes %v", enfReport.Attributes)
	}
	if publish.Resource["service.name"] != "allot-balancer" || publish.Attributes[string(tracing.AttrResult)] != "ok" {
		t.Fatalf("publication span: resource %v attributes %v", publish.Resource, publish.Attributes)
	}
}
