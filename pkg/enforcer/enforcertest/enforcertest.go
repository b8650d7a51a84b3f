// Package enforcertest builds Enforcers for tests: an exact in-memory store, a fake clock
// and a fresh Prometheus registry, with rules from YAML.
package enforcertest

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/prometheus/client_golang/prometheus"
)

// Start is the fake clock's initial time.
var Start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Rig is an Enforcer and what it was built from.
type Rig struct {
	E     *enforcer.Enforcer
	Clock *clock.Fake
	Reg   *prometheus.Registry
	Rules *rules.Holder
	Store bucket.Store
}

// Compile parses and compiles yaml for region us-east at now, failing t on error.
func Compile(t testing.TB, yaml string, now time.Time) *rules.Snapshot {
	t.Helper()
	set, err := rules.ParseYAML([]byte(yaml))
	if err != nil {
		t.Fatalf("parse rules: %v", err)
	}
	snap, err := rules.Compile(set, rules.CompileOptions{Region: "us-east", Now: now})
	if err != nil {
		t.Fatalf("compile rules: %v", err)
	}
	return snap
}

// New builds an Enforcer over a memory store with the rules in yaml. mod may change the
// config (set a Store to replace the memory store) before New.
func New(t testing.TB, yaml string, mod ...func(*enforcer.Config)) *Rig {
	t.Helper()
	clk := clock.NewFake(Start)
	r := &Rig{Clock: clk, Reg: prometheus.NewRegistry(), Rules: rules.NewHolder(Compile(t, yaml, Start))}
	cfg := enforcer.DefaultConfig()
	cfg.Region, cfg.Rules, cfg.Store, cfg.Clock, cfg.Registerer = "us-east", r.Rules, bucket.NewMemory(clk, 0), clk, r.Reg
	cfg.ResetJitterMax, cfg.ResetJitterRatio = 0, 0 // exact headers in tests
	for _, f := range mod {
		f(&cfg)
	}
	r.Store = cfg.Store
	e, err := enforcer.New(cfg)
	if err != nil {
		t.Fatalf("enforcer.New: %v", err)
	}
	r.E = e
	return r
}
