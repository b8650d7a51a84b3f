package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer/httpapi"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/redis/go-redis/v9"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ErrClosed is returned by Run and Reload after Close.
var ErrClosed = errors.New("app: closed")

// Run serves gRPC and HTTP, keeps the rules sources running, and returns when ctx ends
// or a server fails, after a graceful Close (whose error it joins).
func (a *App) Run(ctx context.Context) error {
	a.mu.Lock()
	switch {
	case a.isClosed():
		a.mu.Unlock()
		return ErrClosed
	case a.serving:
		a.mu.Unlock()
		return errors.New("app: Run called twice")
	}
	a.serving = true
	src := a.etcdSrc
	a.mu.Unlock()

	errc := a.srv.Serve(&a.wg)
	a.serveDebug()
	if a.file != nil {
		a.wg.Go(func() { a.file.Run(a.ctx) })
	}
	if src != nil {
		a.wg.Go(func() { src.Run(a.ctx) })
	}
	if a.sharesW != nil {
		if err := a.sharesW.Start(); err != nil { // only after Close, which Run checked
			a.log.Error("shares watch not started", "error", err)
		}
	}
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	a.log.Info("serving", "region", a.cfg.Region, "id", a.cfg.ID, "grpc", a.GRPCAddr(), "http", a.HTTPAddr(),
		"store", a.cfg.Store.Kind, "peers", a.peers(), "rules", a.holder.Current().Version())

	var err error
	select {
	case <-ctx.Done():
		err = a.preStop(errc) // /readyz fails, checks are answered, for shutdown.pre_stop_delay
	case err = <-errc:
		err = fmt.Errorf("app: %w", err)
	case <-a.closed:
	}
	return errors.Join(err, a.Close())
}

func (a *App) isClosed() bool {
	select {
	case <-a.closed:
		return true
	default:
		return a.ctx.Err() != nil
	}
}

// Reload re-reads the rules file, or the directory of envoyproxy/ratelimit files
// (SIGHUP). A bad file is refused with its error and the rules in force keep serving. With etcd rules layered over a file, the running etcd
// source gets the new base (EtcdSource.SetBase: rebuilt with the etcd rules it already
// knows, no restart, no re-list); with etcd rules alone there is nothing to reload.
func (a *App) Reload() error {
	if a.isClosed() {
		return ErrClosed
	}
	if a.file != nil {
		return a.file.Reload()
	}
	if a.base == "" {
		a.log.Info("reload: rules come from etcd only; nothing to reload")
		return nil
	}
	set, err := loadBase(a.base)
	if err != nil {
		a.onRulesError(err)
		return err
	}
	a.mu.Lock()
	src := a.etcdSrc
	a.mu.Unlock()
	if src == nil {
		return ErrClosed
	}
	if err := src.SetBase(set); err != nil {
		return fmt.Errorf("app: reload: %w", err)
	}
	return nil
}

// loadBase reads and validates the file etcd rules are layered over.
func loadBase(path string) (*rules.Set, error) {
	set, err := rules.LoadFile(path)
	if err != nil {
		return nil, fmt.Errorf("app: base rules file: %w", err)
	}
	if err := set.Validate(); err != nil {
		return nil, fmt.Errorf("app: base rules file: %w", err)
	}
	return set, nil
}

// refusedErr names the etcd rules refused now (each serving its previous version, or
// nothing): a degraded part /readyz shows, as allot_rules_refused does.
func refusedErr(refused []rules.RefusedRule) error {
	if len(refused) == 0 {
		return nil
	}
	parts := make([]string, 0, len(refused))
	for _, r := range refused {
		kept := "not applied"
		if r.Kept {
			kept = "its previous version applies"
		}
		parts = append(parts, fmt.Sprintf("%s (%s): %v", r.Key, kept, r.Err))
	}
	return fmt.Errorf("rules: %d etcd rule(s) refused, the others apply: %s", len(refused), strings.Join(parts, "; "))
}

// readyTimeout bounds the store ping /readyz makes.
const readyTimeout = 250 * time.Millisecond

