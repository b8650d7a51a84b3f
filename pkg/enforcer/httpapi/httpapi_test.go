package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testRules = `
rules:
  - id: default
    limits: [{name: minute, rate: 120, per: 1m, burst: 2}]
  - id: per-ip
    by: ip
    match: {endpoint: "GET /v1/ip-limited"}
    limits: [{name: second, rate: 1, per: 1s}]
  - id: shadow-tight
    mode: shadow
    limits: [{name: second, rate: 1, per: 1s}]
`

func server(t *testing.T, cfg Config, ready func() error) (*enforcertest.Rig, *httptest.Server) {
	t.Helper()
	rig := enforcertest.New(t, testRules)
	srv := httptest.NewServer(Handler(rig.E, cfg, rig.Reg, ready, hclog.NewNullLogger()))
	t.Cleanup(srv.Close)
	return rig, srv
}

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestCheckJSON(t *testing.T) {
	_, srv := server(t, Config{}, nil)
	body := `{"api_key":"k","endpoint":"GET /v1/items","ip":"192.0.2.1"}`
	for i := 0; i < 2; i++ {
		resp, b := post(t, srv.URL, body)
		var out CheckResponse
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if resp.StatusCode != 200 || !out.Allowed || out.Rule != "default" || out.Remaining != int64(1-i) || out.Source != "memory" {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != `"default/minute";q=2;w=1` {
			t.Fatalf("call %d RateLimit-Policy %q", i, got)
		}
		if i == 1 && (len(out.ShadowRefused) != 1 || out.ShadowRefused[0] != "shadow-tight") {
			t.Fatalf("call 2 shadow %v", out.ShadowRefused)
		}
	}
	resp, b := post(t, srv.URL, body)
	var out CheckResponse
	json.Unmarshal(b, &out)
	if resp.StatusCode != 429 || out.Allowed || out.Rule != "default" || out.RetryAfterMs != 500 {
		t.Fatalf("third: %d %s", resp.StatusCode, b)
	}
	if resp.Header.Get("Retry-After") != "1" || resp.Header.Get("X-RateLimit-Rule") != "default" || resp.Header.Get("RateLimit") != `"default/minute";r=0;t=0` {
		t.Fatalf("third headers %v", resp.Header)
	}
}

func TestCheckJSONInvalid(t *testing.T) {
	_, srv := server(t, Config{}, nil)
	for _, tc := range []struct{ body, want string }{
		{`{"api_key":`, "body: unexpected EOF"},
		{`{"api_key":"k","bogus":1}`, `unknown field "bogus"`},
		{`{"ip":"1.2.3"}`, `ip "1.2.3" is not an IP address`},
		{`{"hits":100000}`, "hits 100000, must be in [0, 1000]"},
		{`{"api_key":"` + strings.Repeat("a", 300) + `"}`, "api_key is 300 bytes"},
		{`{} {}`, "more than one JSON value"},
		{`{"api_key":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, "request body too large"},
		// Issue 27: each of these was accepted, some into another request's bucket.
		{`null`, "body is null, want a JSON object"},
		{` null `, "body is null, want a JSON object"},
		{`{"api_key":"a","api_key":"b"}`, `key "api_key" given twice`},
		{`{"API_KEY":"a"}`, `key "API_KEY": keys are case-sensitive, write "api_key"`},
		{`{"Api_Key":"a","api_key":"b"}`, `keys are case-sensitive`},
		{`{"api\u005fkey":"a"}`, `written with escapes`},
		{`{"api_key":"a"}` + strings.Repeat(" ", MaxBodyBytes-40) + `x`, "more than one JSON value"},
		{`{"api_key":"a"}` + strings.Repeat(" ", MaxBodyBytes) + `x`, "request body too large"},
		{"{\"api_key\":\"a\xff\"}", "body is not valid UTF-8"},
		{`{"api_key":"\ud800"}`, `lone surrogate \uD800`},
		{`{"api_key":"\udc00x"}`, `lone surrogate \uDC00`},
		{`{"api_key":"\ud800\u0041"}`, `lone surrogate \uD800`},
	} {
		resp, b := post(t, srv.URL, tc.body)
		var e ErrorResponse
		if resp.StatusCode != 400 || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error, tc.want) {
			t.Errorf("body %.40q: %d %s, want 400 containing %q", tc.body, resp.StatusCode, b, tc.want)
		}
	}
	resp, err := http.Get(srv.URL + "/v1/check")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/check: %d, want 405", resp.StatusCode)
	}
}

func auth(t *testing.T, url string, h map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/v1/auth", nil)
	for k, v := range h {
		req.Header.Add(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestForwardAuth(t *testing.T) {
	_, srv := server(t, Config{}, nil)
	h := map[string]string{"X-Api-Key": "k", "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/v1/items?q=1"}
	for i := 0; i < 2; i++ {
		if resp := auth(t, srv.URL, h); resp.StatusCode != 200 || resp.Header.Get("RateLimit") == "" {
			t.Fatalf("call %d: %d %v", i, resp.StatusCode, resp.Header)
		}
	}
	resp := auth(t, srv.URL, h)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || resp.Header.Get("X-RateLimit-Rule") != "default" {
		t.Fatalf("third: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestForwardAuthIPAndEndpoint(t *testing.T) {
	_, srv := server(t, Config{RefuseStatus: 403}, nil)
	// The per-ip rule applies to GET /v1/ip-limited; the client is the rightmost
	// X-Forwarded-For entry (the left ones are the client's own claims).
	h := map[string]string{"X-Original-Method": "GET", "X-Original-URI": "/v1/ip-limited", "X-Forwarded-For": "203.0.113.9, 198.51.100.4"}
	if resp := auth(t, srv.URL, h); resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	h["X-Forwarded-For"] = "203.0.113.10, 198.51.100.4" // spoofed left part: same client
	if resp := auth(t, srv.URL, h); resp.StatusCode != 403 || resp.Header.Get("X-RateLimit-Rule") != "per-ip" {
		t.Fatalf("second: %d %v, want 403 by per-ip", resp.StatusCode, resp.Header)
	}
	h = map[string]string{"X-Original-Method": "GET", "X-Original-URI": "/v1/ip-limited", "X-Real-IP": "198.51.100.5"}
	if resp := auth(t, srv.URL, h); resp.StatusCode != 200 {
		t.Fatalf("other client: %d", resp.StatusCode)
	}
	if resp := auth(t, srv.URL, map[string]string{"X-Real-IP": "nope"}); resp.StatusCode != 400 {
		t.Fatalf("bad ip: %d, want 400", resp.StatusCode)
	}
	if resp := auth(t, srv.URL, map[string]string{"X-Api-Key": strings.Repeat("k", 300)}); resp.StatusCode != 400 {
		t.Fatalf("long key: %d, want 400", resp.StatusCode)
	}
}

// TestForwardAuthKeyless: a request without an API key is never unlimited. With a client
// IP it is counted per IP (IPv6 per /64) by the rules counted by api_key; with neither key
// nor IP every such request shares one anonymous bucket set. The answer says which.
func TestForwardAuthKeyless(t *testing.T) {
	_, srv := server(t, Config{}, nil)
	for _, tc := range []struct {
		name      string
		h, other  map[string]string // other: a different client, its own budget (nil: none)
		countedBy string
	}{
		{"ipv4", map[string]string{"X-Real-IP": "192.0.2.1"}, map[string]string{"X-Real-IP": "192.0.2.2"}, "ip"},
		{"ipv6 per /64", map[string]string{"X-Real-IP": "2001:db8:1:2::1"}, map[string]string{"X-Real-IP": "2001:db8:1:3::1"}, "ip"},
		{"neither key nor ip", map[string]string{}, nil, "anonymous"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < 2; i++ { // the default rule's burst
				resp := auth(t, srv.URL, tc.h)
				if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Counted-By") != tc.countedBy || resp.Header.Get("RateLimit") == "" {
					t.Fatalf("call %d: %d %v, want allowed, counted by %s", i, resp.StatusCode, resp.Header, tc.countedBy)
				}
			}
			if tc.name == "ipv6 per /64" { // another address of the same /64: same budget
				tc.h["X-Real-IP"] = "2001:db8:1:2::ffff"
			}
			resp := auth(t, srv.URL, tc.h)
			if resp.StatusCode != 429 || resp.Header.Get("X-RateLimit-Rule") != "default" {
				t.Fatalf("third: %d %v, want refused by default", resp.StatusCode, resp.Header)
			}
			if tc.other != nil {
				if resp := auth(t, srv.URL, tc.other); resp.StatusCode != 200 {
					t.Fatalf("another client: %d, want its own budget", resp.StatusCode)
				}
			}
		})
	}
}

func TestFromRight(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		hops int
		want string
	}{
		{nil, 1, ""},
		{[]string{"1.1.1.1"}, 1, "1.1.1.1"},
		{[]string{"1.1.1.1, 2.2.2.2"}, 1, " 2.2.2.2"},
		{[]string{"1.1.1.1, 2.2.2.2"}, 2, "1.1.1.1"},
		{[]string{"1.1.1.1", "2.2.2.2,3.3.3.3"}, 3, "1.1.1.1"},
		{[]string{"1.1.1.1,, "}, 1, "1.1.1.1"},
		{[]string{"1.1.1.1"}, 2, ""},
	} {
		if got := fromRight(tc.in, tc.hops); got != tc.want {
			t.Errorf("fromRight(%q, %d) = %q, want %q", tc.in, tc.hops, got, tc.want)
		}
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	var readyErr error
	_, srv := server(t, Config{}, func() error { return readyErr })
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if c, _ := get("/healthz"); c != 200 {
		t.Fatalf("healthz %d", c)
	}
	if c, _ := get("/readyz"); c != 200 {
		t.Fatalf("readyz %d", c)
	}
	// envoyproxy/ratelimit's health path, as their probes expect it: 200 "OK", else 500.
	if c, b := get("/healthcheck"); c != 200 || b != "OK" {
		t.Fatalf("healthcheck %d %q, want 200 OK", c, b)
	}
	readyErr = errors.New("rules not loaded")
	if c, b := get("/readyz"); c != 503 || !strings.Contains(b, "rules not loaded") {
		t.Fatalf("readyz %d %q", c, b)
	}
	if c, _ := get("/healthcheck"); c != 500 {
		t.Fatalf("healthcheck when not ready: %d, want 500", c)
	}
	readyErr = fmt.Errorf("%w: store: shard 127.0.0.1:7001 down", ErrDegraded)
	if c, b := get("/readyz"); c != 200 || !strings.Contains(b, "degraded") || !strings.Contains(b, "7001") {
		t.Fatalf("readyz while degraded: %d %q, want 200 naming the shard", c, b)
	}
	if c, b := get("/healthcheck"); c != 200 || b != "OK" {
		t.Fatalf("healthcheck while degraded: %d %q, want 200 OK (the fallback answers)", c, b)
	}
	post(t, srv.URL, `{"api_key":"k"}`)
	post(t, srv.URL, `{"bad":1}`)
	c, b := get("/metrics")
	for _, want := range []string{
		`allot_enforcer_decisions_total{result="allowed",source="memory"} 1`,
		`allot_enforcer_invalid_requests_total{api="http-check"} 1`,
		`allot_enforcer_check_seconds_count 1`,
	} {
		if c != 200 || !strings.Contains(b, want) {
			t.Fatalf("metrics %d lack %q:\n%s", c, want, b)
		}
	}
}

func TestRecoverer(t *testing.T) {
	var logs bytes.Buffer
	h := recoverer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }), hclog.New(&hclog.LoggerOptions{Output: &logs}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 500 || !strings.Contains(logs.String(), "boom") {
		t.Fatalf("got %d, logs %q", rec.Code, logs.String())
	}
}

// FuzzDecodeCheck: any body decodes to a valid check or an ErrInvalid, never a panic.
func FuzzDecodeCheck(f *testing.F) {
	f.Add([]byte(`{"api_key":"k","plan":"pro","org":"o","endpoint":"GET /","ip":"::1","hits":3}`))
	f.Add([]byte(`{"ip":"1.2.3.4%x"}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"hits":1e99}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r enforcer.Request
		if err := DecodeCheck(bytes.NewReader(b), &r); err != nil && !errors.Is(err, enforcer.ErrInvalid) {
			t.Fatalf("error %v does not wrap ErrInvalid", err)
		}
	})
}

