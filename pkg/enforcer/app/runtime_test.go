package app

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestApplyRuntime(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	cfg := DefaultConfig()
	if got := ApplyRuntime(&cfg, env(nil)); got != "gc_percent 400" {
		t.Fatalf("ApplyRuntime = %q", got)
	}
	if p := debug.SetGCPercent(100); p != DefaultGCPercent {
		t.Fatalf("GC percent %d after ApplyRuntime, want %d", p, DefaultGCPercent)
	}
	// GOGC in the environment wins: the runtime has applied it already.
	if got := ApplyRuntime(&cfg, env(map[string]string{"GOGC": "150"})); !strings.Contains(got, "GOGC=150") {
		t.Fatalf("ApplyRuntime with GOGC set = %q", got)
	}
	if p := debug.SetGCPercent(100); p != 100 {
		t.Fatalf("GC percent %d after ApplyRuntime with GOGC set, want it left at 100", p)
	}
}

func TestGCPercentValidated(t *testing.T) {
	for _, args := range [][]string{{"-gc-percent", "0"}, {"-gc-percent", "-1"}} {
		_, err := Parse(append([]string{"-region", "r"}, args...), env(nil), nil)
		if err == nil || !strings.Contains(err.Error(), "gc_percent") {
			t.Errorf("%v: %v, want an error naming gc_percent", args, err)
		}
	}
	cfg, err := Parse([]string{"-region", "r", "-rules-file", "rules.yaml", "-gc-percent", "200"}, env(nil), nil)
	if err != nil || cfg.GCPercent != 200 {
		t.Fatalf("-gc-percent 200: %v %d", err, cfg.GCPercent)
	}
}
