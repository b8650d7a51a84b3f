package httpapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/hashicorp/go-hclog"
)

// trustRules are the example rules' shape, small: a default per key, more for plan pro,
// and a per-IP login limit.
const trustRules = `
rules:
  - id: default
    limits: [{name: minute, rate: 2, per: 1m, burst: 2}]
  - id: pro
    match: {plan: pro}
    limits: [{name: minute, rate: 100, per: 1m, burst: 100}]
  - id: login-per-ip
    match: {endpoint: "POST /v1/login"}
    by: ip
    limits: [{name: minute, rate: 3, per: 1m, burst: 3}]
`

// trustHandler serves forward auth over trustRules with cfg; call sends one request from
// peer ("ip:port") with the headers h and returns the status and the deciding rule.
func trustHandler(t *testing.T, cfg Config) func(peer string, h map[string]string) (int, string) {
	t.Helper()
	rig := enforcertest.New(t, trustRules)
	hd := Handler(rig.E, cfg, rig.Reg, nil, hclog.NewNullLogger())
	return func(peer string, h map[string]string) (int, string) {
		req := httptest.NewRequest("GET", "/v1/auth", nil)
		req.RemoteAddr = peer
		for k, v := range h {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		hd.ServeHTTP(rec, req)
		return rec.Code, rec.Header().Get("X-RateLimit-Rule")
	}
}

// countAllowed sends n requests, the i-th with headers h(i), and counts the 200s.
func countAllowed(t *testing.T, call func(string, map[string]string) (int, string), peer string, n int, h func(i int) map[string]string) int {
	t.Helper()
	ok := 0
	for i := range n {
		code, rule := call(peer, h(i))
		switch code {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("request %d: status %d (rule %q), want 200 or 429", i, code, rule)
		}
	}
	return ok
}

const gateway = "127.0.0.1:40000" // a trusted proxy by default (loopback)

// TestTrustRotatingRealIP (issue 27 §3): a client rotating X-Real-IP left the per-IP login
// limit (15 of 15 allowed). Now: straight to the enforcer, its own address counts; through
// a gateway trusted for X-Forwarded-For only (one that passes X-Real-IP on), the gateway's
// rightmost entry counts.
func TestTrustRotatingRealIP(t *testing.T) {
	login := func(extra map[string]string) func(int) map[string]string {
		return func(i int) map[string]string {
			h := map[string]string{"X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/v1/login", "X-Api-Key": fmt.Sprintf("k%d", i),
				"X-Real-IP": fmt.Sprintf("198.51.100.%d", i+1)}
			for k, v := range extra {
				h[k] = v
			}
			return h
		}
	}
	t.Run("direct", func(t *testing.T) {
		// Keyless, so the default rule counts the client address: the peer's, whatever
		// X-Real-IP says.
		call := trustHandler(t, Config{})
		keyless := func(i int) map[string]string {
			return map[string]string{"X-Real-IP": fmt.Sprintf("198.51.100.%d", i+1)}
		}
		if ok := countAllowed(t, call, "203.0.113.7:5555", 15, keyless); ok != 2 {
			t.Errorf("15 keyless requests straight to the enforcer, X-Real-IP rotating: %d allowed, want 2 (the peer's budget)", ok)
		}
	})
	t.Run("gateway trusted for X-Forwarded-For only", func(t *testing.T) {
		call := trustHandler(t, Config{TrustedHeaders: []string{"X-Forwarded-For", "X-Forwarded-Method", "X-Forwarded-Uri"}})
		if ok := countAllowed(t, call, gateway, 15, login(map[string]string{"X-Forwarded-For": "203.0.113.7"})); ok != 3 {
			t.Errorf("15 logins through the gateway, X-Real-IP rotating: %d allowed, want 3 (the X-Forwarded-For budget)", ok)
		}
	})
	t.Run("gateway trusted for X-Real-IP still counts it", func(t *testing.T) {
		call := trustHandler(t, Config{})
		if ok := countAllowed(t, call, gateway, 6, login(nil)); ok != 6 {
			t.Errorf("6 logins from 6 clients through a gateway that sets X-Real-IP: %d allowed, want 6", ok)
		}
	})
}

// TestTrustEndpointClaim (issue 27 §3): a login request claiming X-Endpoint: GET /status
// passed. X-Endpoint is believed only when configured; by default the route is the
// gateway's X-Forwarded-Method / -Uri.
func TestTrustEndpointClaim(t *testing.T) {
	h := func(i int) map[string]string {
		return map[string]string{"X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/v1/login", "X-Endpoint": "GET /status",
			"X-Real-IP": "203.0.113.9", "X-Api-Key": fmt.Sprintf("k%d", i)}
	}
	call := trustHandler(t, Config{})
	if ok := countAllowed(t, call, gateway, 10, h); ok != 3 {
		t.Errorf("10 logins claiming X-Endpoint: GET /status: %d allowed, want 3 (login-per-ip)", ok)
	}
	// A gateway configured to set X-Endpoint: its value is the route.
	call = trustHandler(t, Config{TrustedHeaders: []string{"X-Endpoint", "X-Real-IP"}})
	h2 := func(i int) map[string]string {
		return map[string]string{"X-Endpoint": "POST /v1/login", "X-Real-IP": "203.0.113.9", "X-Api-Key": fmt.Sprintf("k%d", i)}
	}
	if ok := countAllowed(t, call, gateway, 10, h2); ok != 3 {
		t.Errorf("10 logins, X-Endpoint trusted: %d allowed, want 3", ok)
	}
	// Straight from a client, even a trusted header is not believed.
	if ok := countAllowed(t, call, "203.0.113.9:1", 10, func(int) map[string]string {
		return map[string]string{"X-Endpoint": "GET /status", "X-Api-Key": "direct"}
	}); ok != 2 {
		t.Errorf("10 direct requests claiming X-Endpoint: %d allowed, want 2 (default rule, the endpoint unknown)", ok)
	}
}

// TestTrustPlanClaim (issue 27 §3): a client-sent X-Plan: pro got the pro limits.
func TestTrustPlanClaim(t *testing.T) {
	pro := func(int) map[string]string {
		return map[string]string{"X-Api-Key": "free-key", "X-Plan": "pro", "X-Real-IP": "203.0.113.9"}
	}
	call := trustHandler(t, Config{})
	if ok := countAllowed(t, call, gateway, 10, pro); ok != 2 {
		t.Errorf("10 requests of a free key claiming X-Plan: pro: %d allowed, want 2 (the default rule)", ok)
	}
	// A gateway trusted to set X-Plan (from its authentication) gets the pro limits.
	call = trustHandler(t, Config{TrustedHeaders: []string{"X-Plan", "X-Real-IP"}})
	if ok := countAllowed(t, call, gateway, 10, pro); ok != 10 {
		t.Errorf("10 requests with X-Plan: pro from a gateway trusted for it: %d allowed, want 10", ok)
	}
	if ok := countAllowed(t, call, "203.0.113.9:1", 10, func(int) map[string]string {
		return map[string]string{"X-Api-Key": "direct-key", "X-Plan": "pro"}
	}); ok != 2 {
		t.Errorf("10 direct requests claiming X-Plan: pro: %d allowed, want 2", ok)
	}
}

// TestTrustHits (issue 27 §3): X-RateLimit-Hits came from the client: 0 or negative, or a
// large cost to spend someone else's budget.
func TestTrustHits(t *testing.T) {
	call := trustHandler(t, Config{})
	// Untrusted by default: ignored, each request costs 1.
	spend := func(int) map[string]string { return map[string]string{"X-Api-Key": "victim", "X-RateLimit-Hits": "2"} }
	if ok := countAllowed(t, call, gateway, 2, spend); ok != 2 {
		t.Errorf("2 requests claiming 2 hits each against a burst of 2: %d allowed, want 2 (the claim ignored)", ok)
	}
	for _, v := range []string{"0", "-5", "x"} {
		if code, _ := call(gateway, map[string]string{"X-Api-Key": "other-" + v, "X-RateLimit-Hits": v}); code != http.StatusOK {
			t.Errorf("untrusted X-RateLimit-Hits %q: %d, want 200 (ignored)", v, code)
		}
	}
	// Trusted: the cost counts, and 0, negative and non-numbers are 400.
	call = trustHandler(t, Config{TrustedHeaders: []string{"X-RateLimit-Hits"}})
	if code, _ := call(gateway, map[string]string{"X-Api-Key": "k2", "X-RateLimit-Hits": "2"}); code != http.StatusOK {
		t.Fatalf("trusted hits 2 of a burst of 2: %d, want 200", code)
	}
	if code, rule := call(gateway, map[string]string{"X-Api-Key": "k2"}); code != http.StatusTooManyRequests || rule != "default" {
		t.Errorf("after spending the burst in one request: %d %q, want 429 by default", code, rule)
	}
	for _, v := range []string{"0", "-5", "x", "1001"} {
		if code, _ := call(gateway, map[string]string{"X-Api-Key": "k3", "X-RateLimit-Hits": v}); code != http.StatusBadRequest {
			t.Errorf("trusted X-RateLimit-Hits %q: %d, want 400", v, code)
		}
	}
	// Not from a client, even when trusted from the gateway.
	if code, _ := call("203.0.113.9:1", map[string]string{"X-Api-Key": "k4", "X-RateLimit-Hits": "-5"}); code != http.StatusOK {
		t.Errorf("direct X-RateLimit-Hits -5: %d, want 200 (ignored)", code)
	}
}

// TestTrustProxies: only the configured peers are gateways; IPv4-mapped peers match
// their IPv4 prefix; an empty list trusts nobody.
func TestTrustProxies(t *testing.T) {
	proxies, err := ParseTrustedProxies([]string{"10.0.0.0/8", "192.0.2.7", "::ffff:172.16.0.0/108"})
	if err != nil {
		t.Fatal(err)
	}
	call := trustHandler(t, Config{TrustedProxies: proxies})
	// Keyless requests of distinct clients (X-Real-IP): a gateway's are counted per
	// client, anyone else's by the peer's own address (the default rule's burst of 2).
	next := 0
	clients := func(int) map[string]string {
		next++
		return map[string]string{"X-Real-IP": fmt.Sprintf("198.51.100.%d", next)}
	}
	for _, peer := range []string{"10.1.2.3:1", "192.0.2.7:1", "[::ffff:10.9.9.9]:1", "172.16.3.4:1"} {
		if ok := countAllowed(t, call, peer, 5, clients); ok != 5 {
			t.Errorf("peer %s (trusted): 5 clients, %d allowed, want 5", peer, ok)
		}
	}
	for _, peer := range []string{"127.0.0.1:1", "192.0.2.8:1"} {
		if ok := countAllowed(t, call, peer, 5, clients); ok != 2 {
			t.Errorf("peer %s (untrusted): 5 'clients', %d allowed, want 2 (the peer's own budget)", peer, ok)
		}
	}
	none := trustHandler(t, Config{TrustedProxies: []netip.Prefix{}})
	if ok := countAllowed(t, none, gateway, 5, clients); ok != 2 {
		t.Errorf("no trusted proxy: 5 'clients' from loopback, %d allowed, want 2 (loopback's own budget)", ok)
	}
}

func TestTrustConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		says string
	}{
		{Config{TrustedHeaders: []string{"X-Api-Key"}}, "X-Api-Key is the API key"},
		{Config{TrustedHeaders: []string{"X-Foo"}}, `"X-Foo" is not a header forward auth reads`},
		{Config{TrustedProxies: []netip.Prefix{{}}}, "invalid prefix"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: %v, want an error saying %q", tc.cfg, err, tc.says)
		}
	}
	if err := (Config{TrustedHeaders: []string{"x-plan", "X-ORG", "x-endpoint", "X-RateLimit-Hits"}}).Validate(); err != nil {
		t.Errorf("gateway-only headers in any case: %v", err)
	}
	for _, bad := range []string{"10.0.0.0/33", "nope", ""} {
		if _, err := ParseTrustedProxies([]string{bad}); err == nil || !strings.Contains(err.Error(), "trusted proxies[0]") {
			t.Errorf("ParseTrustedProxies(%q): %v, want an error naming the entry", bad, err)
		}
	}
}
