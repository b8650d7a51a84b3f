package rules

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/hashicorp/go-hclog"
)

func envoyFile(domain string, rpu int) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: " + strconv.Itoa(rpu) + "\n"
}

// limitOfRule is the global per-second rate of rule id in h's snapshot, -1 if none.
func limitOfRule(h *Holder, id string) float64 {
	r := h.Current().Rule(id)
	if r == nil || len(r.Global) == 0 {
		return -1
	}
	return r.Global[0].Rate
}

// A directory with a broken file never replaces a good set; the error names file and
// line; a good directory goes in; several files, one domain each.
func TestEnvoyDirSourceReloadKeepsOldOnBadFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), envoyFile("a", 10))
	writeFile(t, filepath.Join(dir, "b.yml"), envoyFile("b", 20))
	clk := clock.NewFake(t0)
	h := NewHolder(nil)
	var rec errRecorder
	src, err := NewEnvoyDirSource(dir, false, h, CompileOptions{}, WithClock(clk), WithOnError(rec.hook))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if limitOfRule(h, "a.k") != 10 || limitOfRule(h, "b.k") != 20 || src.Status().Loads != 1 {
		t.Fatalf("initial: a %v b %v status %+v", limitOfRule(h, "a.k"), limitOfRule(h, "b.k"), src.Status())
	}
	good := h.Current()

	// One broken file refuses the whole directory; the message names its file and line.
	writeFile(t, filepath.Join(dir, "b.yml"), "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")
	writeFile(t, filepath.Join(dir, "a.yaml"), envoyFile("a", 11))
	err = src.Reload()
	if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), filepath.Join(dir, "b.yml")+":4: invalid rate limit unit 'fortnight'") {
		t.Fatalf("Reload with a bad file: %v", err)
	}
	if h.Current() != good || rec.count() != 1 || src.Status().Failures != 1 {
		t.Fatalf("a bad directory replaced the rules (a %v) or was not reported (%d)", limitOfRule(h, "a.k"), rec.count())
	}
	// A file that parses but does not compile is refused the same way.
	writeFile(t, filepath.Join(dir, "b.yml"), "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n")
	if err := src.Reload(); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "b.yml")+":4: rule \"b.k\": limits[0].rate") || h.Current() != good {
		t.Fatalf("Reload with a rate no bucket holds: %v", err)
	}
	// Two files of one domain are refused unless merged.
	writeFile(t, filepath.Join(dir, "b.yml"), envoyFile("a", 5))
	if err := src.Reload(); err == nil || !strings.Contains(err.Error(), "duplicate domain 'a'") || h.Current() != good {
		t.Fatalf("Reload with a domain twice: %v", err)
	}
	// Fixed: both changes go in.
	writeFile(t, filepath.Join(dir, "b.yml"), envoyFile("b", 21))
	clk.Advance(time.Minute)
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if limitOfRule(h, "a.k") != 11 || limitOfRule(h, "b.k") != 21 || src.Status().LastError != nil || !h.Current().Created().Equal(t0.Add(time.Minute)) {
		t.Fatalf("after a good reload: a %v b %v %+v", limitOfRule(h, "a.k"), limitOfRule(h, "b.k"), src.Status())
	}
	cur := h.Current()
	if err := src.Reload(); err != nil || h.Current() != cur {
		t.Fatalf("same content: %v, swapped %v", err, h.Current() != cur)
	}
	// The directory gone: unreadable, not invalid; the rules in force stay.
	os.RemoveAll(dir)
	if err := src.Reload(); err == nil || errors.Is(err, ErrInvalid) || h.Current() != cur {
		t.Fatalf("directory gone: %v", err)
	}
	src.Close()
	if err := src.Reload(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Reload after Close: %v", err)
	}
}

func TestNewEnvoyDirSourceRefusesBadDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limt: {}\n")
	h := NewHolder(nil)
	if _, err := NewEnvoyDirSource(dir, false, h, CompileOptions{}); err == nil || !strings.Contains(err.Error(), "a.yaml:4: unknown key 'rate_limt'") {
		t.Fatalf("got %v", err)
	}
	if _, err := NewEnvoyDirSource(filepath.Join(dir, "missing"), false, h, CompileOptions{}); err == nil {
		t.Fatal("a missing directory accepted")
	}
	if h.Current().Version() != "" {
		t.Fatal("a bad directory reached the holder")
	}
}

// Their runtime layout: RUNTIME_ROOT is a symlink swapped to a new tree; merged domains;
// warnings for what is not used.
func TestEnvoyDirSourceRuntimeLayout(t *testing.T) {
	root := t.TempDir()
	mk := func(name string, files map[string]string) {
		t.Helper()
		dir := filepath.Join(root, name, "ratelimit", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for n, c := range files {
			writeFile(t, filepath.Join(dir, n), c)
		}
	}
	mk("v1", map[string]string{"a.yaml": envoyFile("a", 10), "a2.yaml": "domain: a\ndescriptors:\n  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 7}\n", "notes.txt": "x"})
	mk("v2", map[string]string{"a.yaml": envoyFile("a", 30)})
	current := filepath.Join(root, "current")
	if err := os.Symlink(filepath.Join(root, "v1"), current); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
	clk := clock.NewFake(t0)
	h := NewHolder(nil)
	dir := filepath.Join(current, "ratelimit", "config") // RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config
	src, err := NewEnvoyDirSource(dir, true, h, CompileOptions{}, WithClock(clk), WithInterval(5*time.Second), WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	if limitOfRule(h, "a.k") != 10 || limitOfRule(h, "a.other") != 7.0/60 {
		t.Fatalf("merged domain: k %v other %v", limitOfRule(h, "a.k"), limitOfRule(h, "a.other"))
	}
	if !strings.Contains(logs.String(), "notes.txt: not read") {
		t.Errorf("no warning for notes.txt in %q", logs.String())
	}
	sub, cancel := h.Subscribe()
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- src.Run(context.Background()) }()
	// Swap the symlink atomically, as their deploys do.
	tmp := filepath.Join(root, "current.tmp")
	if err := os.Symlink(filepath.Join(root, "v2"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, current); err != nil {
		t.Fatal(err)
	}
	waitTimers(t, clk, 1)
	clk.Advance(5 * time.Second)
	if s := recv(t, sub); s.Rule("a.k").Global[0].Rate != 30 || s.Rule("a.other") != nil {
		t.Fatalf("after the swap: %v", s.Rules())
	}
	src.Close()
	if err := <-runErr; !errors.Is(err, ErrClosed) {
		t.Fatalf("Run returned %v", err)
	}
}

func TestLoadEnvoyDir(t *testing.T) {
	set, warns, err := LoadEnvoyDir(envoyDir, false)
	if err != nil || len(set.Rules) == 0 || len(warns) != 0 {
		t.Fatalf("%v, %d rules, warnings %q", err, len(set.Rules), warns)
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\nunit: second\n")
	if _, warns, err = LoadEnvoyDir(dir, false); err != nil || len(warns) != 1 || !strings.Contains(warns[0], "a.yaml:2: key 'unit' has no meaning") {
		t.Fatalf("%v, warnings %q", err, warns)
	}
}
