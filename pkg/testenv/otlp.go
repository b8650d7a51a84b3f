package testenv

import (
	"context"
	"encoding/hex"
	"net"
	"strconv"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// OTLP is an OpenTelemetry collector's trace service (OTLP over gRPC) in the test's own
// process, on 127.0.0.1: it keeps every span it is sent. It needs no Docker. It stops at
// the test's cleanup; its methods are safe for concurrent use.
type OTLP struct {
	coltracepb.UnimplementedTraceServiceServer

	addr string
	srv  *grpc.Server

	mu    sync.Mutex // mu guards spans
	spans []OTLPSpan
}

// OTLPSpan is one span as the receiver got it, its ids in hex and its attributes' values
// as strings (a string as is, numbers and booleans formatted).
type OTLPSpan struct {
	Resource     map[string]string // the resource's attributes (service.name, ...)
	Scope        string            // the instrumentation scope (the tracer's name)
	Name         string
	Kind         tracepb.Span_SpanKind
	TraceID      string
	SpanID       string
	ParentSpanID string // "" for a root span
	Attributes   map[string]string
	Links        []string // each linked span's id
	Error        bool     // status code error
	StatusMsg    string
}

// StartOTLP starts a receiver on a free loopback port.
func StartOTLP(t testing.TB) *OTLP {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: otlp: %v", err)
	}
	o := &OTLP{addr: lis.Addr().String(), srv: grpc.NewServer()}
	coltracepb.RegisterTraceServiceServer(o.srv, o)
	done := make(chan struct{})
	go func() { defer close(done); _ = o.srv.Serve(lis) }()
	t.Cleanup(func() { o.srv.Stop(); <-done })
	return o
}

// Endpoint is the receiver's address as OTEL_EXPORTER_OTLP_ENDPOINT names it (plaintext).
func (o *OTLP) Endpoint() string { return "http://" + o.addr }

// Spans returns a copy of every span received so far, in the order received.
func (o *OTLP) Spans() []OTLPSpan {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]OTLPSpan(nil), o.spans...)
}

// Export implements the OTLP trace service.
func (o *OTLP) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	var got []OTLPSpan
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := OTLPSpan{Resource: res, Scope: ss.GetScope().GetName(), Name: s.GetName(), Kind: s.GetKind(),
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Attributes: attrs(s.GetAttributes()),
					Error:     s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
					StatusMsg: s.GetStatus().GetMessage()}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, hex.EncodeToString(l.GetSpanId()))
				}
				got = append(got, sp)
			}
		}
	}
	o.mu.Lock()
	o.spans = append(o.spans, got...)
	o.mu.Unlock()
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}
