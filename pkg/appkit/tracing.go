package appkit

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Tracing is a process's OpenTelemetry tracing as the standard OTEL_* environment
// variables configure it (TracingFromEnv). Off by default: nothing is exported and no
// span is started unless an exporter is configured. The zero value is off and valid.
//
// Spans go to one OTLP collector over gRPC, in batches: a span is queued and the check
// or report that made it never waits for the export; a full queue drops spans (the
// SDK's OTEL_BSP_MAX_QUEUE_SIZE, 2048), an unreachable collector costs a failed export
// per batch, logged.
type Tracing struct {
	// Enabled: spans are made and exported. TracingFromEnv sets it when
	// OTEL_TRACES_EXPORTER is "otlp", or is unset and an OTLP endpoint is named
	// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT); never with
	// OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true.
	Enabled bool
	// Endpoint is the collector: "http://host:port" (plaintext), "https://host:port"
	// (TLS), or "host:port" (TLS unless Insecure). "": the SDK's default, localhost:4317.
	Endpoint string
	// Insecure: plaintext to an Endpoint given without a scheme, or to the default one
	// (OTEL_EXPORTER_OTLP_TRACES_INSECURE, OTEL_EXPORTER_OTLP_INSECURE).
	Insecure bool
	// Sampler is OTEL_TRACES_SAMPLER: always_on, always_off, traceidratio,
	// parentbased_always_on (the default, ""), parentbased_always_off or
	// parentbased_traceidratio. A parentbased sampler follows the caller's decision when a
	// request carries a traceparent (a gateway's, or a client's passed through).
	Sampler string
	// Ratio is the traceidratio samplers' ratio, OTEL_TRACES_SAMPLER_ARG, in [0, 1].
	// Default 1.
	Ratio float64
	// ServiceName is OTEL_SERVICE_NAME; "": the service.name of Attributes, else the
	// process's own (allot-enforcer, allot-balancer).
	ServiceName string
	// Attributes are OTEL_RESOURCE_ATTRIBUTES (key=value,...; values percent-decoded).
	// They override the process's own resource attributes.
	Attributes []attribute.KeyValue
	// BatchDelay is how long spans wait to be exported in a batch, OTEL_BSP_SCHEDULE_DELAY
	// (milliseconds); 0: the SDK's, 5 s.
	BatchDelay time.Duration
	// ShutdownTimeout bounds Traces.Close: the last spans' export and the exporter's
	// shutdown. Must be > 0 when Enabled. Default 5s.
	ShutdownTimeout time.Duration
}

// The samplers OTEL_TRACES_SAMPLER may name.
var samplers = []string{"always_on", "always_off", "traceidratio", "parentbased_always_on",
	"parentbased_always_off", "parentbased_traceidratio"}

