package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/hashicorp/go-hclog"
)

const inflightRules = `
rules:
  - id: exports
    limits: [{name: inflight, concurrent: 1, timeout: 30s}]
`

func postTo(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// POST /v1/check acquires and answers a handle; POST /v1/release gives it back once.
func TestCheckHandleAndRelease(t *testing.T) {
	rig := enforcertest.New(t, inflightRules)
	srv := httptest.NewServer(Handler(rig.E, Config{}, rig.Reg, nil, hclog.NewNullLogger()))
	t.Cleanup(srv.Close)
	check := `{"api_key":"k"}`
	code, b := postTo(t, srv.URL+"/v1/check", check)
	var out CheckResponse
	if err := json.Unmarshal(b, &out); err != nil || code != 200 || out.Handle == "" || out.Limit != "exports/inflight" {
		t.Fatalf("check: %d %s", code, b)
	}
	if code, b := postTo(t, srv.URL+"/v1/check", check); code != 429 {
		t.Fatalf("second check while the first is in flight: %d %s", code, b)
	}
	rel, _ := json.Marshal(ReleaseRequest{Handle: out.Handle})
	if code, b := postTo(t, srv.URL+"/v1/release", string(rel)); code != 200 || !strings.Contains(string(b), `"released":true`) {
		t.Fatalf("release: %d %s", code, b)
	}
	if code, b := postTo(t, srv.URL+"/v1/release", string(rel)); code != 404 || !strings.Contains(string(b), "unknown or expired handle") {
		t.Fatalf("second release: %d %s", code, b)
	}
	for _, bad := range []string{`{"handle":"nope"}`, `{"handle":""}`, `{"handel":"x"}`, `[`, ``} {
		if code, b := postTo(t, srv.URL+"/v1/release", bad); code != 400 {
			t.Errorf("release %q: %d %s, want 400", bad, code, b)
		}
	}
	if code, b := postTo(t, srv.URL+"/v1/check", check); code != 200 {
		t.Fatalf("check after the release: %d %s", code, b)
	}
}

// The middleware releases when the handler returns, and when it panics.
func TestMiddlewareReleases(t *testing.T) {
	rig := enforcertest.New(t, inflightRules)
	mem := rig.Store.(*bucket.Memory)
	var during int
	h := Middleware(rig.E, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		during = mem.Held("key:k", "exports/inflight")
		if r.URL.Path == "/panic" {
			panic(http.ErrAbortHandler)
		}
	}))
	for _, path := range []string{"/ok", "/ok", "/panic", "/ok"} {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-Api-Key", "k")
		w := httptest.NewRecorder()
		func() {
			defer func() { _ = recover() }()
			h.ServeHTTP(w, r)
		}()
		if w.Code != 200 || during != 1 {
			t.Fatalf("%s: %d, %d held while serving; want 200, 1", path, w.Code, during)
		}
		if n := mem.Held("key:k", "exports/inflight"); n != 0 {
			t.Fatalf("%s: %d slots held after the handler returned", path, n)
		}
	}
}