// FuzzHandlers drives both check endpoints with arbitrary bodies and headers: the answer
// is 200, 400 or 429, never a 500.
func FuzzHandlers(f *testing.F) {
	f.Add([]byte(`{"api_key":"k"}`), "k", "GET", "/x?y", "1.2.3.4, 5.6.7.8", "2")
	f.Add([]byte(`{`), "", "", "", ",,,", "-1")
	rig := enforcertest.New(f, testRules)
	h := Handler(rig.E, Config{}, rig.Reg, nil, hclog.NewNullLogger())
	f.Fuzz(func(t *testing.T, body []byte, key, method, uri, xff, hits string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check", bytes.NewReader(body)))
		if c := rec.Code; c != 200 && c != 400 && c != 429 {
			t.Fatalf("/v1/check: %d %s", c, rec.Body)
		}
		req := httptest.NewRequest("GET", "/v1/auth", nil)
		for k, v := range map[string]string{"X-Api-Key": key, "X-Forwarded-Method": method, "X-Forwarded-Uri": uri, "X-Forwarded-For": xff, "X-RateLimit-Hits": hits} {
			req.Header[k] = []string{v}
		}
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if c := rec.Code; c != 200 && c != 400 && c != 429 {
			t.Fatalf("/v1/auth: %d %s", c, rec.Body)
		}
	})
}