// TracingFromEnv reads the OTEL_* variables getenv (os.Getenv in the commands) holds:
// OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT,
// OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL (grpc only), OTEL_EXPORTER_OTLP_(TRACES_)INSECURE,
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES and OTEL_BSP_SCHEDULE_DELAY. An error names the variable and
// its value. The exporter's other variables (OTEL_EXPORTER_OTLP_HEADERS, _CERTIFICATE,
// _COMPRESSION, _TIMEOUT and their TRACES_ forms) and the batch processor's other
// OTEL_BSP_* are read by the OpenTelemetry SDK itself.
func TracingFromEnv(getenv func(string) string) (Tracing, error) {
	t := Tracing{Ratio: 1, ShutdownTimeout: 5 * time.Second}
	env := func(k string) string { return strings.TrimSpace(getenv(k)) }
	either := func(k string) (string, string) { // the TRACES_ form first
		if v := env(strings.Replace(k, "OTLP_", "OTLP_TRACES_", 1)); v != "" {
			return strings.Replace(k, "OTLP_", "OTLP_TRACES_", 1), v
		}
		return k, env(k)
	}
	if strings.EqualFold(env("OTEL_SDK_DISABLED"), "true") {
		return t, nil
	}
	_, t.Endpoint = either("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch exp := strings.ToLower(env("OTEL_TRACES_EXPORTER")); exp {
	case "none":
	case "otlp":
		t.Enabled = true
	case "":
		t.Enabled = t.Endpoint != ""
	default:
		return Tracing{}, fmt.Errorf("appkit: OTEL_TRACES_EXPORTER %q: allot exports traces over OTLP only (otlp or none)", exp)
	}
	if !t.Enabled {
		return Tracing{Ratio: 1, ShutdownTimeout: t.ShutdownTimeout}, nil
	}
	if k, p := either("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "grpc" {
		return Tracing{}, fmt.Errorf("appkit: %s %q: allot exports OTLP over gRPC only (grpc)", k, p)
	}
	_, insecure := either("OTEL_EXPORTER_OTLP_INSECURE")
	t.Insecure = strings.EqualFold(insecure, "true")
	t.Sampler = strings.ToLower(env("OTEL_TRACES_SAMPLER"))
	if arg := env("OTEL_TRACES_SAMPLER_ARG"); arg != "" && strings.HasSuffix(t.Sampler, "traceidratio") {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return Tracing{}, fmt.Errorf("appkit: OTEL_TRACES_SAMPLER_ARG %q: want a ratio in [0, 1]", arg)
		}
		t.Ratio = r
	}
	t.ServiceName = env("OTEL_SERVICE_NAME")
	if v := env("OTEL_RESOURCE_ATTRIBUTES"); v != "" {
		for _, pair := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(pair, "=")
			k = strings.TrimSpace(k)
			dec, err := url.PathUnescape(strings.TrimSpace(val))
			if !ok || k == "" || err != nil {
				return Tracing{}, fmt.Errorf("appkit: OTEL_RESOURCE_ATTRIBUTES: %q: want key=value pairs, values percent-encoded", pair)
			}
			t.Attributes = append(t.Attributes, attribute.String(k, dec))
		}
	}
	if v := env("OTEL_BSP_SCHEDULE_DELAY"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 || ms > 3600_000 {
			return Tracing{}, fmt.Errorf("appkit: OTEL_BSP_SCHEDULE_DELAY %q: want milliseconds in [0, 3600000]", v)
		}
		t.BatchDelay = time.Duration(ms) * time.Millisecond
	}
	return t, t.Validate()
}

// Validate names the first bad field (off is always valid).
func (t Tracing) Validate() error {
	if !t.Enabled {
		return nil
	}
	if t.Sampler != "" && !contains(samplers, t.Sampler) {
		return fmt.Errorf("appkit: OTEL_TRACES_SAMPLER %q: want one of %s", t.Sampler, strings.Join(samplers, ", "))
	}
	if !(t.Ratio >= 0 && t.Ratio <= 1) {
		return fmt.Errorf("appkit: tracing: sampler ratio %v, must be in [0, 1]", t.Ratio)
	}
	if strings.Contains(t.Endpoint, "://") {
		u, err := url.Parse(t.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("appkit: OTLP endpoint %q: want http://host:port, https://host:port or host:port", t.Endpoint)
		}
	}
	if t.BatchDelay < 0 {
		return fmt.Errorf("appkit: tracing: batch delay %v, must be >= 0", t.BatchDelay)
	}
	if t.ShutdownTimeout <= 0 {
		return fmt.Errorf("appkit: tracing: shutdown timeout %v, must be > 0", t.ShutdownTimeout)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// sampler is the SDK's sampler of t.Sampler and t.Ratio.
func (t Tracing) sampler() sdktrace.Sampler {
	ratio := sdktrace.TraceIDRatioBased(t.Ratio)
	switch t.Sampler {
	case "always_on":
		return sdktrace.AlwaysSample()
	case "always_off":
		return sdktrace.NeverSample()
	case "traceidratio":
		return ratio
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample())
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(ratio)
	}
	return sdktrace.ParentBased(sdktrace.AlwaysSample())
}

// Traces is a process's tracer provider, started by StartTracing: the one place its spans
// are recorded and exported. A nil *Traces is tracing off: Provider and Tracer return
// nil, Close does nothing. Safe for concurrent use; Close is idempotent.
type Traces struct {
	tp      *sdktrace.TracerProvider
	exp     *abortable
	timeout time.Duration
	once    sync.Once
	err     error
}

// abortable is the OTLP exporter as the batch processor sees it: Close's deadline aborts
// the export in flight and the ones after it (the processor exports what is queued before
// it shuts the exporter down, each up to the exporter's own timeout, 10 s by default:
// without this, its goroutine would outlive Close by that much per batch).
type abortable struct {
	sdktrace.SpanExporter
	stop  context.Context // cancelled at Close's deadline
	abort context.CancelFunc
	once  sync.Once
	done  chan struct{} // closed when Shutdown has returned
}

func (a *abortable) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(a.stop, cancel)()
	return a.SpanExporter.ExportSpans(ctx, spans)
}

