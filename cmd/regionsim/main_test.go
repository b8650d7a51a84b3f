package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const small = `name: small
duration: 40s
seed: 1
regions:
  us-east: {enforcers: 2}
  eu-west: {enforcers: 2}
keys:
  - name: k
    limit: {rate: 100, per: 1s}
    phases:
      - {at: 0s, offered: {us-east: 60, eu-west: 60}}
`

func TestExitStatus(t *testing.T) {
	var out, errb bytes.Buffer
	bad := write(t, strings.Replace(small, "    limit:", "    colour: red\n    limit:", 1))
	if rc := run([]string{"run", "-scenario", bad}, &out, &errb); rc != 2 {
		t.Fatalf("bad scenario: rc %d, want 2", rc)
	}
	if !strings.Contains(errb.String(), "s.yaml:9: keys[0].colour: unknown field") {
		t.Fatalf("stderr %q does not name the field and line", errb.String())
	}

	ok := write(t, small)
	out.Reset()
	if rc := run([]string{"run", "-scenario", ok, "-policy", "static", "-json"}, &out, &errb); rc != 0 {
		t.Fatalf("passing scenario: rc %d\n%s", rc, out.String())
	}
	var sum map[string]any
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatalf("-json output: %v\n%s", err, out.String())
	}
	for _, f := range []string{"scenario", "policy", "pass", "failures", "keys"} {
		if _, ok := sum[f]; !ok {
			t.Fatalf("summary lacks %q: %s", f, out.String())
		}
	}
	if len(sum) != 5 || sum["policy"] != "static" {
		t.Fatalf("summary %v", sum)
	}
	key := sum["keys"].([]any)[0].(map[string]any)
	for _, f := range []string{"key", "rate", "burst", "offered", "admitted", "max_window_ratio", "max_window_ratio_60s", "max_window_ratio_300s", "steady_ratio", "steady_split", "recovery_s", "store_calls_per_request"} {
		if _, ok := key[f]; !ok {
			t.Fatalf("key entry lacks %q: %v", f, key)
		}
	}
	if len(key) != 12 {
		t.Fatalf("key entry has extra fields: %v", key)
	}

	over := write(t, strings.Replace(small, "60, eu-west: 60", "150, eu-west: 150", 1))
	dir := t.TempDir()
	sumFile := filepath.Join(dir, "sum.json")
	out.Reset()
	if rc := run([]string{"run", "-scenario", over, "-policy", "full", "-summary", sumFile, "-out", dir}, &out, &errb); rc != 1 {
		t.Fatalf("over-admitting run: rc %d, want 1\n%s", rc, out.String())
	}
	if !strings.Contains(out.String(), "max_window_ratio") || !strings.Contains(out.String(), "FAIL") {
		t.Fatalf("table:\n%s", out.String())
	}
	for _, f := range []string{"sum.json", "small-full.csv", "k-admitted.svg", "k-admitted.png", "k-shares.svg", "k-shares.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("missing output: %v", err)
		}
	}
	if rc := run([]string{"run", "-scenario", ok, "-policy", "nope"}, &out, &errb); rc != 2 {
		t.Fatalf("bad policy: rc %d, want 2", rc)
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"-version", "--version"} {
		var out, errb bytes.Buffer
		if rc := run([]string{arg}, &out, &errb); rc != 0 {
			t.Fatalf("%s: rc %d: %s", arg, rc, errb.String())
		}
		want := "regionsim dev (commit unknown, " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
		if out.String() != want {
			t.Fatalf("%s: stdout %q, want %q", arg, out.String(), want)
		}
	}
	var out, errb bytes.Buffer
	if rc := run([]string{"-h"}, &out, &errb); rc != 0 || !strings.Contains(out.String(), "regionsim -version") {
		t.Fatalf("usage does not list -version: %q", out.String())
	}
}
