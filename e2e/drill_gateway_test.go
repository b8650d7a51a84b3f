package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
)

// gatewayClient is an HTTP client whose connections come from the loopback address src
// (127.0.0.x), so the gateway's client address (nginx's $remote_addr, Caddy's
// {remote_host}), hence the enforcer's client IP, is src.
func gatewayClient(src string) *http.Client {
	d := &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

type gwAnswer struct {
	code                    int
	rl, policy, retry, body string
}

func gwGet(t *testing.T, c *http.Client, g *stack.Gateway, path, key string) gwAnswer {
	t.Helper()
	r, err := http.NewRequestWithContext(context.Background(), "GET", "http://"+g.Addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		r.Header.Set("X-Api-Key", key)
	}
	resp, err := c.Do(r)
	if err != nil {
		t.Fatalf("GET %s through %s: %v", path, g.Kind, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return gwAnswer{code: resp.StatusCode, rl: resp.Header.Get("RateLimit"), policy: resp.Header.Get("RateLimit-Policy"),
		retry: resp.Header.Get("Retry-After"), body: string(b)}
}

// rateLimitField is a RateLimit field as the enforcer writes it.
var rateLimitField = regexp.MustCompile(`^"[^"]+";r=\d+;t=\d+$`)

// burst sends n requests and counts the answers by status; it fails t on a status other
// than 200 or 429 or on an answer missing what the README promises.
func burst(t *testing.T, c *http.Client, g *stack.Gateway, n int, path, key string) (ok, limited int) {
	t.Helper()
	bare, bareRefused := 0, 0
	defer func() {
		if bare > 0 {
			t.Errorf("%d of %d allowed answers came without the RateLimit fields (as the enforcer writes them)", bare, ok)
		}
		if bareRefused > 0 {
			t.Errorf("%d of %d refusals (429) came without RateLimit and RateLimit-Policy", bareRefused, limited)
		}
	}()
	for range n {
		a := gwGet(t, c, g, path, key)
		switch a.code {
		case http.StatusOK:
			ok++
			if !rateLimitField.MatchString(a.rl) || a.policy == "" {
				bare++ // Caddy 2.6 would pass a field the enforcer did not send as placeholder text
			}
			if a.body != "backend\n" {
				t.Errorf("allowed answer's body %q, want the backend's", a.body)
			}
		case http.StatusTooManyRequests:
			limited++
			if secs, err := strconv.Atoi(a.retry); err != nil || secs < 1 {
				t.Errorf("429 with Retry-After %q, want whole seconds ≥ 1", a.retry)
			}
			// Every answer carries the RateLimit fields, refusals too (README; issue 28:
			// the snippet's 429s carried Retry-After alone).
			if a.rl == "" || a.policy == "" {
				bareRefused++
			}
		default:
			t.Errorf("status %d through %s (body %q), want 200 or 429", a.code, g.Kind, a.body)
		}
	}
	return ok, limited
}

// drillGateway: a gateway of Debian's configured with its README snippet in front of a
// region's two enforcers: nginx (auth_request) in front of us-east's, Caddy
// (forward_auth) in front of eu-west's. Promise: refusals reach the client as 429 with
// Retry-After and the RateLimit fields, allowed answers carry the RateLimit fields and
// reach the backend, refused ones do not, and keyless requests are limited per client IP
// (docs/design.md §8).
func drillGateway(t *testing.T, g *stack.Gateway) {
	c := gatewayClient("127.0.0.1")
	before := g.BackendHits()
	// The example rules' default: 20 a second, bursts of 40, per API key.
	ok, limited := burst(t, c, g, 80, "/v1/items", fmt.Sprintf("gw-key-%d", time.Now().UnixNano()))
	if limited == 0 || ok == 0 {
		t.Errorf("80 quick requests of one key (limit 20/s, burst 40): %d allowed, %d refused; want both", ok, limited)
	}
	if hits := g.BackendHits() - before; hits != int64(ok) {
		t.Errorf("backend saw %d requests, %s answered %d allowed: refusals must not reach the backend", hits, g.Kind, ok)
	}
	t.Logf("%s gateway, one key: 80 requests → %d × 200 (RateLimit fields on each), %d × 429 (Retry-After and RateLimit fields on each); backend saw %d", g.Kind, ok, limited, g.BackendHits()-before)

	t.Run("keyless-per-ip", func(t *testing.T) {
		// Keyless requests from 127.0.0.2 must be limited (docs/design.md §8: never unlimited)
		// and counted per IP, so 127.0.0.3 still gets through.
		okA, limA := burst(t, gatewayClient("127.0.0.2"), g, 80, "/v1/items", "")
		okB, limB := burst(t, gatewayClient("127.0.0.3"), g, 5, "/v1/items", "")
		t.Logf("%s gateway, keyless: 80 requests from 127.0.0.2 → %d × 200, %d × 429; then 5 from 127.0.0.3 → %d × 200, %d × 429", g.Kind, okA, limA, okB, limB)
		if limA == 0 {
			t.Errorf("80 quick keyless requests from one IP were all allowed: keyless traffic must be limited per IP")
		}
		if okB != 5 {
			t.Errorf("another IP's first 5 keyless requests: %d allowed, want 5 (counted per IP, not shared)", okB)
		}
	})
}

// TestGatewaySnippetKeepsHeadersOnRefusals (issue 28, item 5; issue 24 §6) runs each
// gateway of Debian's with its README snippet — nginx's auth_request, Caddy's forward_auth
// — in front of a stand-in for the enforcer's /v1/auth (200, or the refuse_status that
// gateway needs: 403 for nginx, 429 for Caddy; each answer with the RateLimit fields, and
// Retry-After on a refusal), without the three-region stack TestDrills/gateway needs: an
// allowed request reaches the backend and its answer carries the RateLimit fields; a
// refusal reaches the client as 429 with Retry-After, RateLimit and RateLimit-Policy.
func TestGatewaySnippetKeepsHeadersOnRefusals(t *testing.T) {
	for _, gw := range gateways {
		t.Run(gw.kind, func(t *testing.T) {
			auth := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/auth" {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("RateLimit-Policy", `"default/second";q=40;w=2`)
				if r.Header.Get("X-Api-Key") == "over" {
					w.Header().Set("RateLimit", `"default/second";r=0;t=0`)
					w.Header().Set("Retry-After", "1")
					w.WriteHeader(gw.refuse)
					return
				}
				w.Header().Set("RateLimit", `"default/second";r=39;t=2`)
			}), ReadHeaderTimeout: 5 * time.Second}
			g := gatewayInFrontOf(t, gw.kind, "stand-in", auth)
			c := gatewayClient("127.0.0.1")
			ok := gwGet(t, c, g, "/v1/items", "fine")
			t.Logf("allowed through %s: %d RateLimit %q RateLimit-Policy %q", gw.kind, ok.code, ok.rl, ok.policy)
			if ok.code != http.StatusOK || ok.rl != `"default/second";r=39;t=2` || ok.policy != `"default/second";q=40;w=2` || ok.body != "backend\n" {
				t.Fatalf("allowed: %+v, want 200 from the backend with the RateLimit fields as the enforcer sent them", ok)
			}
			no := gwGet(t, c, g, "/v1/items", "over")
			t.Logf("refused through %s: %d RateLimit %q RateLimit-Policy %q Retry-After %q", gw.kind, no.code, no.rl, no.policy, no.retry)
			if no.code != http.StatusTooManyRequests || no.retry != "1" || no.rl != `"default/second";r=0;t=0` || no.policy != `"default/second";q=40;w=2` {
				t.Fatalf("refused: %+v, want 429 with Retry-After 1, RateLimit and RateLimit-Policy as the enforcer sent them", no)
			}
		})
	}
}

// gateways are the gateways of Debian's the tests run with their README snippets, and the
// forward_auth.refuse_status each needs.
var gateways = []struct {
	kind   string
	refuse int
	start  func(testing.TB, []*stack.Enforcer) *stack.Gateway
}{
	{"nginx", http.StatusForbidden, stack.StartGateway}, // auth_request takes only 2xx/401/403
	{"caddy", http.StatusTooManyRequests, stack.StartCaddy},
}

// gatewayInFrontOf serves auth on a loopback port until the test ends and starts the
// README's nginx or Caddy (kind) in front of it as enforcer id.
func gatewayInFrontOf(t *testing.T, kind, id string, auth *http.Server) *stack.Gateway {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go auth.Serve(ln) //nolint:errcheck // closed at the test's end
	t.Cleanup(func() { auth.Close() })
	for _, gw := range gateways {
		if gw.kind == kind {
			return gw.start(t, []*stack.Enforcer{{ID: id, HTTP: ln.Addr().String()}})
		}
	}
	t.Fatalf("no gateway %q", kind)
	return nil
}
