package app

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/httpapi"
	"github.com/allot-dev/allot/pkg/testenv"
)

// TestUsageJudgesTheBalancersShare: the usage table's pressure test and the reports'
// regional_rate use the share the balancer gave this region, not the compiled default
// split. (The app once built the table before setting its RegionalRate hook: NewTable
// copies the config, so production judged every key against its default share.)
func TestUsageJudgesTheBalancersShare(t *testing.T) {
	cfg := twoRegions(t)
	cfg.Balancer.Enabled, cfg.Balancer.Addrs = true, []string{"127.0.0.1:1"} // never reached: no Run
	cfg.Balancer.TLS = reportTLS(testenv.Certs(t, "", cfg.Region), cfg.Region)
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	now := time.Now()
	a.Shares().Apply(contract.Head{LeaderRev: 1, Version: 1, PublishedAt: now, Entries: 1},
		[]contract.Entry{{Rule: "default", Identity: "key:k", Shares: map[string]float64{"us-east": 0.9, "eu-west": 0.1}}}, now)
	rule := a.holder.Current().Rule("default")
	if rule == nil {
		t.Fatal("no default rule")
	}
	a.node.Usage().ObserveTake(rule, "key:k", 10, true, false, enforcer.SourceRedis, time.Now())
	r := a.node.Usage().Report(time.Now())
	if len(r.Usage) != 1 {
		t.Fatalf("report %v, want one entry", r.Usage)
	}
	if got := r.Usage[0].RegionalRate; math.Abs(got-90) > 1e-9 {
		t.Fatalf("regional_rate %v, want 90 (100/s × the balancer's 0.9, not the default 0.5)", got)
	}
}

// An enforcer started while etcd is unreachable (issue 21 §1d) does not know what the
// balancer gave its region: it enforces min(default share, shares.floor) until the set is
// read, and /readyz says so while staying in rotation (200, degraded).
func TestSharesNotLoadedEnforceTheFloor(t *testing.T) {
	cfg := twoRegions(t)
	cfg.Etcd.Endpoints = []string{"127.0.0.1:1"} // nothing listens there
	cfg.Etcd.StartTimeout, cfg.Etcd.DialTimeout = 200*time.Millisecond, 200*time.Millisecond
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rule := a.holder.Current().Rule("default")
	if s := a.Shares().Share(rule, "key:k", time.Now()); math.Abs(s-0.01) > 1e-12 {
		t.Fatalf("share %v before the set is loaded, want min(0.5, floor 0.01)", s)
	}
	err = a.Ready()
	if err == nil || !strings.Contains(err.Error(), "shares: not loaded") || !errors.Is(err, httpapi.ErrDegraded) {
		t.Fatalf("Ready: %v, want degraded naming the shares", err)
	}
}

// twoRegions is a us-east enforcer's config of two equal regions, one rule of 100/s, on
// loopback ports of its own.
func twoRegions(t *testing.T) Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - id: default\n    limits: [{name: second, rate: 100, per: 1s}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules.File = "us-east", path
	cfg.Regions = contract.Regions{"us-east": 1, "eu-west": 1}
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	return cfg
}
