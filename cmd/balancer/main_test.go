package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
)

func TestRunExitCodes(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"-h"}, func(string) string { return "" }, &out, &out); code != 0 || !strings.Contains(out.String(), "ALLOT_ETCD_ENDPOINTS") {
		t.Fatalf("-h: exit %d, usage %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"-config", "../../configs/balancer.yaml", "-regions", ""}, func(string) string { return "" }, &out, &out); code != 2 ||
		!strings.Contains(out.String(), "regions is empty") {
		t.Fatalf("bad config: exit %d, %q", code, out.String())
	}
}

// -check-config: 0 when the configuration and the files it names are good, 1 when a named
// file or an ALLOT_* variable is wrong, 2 when a setting is (as without it).
func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	if _, err := certs.Generate(dir, certs.Options{Regions: []string{"us-east"}, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	f := certs.Files{Dir: dir}
	args := []string{"-config", "../../configs/balancer.yaml", "-rules-file", "../../configs/rules/example.yaml",
		"-tls-cert", f.Balancer(), "-tls-key", f.BalancerKey(), "-tls-client-ca", f.CA(), "-check-config"}
	noEnv := func(string) string { return "" }
	defer func(e func() []string) { environ = e }(environ)
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		code int
		says string
	}{
		{"good", args, []string{"ALLOT_ETCD_PASSWORD=x", "ALLOT_DASHBOARD_TOKENS=ops:0123456789abcdef0123"}, 0, "configuration ok (regions us-east,eu-west,ap-south, etcd http://127.0.0.1:2379)"},
		{"unknown flag", append(args[:len(args):len(args)], "-no-such-flag"), nil, 2, "flag provided but not defined: -no-such-flag"},
		{"bad value", append(args[:len(args):len(args)], "-regions", ""), nil, 2, "regions is empty"},
		{"missing key", append(args[:len(args):len(args)], "-tls-key", dir+"/nope.pem"), nil, 1, "listen.tls"},
		{"bad rules", append(args[:len(args):len(args)], "-rules-file", "../../configs/balancer.yaml"), nil, 1, "rules file"},
		{"unknown variable", args, []string{"ALLOT_ETCD_PASWORD=x"}, 1, "ALLOT_ETCD_PASWORD set, but the balancer reads no such variable"},
		{"bad tokens", args, []string{"ALLOT_DASHBOARD_TOKENS=nocolon"}, 1, "$ALLOT_DASHBOARD_TOKENS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			environ = func() []string { return tc.env }
			var out bytes.Buffer
			code := run(tc.args, noEnv, &out, &out)
			if code != tc.code || !strings.Contains(out.String(), tc.says) {
				t.Errorf("exit %d, want %d saying %q; said %q", code, tc.code, tc.says, out.String())
			}
		})
	}
}
