package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
)

func TestRulesCheck(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"rules", "check", "../../configs/rules/example.yaml"}, os.Getenv, &out, &errb); code != 0 {
		t.Fatalf("example rules: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "ok") {
		t.Fatalf("stdout %q", out.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("rules:\n  - id: a\n    limits: [{name: s, rate: -1, per: 1s}]\n"), 0o644)
	out.Reset()
	errb.Reset()
	if code := run([]string{"rules", "check", bad}, os.Getenv, &out, &errb); code != 1 {
		t.Fatalf("bad rules: exit %d, want 1", code)
	}
	if msg := errb.String(); !strings.Contains(msg, `"a"`) || !strings.Contains(msg, "rate") || !strings.Contains(msg, "bad.yaml:3") {
		t.Fatalf("message %q should name the rule, field and line", msg)
	}
	if code := run([]string{"rules", "lint"}, os.Getenv, &out, &errb); code != 2 {
		t.Fatalf("usage: exit %d, want 2", code)
	}
}

func TestBadFlagsExit2(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"-no-such-flag"}, func(string) string { return "" }, &out, &errb); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if code := run([]string{"-h"}, func(string) string { return "" }, &out, &errb); code != 0 || !strings.Contains(errb.String(), "ALLOT_REDIS_PASSWORD") {
		t.Fatalf("-h: exit %d, usage %q", code, errb.String())
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
	args := []string{"-config", "../../configs/regions/us-east.yaml", "-rules-file", "../../configs/rules/example.yaml",
		"-balancer-tls-ca", f.CA(), "-balancer-tls-cert", f.Enforcer("us-east"), "-balancer-tls-key", f.EnforcerKey("us-east"),
		"-id", "us-east-1", "-check-config"}
	noEnv := func(string) string { return "" }
	defer func(e func() []string) { environ = e }(environ)
	environ = func() []string { return []string{"PATH=/bin", "ALLOT_REDIS_PASSWORD=x"} }
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		code int
		says string
	}{
		{"good", args, nil, 0, "configuration ok (region us-east, store redis-cluster, rules ../../configs/rules/example.yaml + etcd /allot/rules/)"},
		{"unknown flag", append(args[:len(args):len(args)], "-no-such-flag"), nil, 2, "flag provided but not defined: -no-such-flag"},
		{"bad value", append(args[:len(args):len(args)], "-lease-ttl", "-1s"), nil, 2, "lease.ttl -1s"},
		{"missing cert", append(args[:len(args):len(args)], "-balancer-tls-cert", dir+"/nope.pem"), nil, 1, "balancer.tls"},
		{"bad rules", append(args[:len(args):len(args)], "-rules-file", "../../configs/balancer.yaml"), nil, 1, "rules file"},
		{"unknown variable", args, []string{"ALLOT_REDIS_PASWORD=x"}, 1, "ALLOT_REDIS_PASWORD set, but the enforcer reads no such variable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != nil {
				environ = func() []string { return tc.env }
			} else {
				environ = func() []string { return []string{"PATH=/bin", "ALLOT_REDIS_PASSWORD=x"} }
			}
			var out, errb bytes.Buffer
			code := run(tc.args, noEnv, &out, &errb)
			if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.says) {
				t.Errorf("exit %d, want %d saying %q; stdout %q, stderr %q", code, tc.code, tc.says, out.String(), errb.String())
			}
		})
	}
}

// -check-config on envoyproxy/ratelimit's environment alone: valid, and each of their
// variables allot does not support named; a value it cannot honour is exit 2 naming it.
func TestCheckConfigEnvoyEnv(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644)
	vars := map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "REDIS_URL": "redis:6379",
		"REDIS_SOCKET_TYPE": "tcp", "USE_STATSD": "true", "MEMCACHE_HOST_PORT": "m:1"}
	defer func(e func() []string) { environ = e }(environ)
	environ = func() []string { return []string{"PATH=/bin"} }
	var out, errb bytes.Buffer
	code := run([]string{"-check-config"}, func(k string) string { return vars[k] }, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "configuration ok (region default, store redis, rules envoy-ratelimit "+dir+")") {
		t.Fatalf("exit %d; stdout %q, stderr %q", code, out.String(), errb.String())
	}
	for _, want := range []string{"variable USE_STATSD: not supported", "variable MEMCACHE_HOST_PORT: not supported", "compatibility on"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr %q does not say %q", errb.String(), want)
		}
	}
	vars["REDIS_TYPE"] = "sentinel"
	errb.Reset()
	if code := run([]string{"-check-config"}, func(k string) string { return vars[k] }, &out, &errb); code != 2 || !strings.Contains(errb.String(), "REDIS_TYPE") {
		t.Errorf("sentinel: exit %d, stderr %q", code, errb.String())
	}
}
