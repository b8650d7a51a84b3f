// Package httpapi serves the enforcer over HTTP:
//
//	POST /v1/check   JSON in, JSON out: 200 when allowed, 429 when refused (both with a body)
//	POST /v1/release {handle}: the in-flight slots of a check given back (200, 404, 400, 503)
//	POST /v1/settle  {handle, cost}: a check's cost settled once known (settle.go; 200,
//	                 404 unknown, expired or settled already, 400, 503)
//	ANY  /v1/auth    forward auth from request headers (nginx auth_request, Traefik
//	                 forwardAuth): 200 or Config.RefuseStatus (429), empty body
//	GET  /metrics    Prometheus metrics of the injected registry
//	GET  /healthz    200 while the process serves
//	GET  /readyz     200 when the Ready check passes (rules loaded, registry, store), else 503
//	GET  /healthcheck envoyproxy/ratelimit's health path, as its users' probes expect it:
//	                 200 "OK" when /readyz would answer 200, else 500
//
// Every check answer carries the IETF RateLimit header fields (see enforcer.HeaderRateLimit)
// when a rule decided, and a refusal adds Retry-After and X-RateLimit-Rule. Invalid input
// is 400 with a message naming the field.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/tracing"
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
	// HitsHeader, when present, is the hits of the check (1 to the enforcer's max_hits).
	// Default "X-RateLimit-Hits".
	HitsHeader string
	// TrustedProxies are the peers (the address of the TCP connection) believed to be the
	// gateway. Only their requests may set the gateway-only headers: the client address
	// (RealIPHeader, ForwardedForHeader), the route (EndpointHeader, MethodHeaders,
	// URIHeaders), PlanHeader, OrgHeader and HitsHeader. A request from any other peer is
	// a client talking to the enforcer directly: every gateway-only header is ignored and
	// its client address is the peer's. nil: loopback only (127.0.0.0/8, ::1), the
	// gateway on the same host as in the README; an empty, non-nil list trusts no peer.
	TrustedProxies []netip.Prefix
	// TrustedHeaders are the gateway-only headers a trusted proxy is believed on; the
	// others are ignored even from it, so a header the gateway passes on from the client
	// unchanged cannot claim another address, route, plan or cost. nil:
	// DefaultTrustedHeaders, what the README's nginx, Caddy and Traefik snippets set. Name
	// the headers by their configured names (case does not matter).
	TrustedHeaders []string
	// RefuseStatus is the status of a refused forward-auth check. Default 429. nginx's
	// auth_request accepts only 2xx, 401 and 403 from its subrequest: use 403 there and map
	// it back to 429 with error_page (see README).
	RefuseStatus int
}

// DefaultTrustedHeaders are the gateway-only headers believed by default: the ones the
// README's gateway snippets set or overwrite on every request (nginx: X-Real-IP and
// X-Original-Method/-URI; Caddy and Traefik: X-Forwarded-For, X-Forwarded-Method and
// X-Forwarded-Uri, and Caddy X-Real-IP). X-Endpoint, X-Plan, X-Org and X-RateLimit-Hits
// are believed only when named in Config.TrustedHeaders: a gateway that sets them must
// say so, and must overwrite or strip what the client sent.
var DefaultTrustedHeaders = []string{"X-Real-IP", "X-Forwarded-For", "X-Forwarded-Method", "X-Forwarded-Uri", "X-Original-Method", "X-Original-URI"}

// DefaultTrustedProxies is loopback: the gateway on the enforcer's own host.
var DefaultTrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

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
		TrustedProxies:     slices.Clone(DefaultTrustedProxies),
		TrustedHeaders:     slices.Clone(DefaultTrustedHeaders),
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
	if c.TrustedProxies == nil {
		c.TrustedProxies = d.TrustedProxies
	}
	if c.TrustedHeaders == nil {
		c.TrustedHeaders = d.TrustedHeaders
	}
	return c
}

