// Package httpapi serves the enforcer over HTTP:
//
//	POST /v1/check   JSON in, JSON out: 200 when allowed, 429 when refused (both with a body)
//	ANY  /v1/auth    forward auth from request headers (nginx auth_request, Traefik
//	                 forwardAuth): 200 or Config.RefuseStatus (429), empty body
//	GET  /metrics    Prometheus metrics of the injected registry
//	GET  /healthz    200 while the process serves
//	GET  /readyz     200 when the Ready check passes (rules loaded, registry, store), else 503
//
// Every check answer carries the IETF RateLimit header fields (see enforcer.HeaderRateLimit)
// when a rule decided, and a refusal adds Retry-After and X-RateLimit-Rule. Invalid input
// is 400 with a message naming the field.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MaxBodyBytes bounds a POST /v1/check body.
const MaxBodyBytes = 8 << 10

// Config names the headers the forward-auth endpoint reads and how it answers. The zero
// value is usable: empty fields take the defaults of DefaultConfig.
type Config struct {
	// APIKeyHeader carries the API key. Default "X-Api-Key".
	APIKeyHeader string
	// PlanHeader and OrgHeader carry plan and org, when the gateway knows them.
	// Defaults "X-Plan", "X-Org".
	PlanHeader, OrgHeader string
	// EndpointHeader, when present on a request, is the endpoint as is ("GET /v1/search");
	// otherwise the endpoint is "<method> <path>" from MethodHeaders and URIHeaders (the
	// query string dropped). Default "X-Endpoint".
	EndpointHeader string
	// MethodHeaders and URIHeaders are tried in order. Defaults: X-Forwarded-Method,
	// X-Original-Method; X-Forwarded-Uri, X-Original-URI.
	MethodHeaders, URIHeaders []string
	// RealIPHeader, when present, is the client address. Default "X-Real-IP".
	RealIPHeader string
	// ForwardedForHeader is used when RealIPHeader is absent: the address TrustedHops
	// entries from the right (1: the last one, the address the gateway itself saw and
	// appended; clients control the entries to its left). Default "X-Forwarded-For", 1.
	ForwardedForHeader string
	TrustedHops        int
	// HitsHeader, when present, is the hits of the check. Default "X-RateLimit-Hits".
	HitsHeader string
	// RefuseStatus is the status of a refused forward-auth check. Default 429. nginx's
	// auth_request accepts only 2xx, 401 and 403 from its subrequest: use 403 there and map
	// it back to 429 with error_page (see README).
	RefuseStatus int
}

// DefaultConfig returns the defaults described on Config's fields.
func DefaultConfig() Config {
	return Config{
		APIKeyHeader:       "X-Api-Key",
		PlanHeader:         "X-Plan",
		OrgHeader:          "X-Org",
		EndpointHeader:     "X-Endpoint",
		MethodHeaders:      []string{"X-Forwarded-Method", "X-Original-Method"},
		URIHeaders:         []string{"X-Forwarded-Uri", "X-Original-URI"},
		RealIPHeader:       "X-Real-IP",
		ForwardedForHeader: "X-Forwarded-For",
		TrustedHops:        1,
		HitsHeader:         "X-RateLimit-Hits",
		RefuseStatus:       http.StatusTooManyRequests,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	set := func(v *string, def string) {
		if *v == "" {
			*v = def
		}
	}
	set(&c.APIKeyHeader, d.APIKeyHeader)
	set(&c.PlanHeader, d.PlanHeader)
	set(&c.OrgHeader, d.OrgHeader)
	set(&c.EndpointHeader, d.EndpointHeader)
	set(&c.RealIPHeader, d.RealIPHeader)
	set(&c.ForwardedForHeader, d.ForwardedForHeader)
	set(&c.HitsHeader, d.HitsHeader)
	if c.MethodHeaders == nil {
		c.MethodHeaders = d.MethodHeaders
	}
	if c.URIHeaders == nil {
		c.URIHeaders = d.URIHeaders
	}
	if c.TrustedHops < 1 {
		c.TrustedHops = d.TrustedHops
	}
	if c.RefuseStatus == 0 {
		c.RefuseStatus = d.RefuseStatus
	}
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if s := c.RefuseStatus; s != 0 && (s < 400 || s > 599) {
		return fmt.Errorf("httpapi: refuse status %d, must be a 4xx or 5xx code", s)
	}
	if c.TrustedHops < 0 || c.TrustedHops > 16 {
		return fmt.Errorf("httpapi: trusted hops %d, must be in [0, 16]", c.TrustedHops)
	}
	return nil
}

// Handler serves the endpoints above. ready reports readiness for /readyz (nil: ready);
// gatherer serves /metrics (normally the registry the enforcer registered with).
// It is safe for concurrent use.
// ErrDegraded marks a readiness error that must not take the process out of rotation: the
// enforcer still answers every check (a Redis shard or etcd being down is what the fallback
// layer is for, P2), so /readyz answers 200 and names what is degraded. Any other error
// from the ready function answers 503.
var ErrDegraded = errors.New("degraded")

func Handler(e *enforcer.Enforcer, cfg Config, gatherer prometheus.Gatherer, ready func() error, log hclog.Logger) http.Handler {
	cfg = cfg.withDefaults()
	if log == nil {
		log = hclog.NewNullLogger()
	}
	h := &handler{e: e, cfg: cfg, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", h.check)
	mux.HandleFunc("/v1/auth", h.auth)
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ready != nil {
			if err := ready(); errors.Is(err, ErrDegraded) {
				io.WriteString(w, "ready, "+err.Error()+"\n")
				return
			} else if err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, "not ready: "+err.Error()+"\n")
				return
			}
		}
		io.WriteString(w, "ready\n")
	})
	return recoverer(mux, log)
}

