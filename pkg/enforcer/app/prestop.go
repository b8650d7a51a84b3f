package app

import (
	"errors"
	"fmt"
	"time"
)

// ErrStopping is Ready's answer during the pre-stop delay: /readyz 503, so that load
// balancers take this enforcer out of rotation while it still answers every check.
var ErrStopping = errors.New("app: stopping: the pre-stop delay before the drain (checks are still answered)")

// A rolling restart that drops no check (issue 24 §4) takes three steps, in this order:
//
//  1. Before: gRPC connections do not live for ever (listen.max_connection_age, a GOAWAY
//     with ±10% jitter), so the clients' load balancing keeps spreading checks over the
//     enforcers that exist now, including those started since a client connected.
//  2. On SIGINT or SIGTERM, the pre-stop delay (shutdown.pre_stop_delay): /readyz fails
//     and the gRPC health service says NOT_SERVING, while the listeners stay open and
//     every check is answered, on old connections and new ones. A load balancer that
//     learns late that this instance is going (Kubernetes endpoints, Envoy's EDS, a
//     readiness probe's period) sends it checks meanwhile, and they are answered.
//  3. The drain that Close does (drain_timeout): listeners closed, a GOAWAY on every
//     connection, the calls in flight finished, then what is left cut.
//
// A client that handles GOAWAY as HTTP/2 means it (grpc-go, Envoy) sends no new call on
// a connection being drained and retries on another one a call the server refused
// unprocessed, so neither the age nor the drain costs it a check.

// preStop waits out the pre-stop delay, if any, with readiness failed: until the delay
// has passed on the app's clock, a server fails (its error is returned), or Close is
// called.
func (a *App) preStop(errc <-chan error) error {
	d := a.cfg.Shutdown.PreStopDelay
	if d <= 0 {
		return nil
	}
	a.stopping.Store(true)
	a.health.Shutdown() // NOT_SERVING from now on, for every service
	a.log.Info("stopping: pre-stop delay, /readyz fails while checks are answered", "pre-stop-delay", d,
		"drain-timeout", a.cfg.DrainTimeout)
	t := a.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case err := <-errc:
		return fmt.Errorf("app: %w", err)
	case <-a.closed:
		return nil
	}
}

// maxConnectionAgeGrace is listen.max_connection_age_grace, or drain_timeout when unset.
func (c *Config) maxConnectionAgeGrace() time.Duration {
	if c.Listen.MaxConnectionAgeGrace > 0 {
		return c.Listen.MaxConnectionAgeGrace
	}
	return c.DrainTimeout
}
