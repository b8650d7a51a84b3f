package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