type handler struct {
	e   *enforcer.Enforcer
	cfg Config
	log hclog.Logger
}

// CheckRequest is the body of POST /v1/check. Unknown fields are an error.
type CheckRequest struct {
	APIKey   string `json:"api_key"`
	Plan     string `json:"plan"`
	Org      string `json:"org"`
	Endpoint string `json:"endpoint"`
	IP       string `json:"ip"`
	Hits     int64  `json:"hits"`
}

// CheckResponse is the body POST /v1/check answers with.
type CheckResponse struct {
	Allowed       bool     `json:"allowed"`
	Rule          string   `json:"rule,omitempty"`
	Limit         string   `json:"limit,omitempty"`
	Quota         int64    `json:"quota,omitempty"`
	WindowSeconds int64    `json:"window_seconds,omitempty"`
	Remaining     int64    `json:"remaining"`
	ResetMs       int64    `json:"reset_ms"`
	RetryAfterMs  int64    `json:"retry_after_ms,omitempty"`
	Source        string   `json:"source"`
	CountedBy     string   `json:"counted_by,omitempty"`
	ShadowRefused []string `json:"shadow_refused,omitempty"`
}

// ErrorResponse is the body of a 400.
type ErrorResponse struct {
	Error string `json:"error"`
}

// DecodeCheck parses a POST /v1/check body into a check. Errors wrap enforcer.ErrInvalid.
func DecodeCheck(body io.Reader, r *enforcer.Request) error {
	var buf [512]byte // the usual body fits: no allocation to read it
	b, err := readBody(body, buf[:0])
	if err != nil {
		return fmt.Errorf("%w: body: %v", enforcer.ErrInvalid, err)
	}
	if err := strictBody(b); err != nil {
		return fmt.Errorf("%w: body: %v", enforcer.ErrInvalid, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var in CheckRequest
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("%w: body: %v", enforcer.ErrInvalid, err)
	}
	if rest := bytes.TrimSpace(b[dec.InputOffset():]); len(rest) > 0 {
		return fmt.Errorf("%w: body: more than one JSON value (%.32q follows the object)", enforcer.ErrInvalid, rest)
	}
	*r = enforcer.Request{Hits: in.Hits}
	r.Attrs.APIKey, r.Attrs.Plan, r.Attrs.Org, r.Attrs.Endpoint = in.APIKey, in.Plan, in.Org, in.Endpoint
	if in.IP != "" {
		ip, err := netip.ParseAddr(in.IP)
		if err != nil {
			return fmt.Errorf("%w: ip %.64q is not an IP address", enforcer.ErrInvalid, in.IP)
		}
		r.Attrs.IP = ip.Unmap()
	}
	return nil
}

func (h *handler) check(w http.ResponseWriter, req *http.Request) {
	var r enforcer.Request
	err := DecodeCheck(http.MaxBytesReader(w, req.Body, MaxBodyBytes), &r)
	if err == nil {
		err = h.e.Validate(&r)
	}
	if err != nil {
		h.e.CountInvalid(enforcer.APIHTTPCheck)
		writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: err.Error()})
		return
	}
	d, err := h.e.Check(req.Context(), &r)
	if err != nil {
		h.checkError(w, err)
		return
	}
	setHeaders(w.Header(), &d)
	resp := CheckResponse{
		Allowed: d.Allowed, Rule: d.Rule, Limit: d.Limit, Quota: d.Quota, WindowSeconds: d.Window,
		Remaining: d.Remaining, ResetMs: d.Reset.Milliseconds(), RetryAfterMs: d.RetryAfter.Milliseconds(),
		Source: d.Source.String(), CountedBy: d.CountedBy,
	}
	if d.ShadowRefusedCount() > 0 {
		resp.ShadowRefused = append([]string(nil), d.ShadowRefused()...)
	}
	code := http.StatusOK
	if !d.Allowed {
		code = http.StatusTooManyRequests
	}
	writeJSON(w, code, resp)
}

