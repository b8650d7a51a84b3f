package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/enforcer/httpapi"
	"github.com/hashicorp/go-hclog"
)

// gatewayOnlyForged are headers only the gateway may set, as a client would forge them.
var gatewayOnlyForged = map[string]string{
	"X-Real-IP": "203.0.113.66", "X-Forwarded-For": "203.0.113.66", "X-Endpoint": "GET /status",
	"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/status", "X-Original-Method": "GET", "X-Original-URI": "/status",
	"X-Plan": "pro", "X-Org": "acme", "X-RateLimit-Hits": "0",
}

// TestGatewaySnippetStripsClientHeaders (issue 27 §3; issue 24 §6) runs each gateway of
// Debian's with its cmd/enforcer/README.md snippet — nginx's auth_request, Caddy's
// forward_auth — in front of the enforcer's real forward-auth handler (default trust:
// loopback, the snippets' headers; the refuse_status that gateway needs) over a login
// limit of 3 a minute per IP and a pro plan. A client rotating forged X-Real-IP,
// X-Forwarded-For, X-Endpoint, X-Plan and X-RateLimit-Hits, and a fresh API key each time,
// gets 3 logins; the enforcer sees none of the forged values.
func TestGatewaySnippetStripsClientHeaders(t *testing.T) {
	for _, gw := range gateways {
		t.Run(gw.kind, func(t *testing.T) { snippetStripsClientHeaders(t, gw.kind, gw.refuse) })
	}
}

func snippetStripsClientHeaders(t *testing.T, kind string, refuse int) {
	rig := enforcertest.New(t, `
rules:
  - id: default
    limits: [{name: minute, rate: 100, per: 1m, burst: 100}]
  - id: pro
    match: {plan: pro}
    limits: [{name: minute, rate: 1000, per: 1m, burst: 1000}]
  - id: login-per-ip
    match: {endpoint: "POST /v1/login"}
    by: ip
    limits: [{name: minute, rate: 3, per: 1m, burst: 3}]
`)
	h := httpapi.Handler(rig.E, httpapi.Config{RefuseStatus: refuse}, rig.Reg, nil, hclog.NewNullLogger())
	var mu sync.Mutex
	var seen []http.Header
	auth := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != "gateway-ready-probe" {
			mu.Lock()
			seen = append(seen, r.Header.Clone())
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 5 * time.Second}
	g := gatewayInFrontOf(t, kind, "in-process", auth)

	c := gatewayClient("127.0.0.2")
	ok, limited := 0, 0
	for i := range 10 {
		req, _ := http.NewRequest("POST", "http://"+g.Addr+"/v1/login", nil)
		for k, v := range gatewayOnlyForged {
			req.Header.Set(k, v)
		}
		req.Header.Set("X-Real-IP", fmt.Sprintf("198.51.100.%d", i+1))
		req.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1))
		req.Header.Set("X-Api-Key", fmt.Sprintf("invented-%d", i))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("login %d through %s: %d, want 200 or 429", i, kind, resp.StatusCode)
		}
	}
	t.Logf("10 logins from 127.0.0.2 with forged gateway headers through %s: %d × 200, %d × 429", kind, ok, limited)
	if ok != 3 {
		t.Errorf("10 logins with forged X-Real-IP/X-Endpoint/X-Plan: %d allowed, want 3 (login-per-ip of 127.0.0.2)", ok)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 10 {
		t.Fatalf("the enforcer saw %d auth requests, want 10", len(seen))
	}
	// What each snippet sets itself; every other gateway-only header must not arrive.
	want := map[string]string{"X-Real-Ip": "127.0.0.2", "X-Api-Key": "invented-9"}
	switch kind {
	case "nginx":
		want["X-Original-Method"], want["X-Original-Uri"] = "POST", "/v1/login"
	case "caddy":
		want["X-Forwarded-Method"], want["X-Forwarded-Uri"], want["X-Forwarded-For"] = "POST", "/v1/login", "127.0.0.2"
	}
	last := seen[len(seen)-1]
	for k, v := range want {
		if got := last.Get(k); got != v {
			t.Errorf("the enforcer saw %s %q, want %q (set by the snippet)", k, got, v)
		}
	}
	for k := range gatewayOnlyForged {
		if _, set := want[http.CanonicalHeaderKey(k)]; set {
			continue
		}
		if v := last.Values(k); len(v) > 0 {
			t.Errorf("the client's %s %q reached the enforcer: the snippet must strip it", k, v)
		}
	}
}

// TestSnippetsSetOrStripGatewayHeaders (issue 27 §3) reads the Caddy and Traefik
// snippets of cmd/enforcer/README.md (there is no Traefik in the test image; Caddy's runs
// in TestGatewaySnippetStripsClientHeaders too):
// Traefik copies only the API key from the client and does not trust the client's
// X-Forwarded-*; Caddy overwrites X-Real-IP and deletes every other gateway-only header
// it does not set itself. And the enforcer trusts, by default, no header the snippets
// leave to the client.
func TestSnippetsSetOrStripGatewayHeaders(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(stack.RepoRoot(t), "cmd", "enforcer", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := func(lang, holding string) string {
		for _, m := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllSubmatch(raw, -1) {
			if strings.Contains(string(m[1]), holding) {
				return string(m[1])
			}
		}
		t.Fatalf("cmd/enforcer/README.md has no ```%s block with %s", lang, holding)
		return ""
	}
	traefik := block("yaml", "forwardAuth")
	for _, want := range []string{"forwardAuth:", "trustForwardHeader: false", "authRequestHeaders: [X-Api-Key]"} {
		if !strings.Contains(traefik, want) {
			t.Errorf("the Traefik snippet lacks %q:\n%s", want, traefik)
		}
	}
	caddy := block("caddy", "forward_auth")
	// forward_auth sets these itself, over the client's.
	setByCaddy := map[string]bool{"X-Forwarded-For": true, "X-Forwarded-Method": true, "X-Forwarded-Uri": true}
	if !regexp.MustCompile(`(?m)^\s*header_up X-Real-IP \{remote_host\}\s*$`).MatchString(caddy) {
		t.Errorf("the Caddy snippet does not overwrite X-Real-IP with the peer address:\n%s", caddy)
	}
	for k := range gatewayOnlyForged {
		if setByCaddy[k] || k == "X-Real-IP" {
			continue
		}
		if !regexp.MustCompile(`(?mi)^\s*header_up -` + regexp.QuoteMeta(k) + `\s*$`).MatchString(caddy) {
			t.Errorf("the Caddy snippet passes the client's %s on: add header_up -%s", k, k)
		}
	}
	// What the snippets set is all the enforcer trusts by default.
	for _, h := range httpapi.DefaultTrustedHeaders {
		if !strings.Contains(string(raw), h) {
			t.Errorf("httpapi.DefaultTrustedHeaders has %s, which no snippet mentions", h)
		}
	}
	for _, h := range []string{"X-Endpoint", "X-Plan", "X-Org", "X-RateLimit-Hits"} {
		for _, d := range httpapi.DefaultTrustedHeaders {
			if strings.EqualFold(d, h) {
				t.Errorf("%s is trusted by default, but no snippet sets it", h)
			}
		}
	}
}
