package appkit

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestTracingFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Tracing // Ratio 1 and ShutdownTimeout 5s are added
	}{
		{"nothing set: off", nil, Tracing{}},
		{"an endpoint: on", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
			Tracing{Enabled: true, Endpoint: "http://c:4317"}},
		{"the traces endpoint wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t:4317"},
			Tracing{Enabled: true, Endpoint: "https://t:4317"}},
		{"otlp, the default endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
			Tracing{Enabled: true, Insecure: true}},
		{"exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, Tracing{}},
		{"SDK disabled", map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "bogus"}, Tracing{}},
		{"off ignores the rest", map[string]string{"OTEL_TRACES_SAMPLER": "bogus", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, Tracing{}},
		{"sampler, resource, batch delay", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "c:4317",
			"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
			"OTEL_TRACES_SAMPLER": "ParentBased_TraceIDRatio", "OTEL_TRACES_SAMPLER_ARG": "0.01",
			"OTEL_SERVICE_NAME": "edge-limiter", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, team=api%20platform",
			"OTEL_BSP_SCHEDULE_DELAY": "200"},
			Tracing{Enabled: true, Endpoint: "c:4317", Insecure: true, Sampler: "parentbased_traceidratio", Ratio: 0.01,
				ServiceName: "edge-limiter", Attributes: []attribute.KeyValue{attribute.String("deployment.environment", "prod"),
					attribute.String("team", "api platform")}, BatchDelay: 200 * time.Millisecond}},
		{"a ratio only for ratio samplers", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "x"},
			Tracing{Enabled: true, Sampler: "always_on"}},
	} {
		got, err := TracingFromEnv(envOf(tc.env))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		want := tc.want
		if want.Ratio == 0 {
			want.Ratio = 1
		}
		want.ShutdownTimeout = 5 * time.Second
		if got.Enabled != want.Enabled || got.Endpoint != want.Endpoint || got.Insecure != want.Insecure ||
			got.Sampler != want.Sampler || got.Ratio != want.Ratio || got.ServiceName != want.ServiceName ||
			got.BatchDelay != want.BatchDelay || got.ShutdownTimeout != want.ShutdownTimeout ||
			len(got.Attributes) != len(want.Attributes) {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, want)
			continue
		}
		for i := range got.Attributes {
			if got.Attributes[i] != want.Attributes[i] {
				t.Errorf("%s: attribute %d %v, want %v", tc.name, i, got.Attributes[i], want.Attributes[i])
			}
		}
	}
}