func (h *handler) auth(w http.ResponseWriter, req *http.Request) {
	var r enforcer.Request
	err := h.authRequest(req.Header, &r)
	if err == nil {
		err = h.e.Validate(&r)
	}
	if err != nil {
		h.e.CountInvalid(enforcer.APIHTTPAuth)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	d, err := h.e.Check(req.Context(), &r)
	if err != nil {
		h.checkError(w, err)
		return
	}
	setHeaders(w.Header(), &d)
	if d.Allowed {
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(h.cfg.RefuseStatus)
}

// authRequest reads a check from forward-auth request headers. Errors wrap
// enforcer.ErrInvalid.
func (h *handler) authRequest(hd http.Header, r *enforcer.Request) error {
	*r = enforcer.Request{}
	r.Attrs.APIKey = hd.Get(h.cfg.APIKeyHeader)
	r.Attrs.Plan = hd.Get(h.cfg.PlanHeader)
	r.Attrs.Org = hd.Get(h.cfg.OrgHeader)
	if ep := hd.Get(h.cfg.EndpointHeader); ep != "" {
		r.Attrs.Endpoint = ep
	} else {
		method, uri := first(hd, h.cfg.MethodHeaders), first(hd, h.cfg.URIHeaders)
		if i := strings.IndexAny(uri, "?#"); i >= 0 {
			uri = uri[:i]
		}
		if max := h.e.Limits().MaxValueLen; len(method)+1+len(uri) > max {
			return fmt.Errorf("%w: method and uri make an endpoint of %d bytes, more than %d", enforcer.ErrInvalid, len(method)+1+len(uri), max)
		}
		switch {
		case method != "" && uri != "":
			r.Attrs.Endpoint = method + " " + uri
		default:
			r.Attrs.Endpoint = method + uri
		}
	}
	ipText := hd.Get(h.cfg.RealIPHeader)
	if ipText == "" {
		ipText = fromRight(hd.Values(h.cfg.ForwardedForHeader), h.cfg.TrustedHops)
	}
	if ipText = strings.TrimSpace(ipText); ipText != "" {
		ip, err := netip.ParseAddr(ipText)
		if err != nil {
			return fmt.Errorf("%w: client address %.64q is not an IP address", enforcer.ErrInvalid, ipText)
		}
		r.Attrs.IP = ip.Unmap()
	}
	if s := hd.Get(h.cfg.HitsHeader); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: %s %.32q is not a whole number", enforcer.ErrInvalid, h.cfg.HitsHeader, s)
		}
		r.Hits = n
	}
	return nil
}

func (h *handler) checkError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, enforcer.ErrInvalid):
		http.Error(w, err.Error(), http.StatusBadRequest)
	default: // the caller went away or its deadline passed
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	}
}

func first(hd http.Header, names []string) string {
	for _, n := range names {
		if v := hd.Get(n); v != "" {
			return v
		}
	}
	return ""
}

// fromRight returns the hops-th address from the right of the comma-separated values
// (several header lines count as one list, in order); "" when there are fewer.
func fromRight(values []string, hops int) string {
	for i := len(values) - 1; i >= 0; i-- {
		v := values[i]
		for {
			j := strings.LastIndexByte(v, ',')
			part := v[j+1:]
			if strings.TrimSpace(part) != "" {
				hops--
				if hops == 0 {
					return part
				}
			}
			if j < 0 {
				break
			}
			v = v[:j]
		}
	}
	return ""
}

func setHeaders(h http.Header, d *enforcer.Decision) {
	var buf [5]enforcer.Header
	for _, f := range d.AppendHeaders(buf[:0]) {
		h.Set(f.Name, f.Value)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// recoverer turns a panic into a 500 and a log line; input is validated before it could
// cause one, so this only guards against bugs.
func recoverer(next http.Handler, log hclog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				log.Error("panic in HTTP handler", "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// readBody reads a whole body (at most MaxBodyBytes, as the caller's reader bounds it)
// into dst.
func readBody(body io.Reader, dst []byte) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := body.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
		if len(dst) > MaxBodyBytes {
			return dst, fmt.Errorf("more than %d bytes", MaxBodyBytes)
		}
	}
}
