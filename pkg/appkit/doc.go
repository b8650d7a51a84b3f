// Package appkit is the shell the two allot server processes — the enforcer
// (pkg/enforcer/app) and the balancer (pkg/balancer/app) — share around what they serve:
// their gRPC and HTTP servers (bound before they serve, so the addresses are known, and
// drained within one bound at shutdown), the HTTP server's limits against slow clients,
// the etcd client as both dial it, the Prometheus registry, OpenTelemetry tracing as the
// standard OTEL_* variables configure it (the tracer provider and its OTLP exporter,
// started and shut down within a bound; off unless an exporter is configured), and, for
// their commands, the logger and the run until SIGINT or SIGTERM (SIGHUP reloads).
//
// Configuration is not here: pkg/cliconf reads it (defaults, file, environment, flags),
// and needs no network. What each process serves, and in which order it builds and
// closes its parts, stays in its own app package.
package appkit
