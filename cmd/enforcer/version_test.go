package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

// -version works wherever a user types it, before any config is read: a test binary is
// not stamped, so it says dev.
func TestVersionFlag(t *testing.T) {
	env := func(k string) string {
		return map[string]string{"ALLOT_CONFIG": "/nonexistent"}[k]
	}
	for _, args := range [][]string{{"-version"}, {"--version"}, {"-config", "/nonexistent", "-version"}} {
		var out, errb bytes.Buffer
		if code := run(args, env, &out, &errb); code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errb.String())
		}
		want := "enforcer dev (commit unknown, " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
		if out.String() != want {
			t.Fatalf("%q: stdout %q, want %q", args, out.String(), want)
		}
	}
}

func TestProbe(t *testing.T) {
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || down.Load() {
			http.Error(w, "app: closed", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	none := func(string) string { return "" }

	// The address from a flag, and from the environment as a container's health check
	// sees it; nothing else of the configuration is needed (no region, no rules).
	for _, tc := range []struct {
		args []string
		env  func(string) string
	}{
		{[]string{"probe", "-http-addr", addr}, none},
		{[]string{"probe"}, func(k string) string { return map[string]string{"ALLOT_HTTP_ADDR": addr}[k] }},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, tc.env, &out, &errb); code != 0 || out.String() != "ready\n" {
			t.Fatalf("%q: exit %d, stdout %q, stderr %q", tc.args, code, out.String(), errb.String())
		}
	}
	down.Store(true)
	var out, errb bytes.Buffer
	if code := run([]string{"probe", "-http-addr", addr}, none, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "503") || !strings.Contains(errb.String(), "app: closed") {
		t.Fatalf("not ready: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"probe", "-http-addr", addr, "-nope"}, none, &out, &errb); code != 2 {
		t.Fatalf("bad flag: exit %d, want 2", code)
	}
	srv.Close()
	errb.Reset()
	if code := run([]string{"probe", "-http-addr", addr}, none, &out, &errb); code != 1 || !strings.Contains(errb.String(), "enforcer probe:") {
		t.Fatalf("nothing listening: exit %d, stderr %q", code, errb.String())
	}
}
