package main

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/balancer/app"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/enforcer/httpapi"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "alice-secret-0123456789"

// TestCLI drives every admin command against a balancer replica with the admin API on,
// over real etcd, and `explain` against an enforcer's /v1/explain found in the registry.
func TestCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("needs an etcd container")
	}
	e := testenv.Etcd(t, 1)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	write(t, tokens, "alice:"+secret+"\n")
	f := testenv.Certs(t, filepath.Join(dir, "certs"), "us-east")
	cfg, err := app.Parse([]string{"-config", "../../configs/balancer.yaml", "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-etcd-endpoints", strings.Join(e.Endpoints(), ","), "-rules-file", "", "-rules-etcd-prefix", "/allot/rules/",
		"-admin", "-admin-tokens-file", tokens, "-session-ttl", "2s",
		"-tls-cert", f.Balancer(), "-tls-key", f.BalancerKey(), "-tls-client-ca", f.CA()}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for ok, _ := a.Service().Leading(); !ok; ok, _ = a.Service().Leading() {
		if time.Now().After(deadline) {
			t.Fatal("not leading within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	env := map[string]string{"ALLOT_ADMIN_TOKEN": secret, "ALLOT_ADMIN_ADDR": a.HTTPAddr()}
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := cli(args, cliEnv{getenv: func(k string) string { return env[k] }, stdout: &out, stderr: &errb})
		return code, out.String(), errb.String()
	}
	expect := func(code int, out, errOut string, wantCode int, want string) {
		t.Helper()
		if code != wantCode || !strings.Contains(out+errOut, want) {
			t.Fatalf("exit %d, want %d with %q\nstdout: %s\nstderr: %s", code, wantCode, want, out, errOut)
		}
	}

	for _, args := range [][]string{{"rules", "-h"}, {"rules", "apply", "-h"}, {"shares", "-h"}} {
		code, _, errOut := run(args...)
		expect(code, "", errOut, 0, "usage: balancer COMMAND")
	}
	code, out, errOut := run("rules", "frobnicate")
	expect(code, out, errOut, 2, "usage: balancer COMMAND")

	good := filepath.Join(dir, "rules.yaml")
	write(t, good, "rules:\n  - id: default\n    limits: [{name: second, rate: 20, per: 1s, burst: 40}]\n")
	code, out, errOut = run("rules", "apply", "-f", good, "-reason", "OPS-7 baseline")
	expect(code, out, errOut, 0, "changed 1 rules at revision")
	code, out, errOut = run("rules", "list")
	expect(code, out, errOut, 0, `/allot/rules/default`)

	bad := filepath.Join(dir, "bad.yaml")
	write(t, bad, "rules:\n  - id: default\n    limits: [{name: second, rate: 20, per: 1s}]\n  - id: broken\n    limits: [{name: second, rate: 0, per: 1s}]\n")
	code, out, errOut = run("rules", "apply", "-f", bad, "-reason", "x")
	expect(code, out, errOut, 1, bad+`:5: rule "broken": limits[0].rate: 0, must be finite and > 0`)
	code, out, errOut = run("rules", "check", "-f", bad)
	expect(code, out, errOut, 1, `rule "broken": limits[0].rate`)

	code, out, errOut = run("override", "set", "k_acme", "-rate", "500", "-burst", "1000", "-reason", "launch")
	expect(code, out, errOut, 1, "expires_at: missing")
	code, out, errOut = run("override", "set", "k_acme", "-rate", "500", "-burst", "1000", "-expires", "72h", "-reason", "launch week")
	expect(code, out, errOut, 0, "override:k_acme")
	code, out, errOut = run("override", "list")
	expect(code, out, errOut, 0, "k_acme")

	code, out, errOut = run("shares", "k_other")
	expect(code, out, errOut, 0, "key:k_other (from the core)")
	if !strings.Contains(out, "us-east") || !strings.Contains(out, "(default split)") {
		t.Fatalf("shares output:\n%s", out)
	}

	// One enforcer per region, found through the registry.
	tk, _ := adminauth.Parse("alice:" + secret)
	for _, region := range []string{"us-east", "eu-west"} {
		rig := enforcertest.New(t, "rules:\n  - id: default\n    limits: [{name: second, rate: 20, per: 1s, burst: 40}]\n")
		srv := httptest.NewServer(httpapi.ExplainHandler(rig.E, httpapi.ExplainConfig{Tokens: tk}))
		t.Cleanup(srv.Close)
		rec := `{"id":"e1","region":"` + region + `","addr":"x:1","http_addr":"` + strings.TrimPrefix(srv.URL, "http://") + `"}`
		if _, err := e.Client(t).Put(context.Background(), "/allot/enforcers/"+region+"/e1", rec); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut = run("explain", "k_acme", "-endpoint", "GET /v1/search")
	expect(code, out, errOut, 0, "eu-west/e1")
	t.Logf("balancer explain:\n%s", out)
	for _, want := range []string{"us-east/e1", "rule default", "default/second", "second global", "20/s burst 40", "second level", "40.0"} {
		if !strings.Contains(out, want) {
			t.Fatalf("explain output lacks %q:\n%s", want, out)
		}
	}

	code, out, errOut = run("audit")
	expect(code, out, errOut, 0, "alice")
	if !strings.Contains(out, "override.set") || !strings.Contains(out, "OPS-7 baseline") {
		t.Fatalf("audit:\n%s", out)
	}

	env["ALLOT_ADMIN_TOKEN"] = "wrong-secret-0123456789"
	code, out, errOut = run("rules", "list")
	expect(code, out, errOut, 1, "401 Unauthorized")
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
