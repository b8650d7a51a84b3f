package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// -version works before any config is read; a test binary is not stamped, so it says dev.
func TestVersionFlag(t *testing.T) {
	env := func(k string) string { return map[string]string{"ALLOT_CONFIG": "/nonexistent"}[k] }
	for _, args := range [][]string{{"-version"}, {"-config", "../../configs/balancer.yaml", "-regions", "", "-version"}} {
		var out, errb bytes.Buffer
		if code := run(args, env, &out, &errb); code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errb.String())
		}
		want := "balancer dev (commit unknown, " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
		if out.String() != want {
			t.Fatalf("%q: stdout %q, want %q", args, out.String(), want)
		}
	}
}

func TestProbe(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "ready: standby")
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	none := func(string) string { return "" }
	var out, errb bytes.Buffer
	if code := probeCmd([]string{"-http-addr", srv.Listener.Addr().String()}, none, &out, &errb); code != 0 || out.String() != "ready: standby\n" {
		t.Fatalf("plain: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}

	// admin.tls puts TLS on the HTTP listener: the probe follows the config file there.
	tlsSrv := httptest.NewTLSServer(h)
	defer tlsSrv.Close()
	cfg := filepath.Join(t.TempDir(), "b.yaml")
	body := fmt.Sprintf("listen: {http: %q}\nadmin: {enabled: true, tls: {enabled: true, cert_file: c.pem, key_file: k.pem}}\n", tlsSrv.Listener.Addr().String())
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	env := func(k string) string { return map[string]string{"ALLOT_CONFIG": cfg}[k] }
	if code := probeCmd(nil, env, &out, &errb); code != 0 || out.String() != "ready: standby\n" {
		t.Fatalf("TLS: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}

	srv.Close()
	errb.Reset()
	if code := probeCmd([]string{"-http-addr", srv.Listener.Addr().String()}, none, &out, &errb); code != 1 || !strings.Contains(errb.String(), "balancer probe:") {
		t.Fatalf("nothing listening: exit %d, stderr %q", code, errb.String())
	}
}