// TestForwardAuthPathSpellings: every spelling of a route counts against the route's rule
// (issue 27: "/v1/login/", "//v1/login", "/v1/./login", "/V1/login", "/v1/%6cogin" and
// "/v1/login;x" each had a fresh bucket).
func TestForwardAuthPathSpellings(t *testing.T) {
	_, srv := server(t, Config{RefuseStatus: 403}, nil)
	h := map[string]string{"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/v1/ip-limited", "X-Forwarded-For": "198.51.100.4"}
	if resp := auth(t, srv.URL, h); resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	for _, uri := range []string{"/v1/ip-limited/", "//v1/ip-limited", "/v1/./ip-limited", "/V1/ip-limited",
		"/v1/ip-%6cimited", "/v1/ip-limited;x", "/v1/x/../ip-limited", "/v1/ip-limited?x=1"} {
		h["X-Forwarded-Uri"], h["X-Api-Key"] = uri, "k"+uri // a fresh key: the default rule stays quiet
		if resp := auth(t, srv.URL, h); resp.StatusCode != 403 || resp.Header.Get("X-RateLimit-Rule") != "per-ip" {
			t.Errorf("%s: %d by %q, want 403 by per-ip", uri, resp.StatusCode, resp.Header.Get("X-RateLimit-Rule"))
		}
	}
	// The JSON check normalises the same way.
	if resp, b := post(t, srv.URL, `{"api_key":"kj","endpoint":"get //V1/ip-limited/","ip":"198.51.100.4"}`); resp.StatusCode != 429 {
		t.Errorf("JSON spelling: %d %s, want 429", resp.StatusCode, b)
	}
}
