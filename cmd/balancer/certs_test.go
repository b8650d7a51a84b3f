package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/balancer/app"
	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/tlsfiles"
)

var certsNow = func() time.Time { return time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC) }

// `balancer certs` writes what configs/balancer.yaml and configs/regions/*.yaml name (under
// their bin/certs), and the files load as the shipped configs' TLS sections.
func TestCertsCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	var out, errb bytes.Buffer
	if code := certsCmd([]string{"-dir", dir, "-regions", "us-east,eu-west,ap-south", "-hosts", "balancer.internal"},
		cliEnv{stdout: &out, stderr: &errb}, certsNow); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if n := strings.Count(out.String(), "wrote "); n != 10 {
		t.Fatalf("wrote %d files, want 10:\n%s", n, out.String())
	}
	cfg, err := app.Parse([]string{"-config", "../../configs/balancer.yaml"}, func(string) string { return "" }, &errb)
	if err != nil {
		t.Fatal(err)
	}
	f := certs.Files{Dir: dir}
	for _, p := range []string{cfg.Listen.TLS.CertFile, cfg.Listen.TLS.KeyFile, cfg.Listen.TLS.ClientCAFile} {
		if filepath.Dir(p) != "bin/certs" {
			t.Fatalf("configs/balancer.yaml names %s, not under bin/certs (the default -dir)", p)
		}
	}
	srv := app.ServerTLSConfig{Enabled: true, CertFile: f.Balancer(), KeyFile: f.BalancerKey(), ClientCAFile: f.CA()}
	if _, err := srv.Build(); err != nil {
		t.Fatal(err)
	}
	if _, err := (tlsfiles.Client{Enabled: true, CAFile: f.CA(), CertFile: f.Enforcer("eu-west"), KeyFile: f.EnforcerKey("eu-west")}).Build(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := certsCmd([]string{"-dir", dir, "-regions", "us-east"}, cliEnv{stdout: &out, stderr: &errb}, certsNow); code != 0 ||
		strings.Contains(out.String(), "wrote") {
		t.Fatalf("again: exit %d, %q, want every file kept", code, out.String())
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-dir", dir, "-regions", ""}, 1, "no regions"},
		{[]string{"-dir", dir, "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"-nope"}, 2, "flag provided but not defined"},
	} {
		errb.Reset()
		if code := certsCmd(tc.args, cliEnv{stdout: &out, stderr: &errb}, certsNow); code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d %q, want %d naming %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}