// TestTracingFromEnvNamesBadValues: a value allot cannot honour is an error naming the
// variable, not a silent default (the SDK would log and sample everything).
func TestTracingFromEnvNamesBadValues(t *testing.T) {
	on := "OTEL_EXPORTER_OTLP_ENDPOINT"
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, `OTEL_TRACES_EXPORTER "zipkin"`},
		{map[string]string{on: "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, `OTEL_EXPORTER_OTLP_PROTOCOL "http/protobuf"`},
		{map[string]string{on: "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL "http/json"`},
		{map[string]string{on: "http://c", "OTEL_TRACES_SAMPLER": "jaeger_remote"}, `OTEL_TRACES_SAMPLER "jaeger_remote"`},
		{map[string]string{on: "http://c", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"}, `OTEL_TRACES_SAMPLER_ARG "1.5"`},
		{map[string]string{on: "http://c", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, `OTEL_TRACES_SAMPLER_ARG "half"`},
		{map[string]string{on: "http://c", "OTEL_RESOURCE_ATTRIBUTES": "a=1,b"}, `OTEL_RESOURCE_ATTRIBUTES: "b"`},
		{map[string]string{on: "http://c", "OTEL_BSP_SCHEDULE_DELAY": "5s"}, `OTEL_BSP_SCHEDULE_DELAY "5s"`},
		{map[string]string{on: "grpc://c:4317"}, `OTLP endpoint "grpc://c:4317"`},
	} {
		_, err := TracingFromEnv(envOf(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want one naming %s", tc.env, err, tc.want)
		}
	}
}

// TestTracingExportsToCollector: spans reach an OTLP collector with the resource the
// process and the environment give (OTEL_SERVICE_NAME over OTEL_RESOURCE_ATTRIBUTES over
// the process's own), and Close exports what is still queued.
func TestTracingExportsToCollector(t *testing.T) {
	col := testenv.StartOTLP(t)
	cfg, err := TracingFromEnv(envOf(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": col.Endpoint(),
		"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,deployment.environment=test,allot.region=eu-west"}))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := StartTracing(cfg, attribute.String("service.name", "allot-enforcer"), attribute.String("allot.region", "us-east"))
	if err != nil {
		t.Fatal(err)
	}
	_, span := tr.Tracer("test").Start(context.Background(), "one", trace.WithAttributes(attribute.Int("n", 7)))
	span.End()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	spans := col.Spans()
	if len(spans) != 1 || spans[0].Name != "one" || spans[0].Attributes["n"] != "7" || spans[0].Scope != "test" {
		t.Fatalf("received %+v", spans)
	}
	if r := spans[0].Resource; r["service.name"] != "from-attrs" || r["deployment.environment"] != "test" ||
		r["allot.region"] != "eu-west" || r["telemetry.sdk.language"] != "go" || r["host.name"] == "" {
		t.Fatalf("resource %v", r)
	}

	// OTEL_SERVICE_NAME wins over both; the sampler is honoured (always_off: nothing).
	cfg.ServiceName = "edge"
	tr, err = StartTracing(cfg, attribute.String("service.name", "allot-enforcer"))
	if err != nil {
		t.Fatal(err)
	}
	_, span = tr.Tracer("test").Start(context.Background(), "two")
	span.End()
	cfg.Sampler = "always_off"
	off, err := StartTracing(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, span = off.Tracer("test").Start(context.Background(), "never")
	span.End()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := off.Close(); err != nil {
		t.Fatal(err)
	}
	spans = col.Spans()
	if len(spans) != 2 || spans[1].Name != "two" || spans[1].Resource["service.name"] != "edge" {
		t.Fatalf("received %+v", spans)
	}
}

// TestTracingOff: off, there is no provider, no tracer and nothing to close.
func TestTracingOff(t *testing.T) {
	tr, err := StartTracing(Tracing{})
	if err != nil || tr != nil {
		t.Fatalf("StartTracing(off) = %v, %v", tr, err)
	}
	if tr.Provider() != nil || tr.Tracer("x") != nil || tr.Close() != nil {
		t.Fatal("a nil *Traces is not off")
	}
}

// TestTracingCloseBounded: with the collector unreachable (a port that accepts and never
// answers, and one that refuses) Close returns within ShutdownTimeout and its grace, with
// the exporter shut down and no goroutine left behind (TestMain's goleak).
func TestTracingCloseBounded(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the kernel's backlog), never speaks
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	for _, addr := range []string{silent.Addr().String(), refused} {
		cfg, err := TracingFromEnv(envOf(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr}))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ShutdownTimeout = 300 * time.Millisecond
		tr, err := StartTracing(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for range 100 {
			_, span := tr.Tracer("test").Start(context.Background(), "lost")
			span.End()
		}
		began := time.Now()
		err = tr.Close() // the spans are lost; the error says so, or not, as the SDK finds out
		took := time.Since(began)
		t.Logf("Close to %s: %v after %v", addr, err, took)
		if took > cfg.ShutdownTimeout+closeGrace {
			t.Fatalf("Close to %s took %v, want at most ShutdownTimeout (300ms) + %v", addr, took, closeGrace)
		}
		select {
		case <-tr.exp.done:
		default:
			t.Fatalf("Close to %s returned before the exporter was shut down", addr)
		}
	}
}