// Ready is /readyz. It fails (503) when this enforcer is stopping (the pre-stop delay,
// ErrStopping) or cannot answer checks as configured: closed, or no rules loaded from
// etcd yet. A Redis shard or etcd being
// unreachable does not make it unready — the fallback layer answers those checks, and
// taking every enforcer of a region out of rotation at once would turn a Redis outage into
// an API outage (P2) — so those come back wrapped in httpapi.ErrDegraded: 200, naming
// every degraded part.
func (a *App) Ready() error {
	if a.isClosed() {
		return ErrClosed
	}
	if a.stopping.Load() {
		return ErrStopping
	}
	if a.xds != nil && !a.xds.loaded() {
		return errNoXDSRules
	}
	a.mu.Lock()
	src := a.etcdSrc
	a.mu.Unlock()
	if src != nil && a.base == "" {
		if st := src.Status(); st.Loads == 0 {
			return fmt.Errorf("rules: none loaded from etcd yet (last error: %v)", st.LastError)
		}
	}
	var errs []error
	if a.node != nil && !a.node.Shares().Loaded() {
		errs = append(errs, errors.New("shares: not loaded from etcd yet; every identity enforces min(default share, shares.floor)"))
	}
	if src != nil {
		if err := refusedErr(src.Status().Refused); err != nil {
			errs = append(errs, err)
		}
	}
	if a.registry != nil {
		if err := a.registry.Healthy(); err != nil {
			errs = append(errs, err) // its errors say "registry: …" already
		}
	}
	if a.redis != nil {
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		var err error
		if c, ok := a.redis.(*redis.ClusterClient); ok {
			err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() })
		} else {
			err = a.redis.Ping(ctx).Err()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("store: %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", httpapi.ErrDegraded, errors.Join(errs...))
	}
	return nil
}

// Close shuts down gracefully: it reports NOT_SERVING, stops accepting, lets in-flight
// checks finish for up to DrainTimeout (then cuts them), releases the etcd registration,
// stops the rules sources, closes the store layers and clients, and last exports the
// queued spans (within the tracing shutdown timeout, 5 s). Idempotent; every call
// returns the first call's result after it has finished.
func (a *App) Close() error {
	a.once.Do(func() {
		defer close(a.closed)
		var errs []error
		a.mu.Lock()
		serving := a.serving
		a.mu.Unlock()
		if a.health != nil {
			a.health.Shutdown()
		}
		a.srv.Drain(a.cfg.DrainTimeout, serving)
		a.closeDebug()
		if a.node != nil {
			// After the drain: a final report tells the balancer this enforcer enforces
			// nothing any more. Before the etcd client it reads the leader with.
			_ = a.node.Leave()
		}
		if a.registry != nil {
			if err := a.registry.Close(); err != nil {
				errs = append(errs, fmt.Errorf("app: while releasing the registration: %w", err))
			}
		}
		a.cancel()
		if a.file != nil {
			a.file.Close()
		}
		a.mu.Lock()
		src := a.etcdSrc
		a.mu.Unlock()
		if src != nil {
			src.Close()
		}
		if a.sharesW != nil {
			_ = a.sharesW.Close() // waits for its goroutine; never fails
		}
		a.wg.Wait()
		if a.node != nil {
			_ = a.node.Close() // the layers' goroutines; the reporter has left
		}
		if a.redisStore != nil {
			_ = a.redisStore.Close() // stops its pipelining goroutines; never fails
		}
		if a.redis != nil {
			if err := a.redis.Close(); err != nil {
				errs = append(errs, fmt.Errorf("app: while closing redis: %w", err))
			}
		}
		if a.etcd != nil {
			if err := a.etcd.Close(); err != nil {
				errs = append(errs, fmt.Errorf("app: while closing etcd: %w", err))
			}
		}
		// Last: the spans of the drained checks and of the final report are exported
		// (bounded by the tracing shutdown timeout). Spans lost to a collector that does
		// not answer are no failure of the enforcer's.
		if err := a.traces.Close(); err != nil {
			a.log.Warn("traces not all exported at shutdown", "error", err)
		}
		a.mu.Lock()
		a.closeErr = errors.Join(errs...)
		a.mu.Unlock()
		a.log.Info("stopped", "region", a.cfg.Region, "id", a.cfg.ID)
	})
	<-a.closed
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closeErr
}