// gatewayOnly is every header name c reads that only the gateway may set.
func (c Config) gatewayOnly() []string {
	names := []string{c.PlanHeader, c.OrgHeader, c.EndpointHeader, c.RealIPHeader, c.ForwardedForHeader, c.HitsHeader}
	names = append(names, c.MethodHeaders...)
	return append(names, c.URIHeaders...)
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if s := c.RefuseStatus; s != 0 && (s < 400 || s > 599) {
		return fmt.Errorf("httpapi: refuse status %d, must be a 4xx or 5xx code", s)
	}
	if c.TrustedHops < 0 || c.TrustedHops > 16 {
		return fmt.Errorf("httpapi: trusted hops %d, must be in [0, 16]", c.TrustedHops)
	}
	for _, p := range c.TrustedProxies {
		if !p.IsValid() {
			return fmt.Errorf("httpapi: trusted proxies: an invalid prefix (%v)", p)
		}
	}
	d := c.withDefaults()
	gw := d.gatewayOnly()
	for _, h := range c.TrustedHeaders {
		switch {
		case strings.EqualFold(h, d.APIKeyHeader):
			return fmt.Errorf("httpapi: trusted headers: %s is the API key, which the client sends: it is read from anyone and needs no trust", h)
		case !slices.ContainsFunc(gw, func(g string) bool { return strings.EqualFold(g, h) }):
			return fmt.Errorf("httpapi: trusted headers: %.64q is not a header forward auth reads from the gateway (those are %s)", h, strings.Join(gw, ", "))
		}
	}
	return nil
}

