package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/tracing"
	"github.com/hashicorp/go-hclog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestChecksJoinTheRequestsTrace: a check over HTTP (JSON or forward auth, which sees the
// original request's headers) is a child of the span its traceparent names.
func TestChecksJoinTheRequestsTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	rig := enforcertest.New(t, testRules, func(c *enforcer.Config) { c.Tracer = tp.Tracer("test") })
	srv := httptest.NewServer(Handler(rig.E, Config{}, rig.Reg, nil, hclog.NewNullLogger()))
	defer srv.Close()

	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	req, _ := http.NewRequest("POST", srv.URL+"/v1/check", strings.NewReader(`{"api_key":"k"}`))
	req.Header.Set("traceparent", parent)
	req2, _ := http.NewRequest("GET", srv.URL+"/v1/auth", nil)
	req2.Header.Set("X-Api-Key", "k2")
	req2.Header.Set("traceparent", parent)
	for _, r := range []*http.Request{req, req2} {
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", r.URL.Path, resp.Status)
		}
	}
	n := 0
	for _, s := range rec.Ended() {
		if s.Name() != tracing.SpanCheck {
			continue
		}
		n++
		if got := s.Parent().SpanID().String(); got != "00f067aa0ba902b7" || s.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("check span's parent %s trace %s, want the traceparent's", got, s.SpanContext().TraceID())
		}
	}
	if n != 2 {
		t.Fatalf("%d check spans, want 2", n)
	}
}
