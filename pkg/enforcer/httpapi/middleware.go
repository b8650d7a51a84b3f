package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
)

// AttrsFunc tells what a request is, for the rules: the gateway's own knowledge (the
// route template, the key's plan and org after authentication).
type AttrsFunc func(r *http.Request) rules.Attrs

// DefaultAttrs takes the API key from X-Api-Key, the client address from the connection
// (r.RemoteAddr; put a trusted proxy's header in your own AttrsFunc) and the endpoint
// from the method and path ("GET /v1/items/42": pass route templates in your own
// AttrsFunc to share buckets across ids).
func DefaultAttrs(r *http.Request) rules.Attrs {
	a := rules.Attrs{APIKey: r.Header.Get("X-Api-Key"), Endpoint: r.Method + " " + r.URL.Path}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil {
			a.IP = ip.Unmap()
		}
	}
	return a
}

// Middleware is allot as a library in a Go gateway: it checks every request with e
// before next. An allowed request gets the RateLimit header fields on its response; a
// refused one gets 429 with them, Retry-After and X-RateLimit-Rule, and never reaches
// next. Input over e's limits is 400. A check cut short because the client went away is
// answered 503 and not passed on. attrs nil means DefaultAttrs. Safe for concurrent use.
//
// A check that holds in-flight slots (rules with an in-flight limit) releases them when
// next returns, or panics: a release that fails (the store unreachable) is not retried,
// and the slots come back at their limit's timeout.
func Middleware(e *enforcer.Enforcer, attrs AttrsFunc, next http.Handler) http.Handler {
	if attrs == nil {
		attrs = DefaultAttrs
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := enforcer.Request{Attrs: attrs(r)}
		d, ok := checkAndHeaders(r.Context(), e, w, &req)
		if !ok {
			return
		}
		if d.Handle != "" {
			defer func() { _ = e.Release(context.WithoutCancel(r.Context()), d.Handle) }()
		}
		next.ServeHTTP(w, r)
	})
}

// checkAndHeaders checks req and writes the answer's header fields; a refusal or an error
// is answered here (ok false).
func checkAndHeaders(ctx context.Context, e *enforcer.Enforcer, w http.ResponseWriter, req *enforcer.Request) (enforcer.Decision, bool) {
	d, err := e.Check(ctx, req)
	switch {
	case errors.Is(err, enforcer.ErrInvalid):
		http.Error(w, err.Error(), http.StatusBadRequest)
		return d, false
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return d, false
	}
	setHeaders(w.Header(), &d)
	if !d.Allowed {
		http.Error(w, "rate limited by rule "+d.Rule, http.StatusTooManyRequests)
		return d, false
	}
	return d, true
}