// ParseTrustedProxies reads CIDR prefixes or single addresses ("10.0.0.0/8",
// "192.0.2.7", "::1"). Errors name the entry.
func ParseTrustedProxies(list []string) ([]netip.Prefix, error) {
	if list == nil {
		return nil, nil
	}
	out := make([]netip.Prefix, 0, len(list))
	for i, s := range list {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("httpapi: trusted proxies[%d]: %.64q is neither a CIDR prefix nor an IP address", i, s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
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
	h := &handler{e: e, cfg: cfg, log: log, gw: cfg.believed()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", h.check)
	mux.HandleFunc("POST /v1/release", h.release)
	mux.HandleFunc("POST /v1/settle", h.settle)
	mux.HandleFunc("/v1/auth", h.auth)
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil && !errors.Is(err, ErrDegraded) {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
		}
		io.WriteString(w, "OK")
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
	gw  gatewayHeaders // what a trusted proxy is believed on, resolved once
}

// gatewayHeaders are the gateway-only header names a trusted proxy is believed on: ""
// (or left out of method and uri) for one not in Config.TrustedHeaders. The zero value
// believes none: a client's own request.
type gatewayHeaders struct {
	plan, org, endpoint, realIP, forwardedFor, hits string
	method, uri                                     []string
}

// believed resolves Config.TrustedHeaders against the header names c reads.
func (c Config) believed() gatewayHeaders {
	trusted := func(name string) bool {
		return slices.ContainsFunc(c.TrustedHeaders, func(t string) bool { return strings.EqualFold(t, name) })
	}
	name := func(n string) string {
		if trusted(n) {
			return n
		}
		return ""
	}
	keep := func(ns []string) []string {
		return slices.DeleteFunc(slices.Clone(ns), func(n string) bool { return !trusted(n) })
	}
	return gatewayHeaders{plan: name(c.PlanHeader), org: name(c.OrgHeader), endpoint: name(c.EndpointHeader),
		realIP: name(c.RealIPHeader), forwardedFor: name(c.ForwardedForHeader), hits: name(c.HitsHeader),
		method: keep(c.MethodHeaders), uri: keep(c.URIHeaders)}
}

// CheckRequest is the body of POST /v1/check. Unknown fields are an error.
type CheckRequest struct {
	APIKey   string `json:"api_key"`
	Plan     string `json:"plan"`
	Org      string `json:"org"`
	Endpoint string `json:"endpoint"`
	IP       string `json:"ip"`
	Hits     int64  `json:"hits"`
	// Settle says hits is an estimate of a cost known only after the response: an allowed
	// check answers a settle_handle for POST /v1/settle.
	Settle bool `json:"settle"`
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
	// Handle names the in-flight slots an allowed check holds (rules with an in-flight
	// limit): POST it to /v1/release when the response is done. Absent when none.
	Handle string `json:"handle,omitempty"`
	// Penalized: the rule's penalty for abuse refuses the caller outright until
	// retry_after_ms (rules' penalty field). Absent otherwise.
	Penalized bool `json:"penalized,omitempty"`
	// SettleHandle, when the check asked to settle and was allowed, names what it took:
	// POST it with the actual cost to /v1/settle within the enforcer's settle window.
	SettleHandle string `json:"settle_handle,omitempty"`
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
	*r = enforcer.Request{Hits: in.Hits, Settle: in.Settle}
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
	d, err := h.e.Check(h.checkContext(req), &r)
	if err != nil {
		h.checkError(w, err)
		return
	}
	setHeaders(w.Header(), &d)
	resp := CheckResponse{
		Allowed: d.Allowed, Rule: d.Rule, Limit: d.Limit, Quota: d.Quota, WindowSeconds: d.Window,
		Remaining: d.Remaining, ResetMs: d.Reset.Milliseconds(), RetryAfterMs: d.RetryAfter.Milliseconds(), Penalized: d.Penalized,
		Source: d.Source.String(), CountedBy: d.CountedBy, Handle: d.Handle, SettleHandle: d.SettleHandle,
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
	err := h.authRequest(req.Header, peerAddr(req.RemoteAddr), &r)
	if err == nil {
		err = h.e.Validate(&r)
	}
	if err != nil {
		h.e.CountInvalid(enforcer.APIHTTPAuth)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	d, err := h.e.Check(h.checkContext(req), &r)
	if err != nil {
		h.checkError(w, err)
		return
	}
	setHeaders(w.Header(), &d)
	if d.Allowed {
		if d.Handle != "" {
			w.Header().Set(HandleHeader, d.Handle)
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(h.cfg.RefuseStatus)
}

// checkContext is the context a request's check runs in: with tracing on, its trace
// context (traceparent: the client's or the gateway's; forward auth sees the original
// request's headers) as the parent of the check's span.
func (h *handler) checkContext(req *http.Request) context.Context {
	if !h.e.Traced() {
		return req.Context()
	}
	return tracing.ExtractHTTP(req.Context(), req.Header)
}

// authRequest reads a check from forward-auth request headers sent by peer (the
// connection's address; invalid when unknown). Errors wrap enforcer.ErrInvalid.
//
// Trust: the API key is the client's, read from anyone. The gateway-only headers (client
// address, route, plan, org, hits) are read only when peer is a trusted proxy and the
// header is a trusted one; otherwise they are as if absent, and a peer that is not a
// trusted proxy is itself the client address.
func (h *handler) authRequest(hd http.Header, peer netip.Addr, r *enforcer.Request) error {
	*r = enforcer.Request{}
	fromGateway := peer.IsValid() && h.trustedPeer(peer)
	var g gatewayHeaders // a client's own request: no gateway-only header believed
	if fromGateway {
		g = h.gw
	}
	get := func(name string) string {
		if name == "" {
			return ""
		}
		return hd.Get(name)
	}
	r.Attrs.APIKey = hd.Get(h.cfg.APIKeyHeader)
	r.Attrs.Plan = get(g.plan)
	r.Attrs.Org = get(g.org)
	if ep := get(g.endpoint); ep != "" {
		r.Attrs.Endpoint = ep
	} else {
		method, uri := first(hd, g.method), first(hd, g.uri)
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
	switch {
	case !fromGateway:
		if peer.IsValid() {
			r.Attrs.IP = peer
		}
	default:
		ipText, from := get(g.realIP), h.cfg.RealIPHeader
		if ipText == "" && g.forwardedFor != "" {
			ipText, from = fromRight(hd.Values(g.forwardedFor), h.cfg.TrustedHops), h.cfg.ForwardedForHeader
		}
		if ipText = strings.TrimSpace(ipText); ipText != "" {
			ip, err := netip.ParseAddr(ipText)
			if err != nil {
				return fmt.Errorf("%w: client address %.64q (%s) is not an IP address", enforcer.ErrInvalid, ipText, from)
			}
			r.Attrs.IP = ip.Unmap()
		}
	}
	if s := get(g.hits); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: %s %.32q is not a whole number", enforcer.ErrInvalid, h.cfg.HitsHeader, s)
		}
		if n < 1 {
			// 0 would mean "the default cost" in a JSON check; from a header it is a
			// gateway bug or a client's claim, so refuse it rather than guess.
			return fmt.Errorf("%w: %s %d, must be at least 1", enforcer.ErrInvalid, h.cfg.HitsHeader, n)
		}
		r.Hits = n
	}
	return nil
}

// trustedPeer: peer is one of the trusted proxies.
func (h *handler) trustedPeer(peer netip.Addr) bool {
	for _, p := range h.cfg.TrustedProxies {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}

// peerAddr is the address of a "host:port" RemoteAddr, unmapped; invalid when it is not
// one (a Unix socket, a test's made-up request).
func peerAddr(remote string) netip.Addr {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
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

// HandleHeader carries an allowed forward-auth check's in-flight handle
// (CheckResponse.Handle): the gateway releases it with POST /v1/release when the response
// is done, or the slots come back at their limit's timeout.
const HandleHeader = "X-Allot-Handle"

// ReleaseRequest is the body of POST /v1/release. Unknown fields are an error.
type ReleaseRequest struct {
	Handle string `json:"handle"`
}

// ReleaseResponse is the body POST /v1/release answers with: 200 and released when every
// slot of the handle was given back; 404 with error when one was held no longer
// (released already, expired, or never held: nothing is released twice); 400 for a
// handle this enforcer cannot read; 503 when the store could not answer (the slots then
// come back at their timeout).
type ReleaseResponse struct {
	Released bool   `json:"released"`
	Error    string `json:"error,omitempty"`
}

// readJSON reads a small JSON body (release, settle) into in: unknown fields and
// anything after the object refused. A bad body is answered 400 naming what was wrong,
// counted as an invalid request, and readJSON returns false.
func (h *handler) readJSON(w http.ResponseWriter, req *http.Request, in any) bool {
	var buf [512]byte
	b, err := readBody(http.MaxBytesReader(w, req.Body, MaxBodyBytes), buf[:0])
	if err == nil {
		err = strictBody(b)
	}
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		err = dec.Decode(in)
	}
	if err != nil {
		h.e.CountInvalid(enforcer.APIHTTPCheck)
		writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: fmt.Sprintf("%v: body: %v", enforcer.ErrInvalid, err)})
		return false
	}
	return true
}

func (h *handler) release(w http.ResponseWriter, req *http.Request) {
	var in ReleaseRequest
	if !h.readJSON(w, req, &in) {
		return
	}
	switch err := h.e.Release(req.Context(), in.Handle); {
	case err == nil:
		writeJSON(w, http.StatusOK, ReleaseResponse{Released: true})
	case errors.Is(err, enforcer.ErrInvalid):
		writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: err.Error()})
	case errors.Is(err, enforcer.ErrUnknownHandle):
		writeJSON(w, http.StatusNotFound, ReleaseResponse{Error: err.Error()})
	default:
		writeJSON(w, http.StatusServiceUnavailable, ReleaseResponse{Error: err.Error()})
	}
}
