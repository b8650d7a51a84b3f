package app

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/pkg/appkit"
)

// The debug listener (listen.debug; envoyproxy/ratelimit's DEBUG_HOST:DEBUG_PORT): their
// operators' port-forwards and scrapes keep working. It serves net/http/pprof under
// /debug/pprof/ and the metrics on /metrics, nothing else; it is off unless configured,
// as profiles reveal internals.

// debugServer is the debug listener's server, bound by New, served by Run, closed by
// Close (after which its goroutine has returned: it is one of a.wg's).
type debugServer struct {
	srv *http.Server
	l   net.Listener
}

// listenDebug binds the debug listener when listen.debug is set.
func (a *App) listenDebug() error {
	addr := a.cfg.Listen.Debug
	if addr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("app: debug listen %s: %w", addr, err)
	}
	limits := appkit.DefaultHTTPLimits
	limits.Write = 0 // a CPU profile or trace takes as long as it is asked to
	a.debug = &debugServer{srv: appkit.NewHTTPServer(mux, limits), l: l}
	return nil
}

// serveDebug serves the debug listener in a goroutine of a.wg.
func (a *App) serveDebug() {
	if a.debug == nil {
		return
	}
	a.wg.Go(func() {
		if err := a.debug.srv.Serve(a.debug.l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Warn("debug listener stopped", "error", err)
		}
	})
}

// closeDebug closes the debug listener and its connections (a profile in progress is cut).
func (a *App) closeDebug() {
	if a.debug != nil {
		a.debug.srv.Close()
		a.debug.l.Close()
	}
}

// DebugAddr is the bound debug address ("" when not listening).
func (a *App) DebugAddr() string {
	if a.debug == nil {
		return ""
	}
	return a.debug.l.Addr().String()
}
