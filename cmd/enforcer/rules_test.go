package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/rules"
)

const envoyExamples = "../../configs/envoy-ratelimit/config"

func runRules(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"rules"}, args...), os.Getenv, &out, &errb)
	return code, out.String(), errb.String()
}

func TestRulesCheckEnvoyFormat(t *testing.T) {
	if code, out, errs := runRules(t, "check", "--format", "envoy-ratelimit", envoyExamples); code != 0 || !strings.Contains(out, "ok, 11 domains,") {
		t.Fatalf("exit %d, %q %q", code, out, errs)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: sec, requests_per_unit: 1}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("domain: b\ndescriptors:\n  - key: k\n    ratelimit: {}\n"), 0o644)
	code, _, errs := runRules(t, "check", "-format", "envoy-ratelimit", dir)
	if code != 1 || !strings.Contains(errs, "a.yaml:4: invalid rate limit unit 'sec'") || !strings.Contains(errs, "b.yaml:4: unknown key 'ratelimit'") {
		t.Fatalf("exit %d, %q", code, errs)
	}
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: a\nunit: second\n"), 0o644)
	os.Remove(filepath.Join(dir, "b.yaml"))
	if code, _, errs := runRules(t, "check", "--format=envoy-ratelimit", dir); code != 0 || !strings.Contains(errs, "warning: "+filepath.Join(dir, "a.yaml")+":2: key 'unit' has no meaning") {
		t.Fatalf("a warning: exit %d, %q", code, errs)
	}
	for _, args := range [][]string{
		{"check", "--format", "xml", "x"}, {"check", "--merge-domains", "x"}, {"import"}, {"import", "a", "b"}, {"import", "--format", "allot", "x"},
	} {
		if code, _, _ := runRules(t, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}

// enforcer rules import prints native rules which, loaded as a rule file, make the same
// decisions as the envoyproxy/ratelimit files they came from.
func TestRulesImportRoundTrip(t *testing.T) {
	code, out, errs := runRules(t, "import", envoyExamples)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, %q", code, errs)
	}
	file := filepath.Join(t.TempDir(), "imported.yaml")
	os.WriteFile(file, []byte(out), 0o644)
	if code, _, errs := runRules(t, "check", file); code != 0 {
		t.Fatalf("check of the import: exit %d, %s\n%s", code, errs, out)
	}
	set, _, err := rules.LoadEnvoyDir(envoyExamples, false)
	if err != nil {
		t.Fatal(err)
	}
	fromEnvoy := enforcertest.New(t, "rules: []\n", func(c *enforcer.Config) {
		snap, err := rules.Compile(set, rules.CompileOptions{Region: "us-east", Now: enforcertest.Start})
		if err != nil {
			t.Fatal(err)
		}
		c.Rules = rules.NewHolder(snap)
	})
	imported := enforcertest.New(t, out)

	type req struct {
		domain string
		kv     []string
	}
	reqs := []req{
		{"mongo_cps", []string{"database", "users"}}, {"mongo_cps", []string{"database", "other"}},
		{"messaging", []string{"message_type", "marketing", "to_number", "2061111111"}}, {"messaging", []string{"to_number", "2061111111"}},
		{"messaging", []string{"message_type", "marketing", "to_number", "2062222222"}},
		{"edge_proxy_per_ip", []string{"remote_address", "50.0.0.1"}}, {"edge_proxy_per_ip", []string{"remote_address", "50.0.0.5"}},
		{"example4", []string{"key", "value", "subkey", "x"}}, {"example4", []string{"key", "value"}},
		{"internal", []string{"ldap", "x"}}, {"internal", []string{"azure", "x"}},
		{"example6", []string{"service", "s", "user", "user-a"}}, {"example6", []string{"service", "s", "user", "user-b"}},
		{"example7", []string{"key_1", "value_1", "user", "bkthomps"}}, {"example7", []string{"key_2", "value_2", "user", "bkthomps"}},
		{"example8", []string{"key1", "v"}}, {"example8", []string{"key1", "value1"}},
		{"example9", []string{"key1", "value9"}}, {"example9", []string{"path", "/api/1/action"}}, {"example9", []string{"route", "/api/v1/resource/2/action"}},
		{"example10", []string{"route", "r", "http_method", "GET", "subject_id", "1"}},
		{"example11", []string{"files", "files/a"}}, {"example11", []string{"files", "files/b"}}, {"example11", []string{"files_no_share", "files_no_share/a"}},
		{"nowhere", []string{"k", "v"}},
	}
	ctx := context.Background()
	decide := func(r *enforcertest.Rig, q req) enforcer.Decision {
		t.Helper()
		a := rules.Attrs{Domain: q.domain}
		for i := 0; i+1 < len(q.kv); i += 2 {
			a.Entries = append(a.Entries, rules.Entry{Key: q.kv[i], Value: q.kv[i+1]})
		}
		d, err := r.E.Check(ctx, &enforcer.Request{Attrs: a})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	refused := 0
	for round := range 30 {
		for _, q := range reqs {
			a, b := decide(fromEnvoy, q), decide(imported, q)
			if a != b {
				t.Fatalf("round %d, %s %v:\nenvoy files: %+v\nimported:    %+v", round, q.domain, q.kv, a, b)
			}
			if !a.Allowed {
				refused++
			}
		}
		fromEnvoy.Clock.Advance(100 * time.Millisecond)
		imported.Clock.Advance(100 * time.Millisecond)
	}
	if refused == 0 {
		t.Fatal("no request was refused: the comparison saw no limit bite")
	}
}