func (a *abortable) Shutdown(ctx context.Context) error {
	defer a.once.Do(func() { close(a.done) })
	return a.SpanExporter.Shutdown(ctx)
}

// StartTracing starts t's tracer provider, with the resource attributes the process gives
// (service.name first: "allot-enforcer"), then t.Attributes, then t.ServiceName, each
// overriding the ones before, and host.name. It returns nil when t is off. It does not
// connect: the first export does, and an unreachable collector is no error here.
func StartTracing(t Tracing, res ...attribute.KeyValue) (*Traces, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if !t.Enabled {
		return nil, nil
	}
	ctx := context.Background()
	attrs := append(append([]attribute.KeyValue(nil), res...), t.Attributes...)
	if t.ServiceName != "" {
		attrs = append(attrs, attribute.String("service.name", t.ServiceName))
	}
	r, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithHost(), resource.WithAttributes(attrs...))
	if err != nil {
		return nil, fmt.Errorf("appkit: tracing resource: %w", err)
	}
	var opts []otlptracegrpc.Option
	switch {
	case strings.Contains(t.Endpoint, "://"):
		opts = append(opts, otlptracegrpc.WithEndpointURL(t.Endpoint))
	case t.Endpoint != "":
		opts = append(opts, otlptracegrpc.WithEndpoint(t.Endpoint))
	}
	if t.Insecure && !strings.Contains(t.Endpoint, "://") {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	otlp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("appkit: OTLP exporter: %w", err)
	}
	exp := &abortable{SpanExporter: otlp, done: make(chan struct{})}
	exp.stop, exp.abort = context.WithCancel(context.Background())
	var bopts []sdktrace.BatchSpanProcessorOption
	if t.BatchDelay > 0 {
		bopts = append(bopts, sdktrace.WithBatchTimeout(t.BatchDelay))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, bopts...), sdktrace.WithResource(r),
		sdktrace.WithSampler(t.sampler()))
	return &Traces{tp: tp, exp: exp, timeout: t.ShutdownTimeout}, nil
}

// Provider is the tracer provider to hand the parts that make spans (node.Deps.Tracing,
// balancer.ServiceConfig.Tracer); nil when tracing is off.
func (t *Traces) Provider() trace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.tp
}

// Tracer is Provider().Tracer(name), or nil when tracing is off.
func (t *Traces) Tracer(name string) trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tp.Tracer(name)
}

// closeGrace is how long Close waits, past ShutdownTimeout, for the batch processor to
// shut the exporter down once its exports were aborted (they return at once).
const closeGrace = time.Second

// Close exports the spans still queued and shuts the exporter down, within
// Tracing.ShutdownTimeout whether the collector answers or not: at the deadline the
// exports in flight are aborted and the spans not exported are lost. It then waits (at
// most a second more) for the SDK's goroutine to close the exporter's connection. Call it
// last, after the parts that make spans have stopped. Idempotent: every call returns the
// first's result.
func (t *Traces) Close() error {
	if t == nil {
		return nil
	}
	t.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
		defer cancel()
		defer context.AfterFunc(ctx, t.exp.abort)()
		if err := t.tp.Shutdown(ctx); err != nil {
			t.err = fmt.Errorf("appkit: while flushing traces: %w", err)
		}
		t.exp.abort()
		grace := time.NewTimer(closeGrace)
		defer grace.Stop()
		select {
		case <-t.exp.done:
		case <-grace.C:
		}
	})
	return t.err
}

// LogOTelErrors sends what OpenTelemetry's SDK reports (an export that failed: the
// collector unreachable, a span dropped) to log at warn level, instead of the standard
// library's logger. It sets the SDK's process-wide handler: commands call it, once.
func LogOTelErrors(log hclog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		if !errors.Is(err, context.Canceled) {
			log.Warn("tracing", "error", err)
		}
	}))
}
