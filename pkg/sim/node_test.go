package sim

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer/app"
	"github.com/allot-dev/allot/pkg/enforcer/node"
	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// TestAppAndRegionsimBuildTheSameNode: the enforcer binary and regionsim compose their
// enforcers with the same node.Build, and from the same deployment — two equal regions,
// the balancer's shares and usage reports on, a 10 s interval, a store standing for
// Redis — they give it the same settings: the same lease and fallback layers, the same
// share table (its floor, staleness, and the "stale when reports go unheard" hook), the
// same usage table and report schedule. What differs is listed here, each for a reason:
// regionsim samples no decision or refusal logs, and its usage table is one stripe that
// never evicts, so that a seed gives one run.
func TestAppAndRegionsimBuildTheSameNode(t *testing.T) {
	sc, err := scenario.Parse([]byte(`
name: same-node
duration: 10s
interval: 10s
seed: 1
regions:
  us-east: {enforcers: 1}
  eu-west: {enforcers: 1}
keys:
  - name: k
    limit: {rate: 100, per: 1s, burst: 100}
    phases:
      - {at: 0s, offered: {us-east: 10}}
`), "same-node")
	if err != nil {
		t.Fatal(err)
	}
	_, w := balancerWorld(t, sc)
	simNode := w.regions[0].nodes[0].Config()
	w.close()

	// The us-east enforcer of the same deployment, as its config file would say it: etcd
	// (for the shares and the leader; unreachable here, which only delays what it reads)
	// and Redis (unreachable too: the node is built all the same).
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte("rules:\n  - id: k\n    limits: [{name: second, rate: 100, per: 1s}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := app.DefaultConfig()
	cfg.Region, cfg.ID, cfg.Rules.File = "us-east", "us-east-0", rulesFile
	cfg.Regions = contract.Regions{"us-east": 1, "eu-west": 1}
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Store.Kind, cfg.Store.Addrs, cfg.Store.DialTimeout = "redis", []string{"127.0.0.1:1"}, 100*time.Millisecond
	cfg.Etcd.Endpoints = []string{"127.0.0.1:1"}
	cfg.Etcd.StartTimeout, cfg.Etcd.DialTimeout = 100*time.Millisecond, 100*time.Millisecond
	cfg.Balancer.Enabled, cfg.Balancer.Insecure = true, true
	cfg.Balancer.Interval, cfg.Balancer.SendTimeout = sc.Interval, 100*time.Millisecond
	a, err := app.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	appNode := a.Node().Config()
	if err := a.Close(); err != nil {
		t.Logf("app close: %v (etcd and Redis are unreachable)", err)
	}

	for name, c := range map[string]node.Config{"app": appNode, "regionsim": simNode} {
		if !c.Layers || !c.Balanced || !c.Reports || !c.Shares.Reports || !c.Shares.WaitForSet {
			t.Errorf("%s: layers %v, balanced %v, reports %v, share table waits %v, hears reports %v: want all",
				name, c.Layers, c.Balanced, c.Reports, c.Shares.WaitForSet, c.Shares.Reports)
		}
	}
	// The differences by design.
	for _, c := range []*node.Config{&appNode, &simNode} {
		c.Check.DecisionLogEvery, c.Check.RefusalLogEvery = 0, 0
		c.Usage.Stripes, c.Usage.Capacity = 0, 0
	}
	if !reflect.DeepEqual(appNode, simNode) {
		for _, f := range []struct {
			name     string
			app, sim any
		}{
			{"Region, ID", []string{appNode.Region, appNode.ID}, []string{simNode.Region, simNode.ID}},
			{"Check", appNode.Check, simNode.Check},
			{"Layers, NoLease", []bool{appNode.Layers, appNode.NoLease}, []bool{simNode.Layers, simNode.NoLease}},
			{"Lease", appNode.Lease, simNode.Lease},
			{"Fallback", appNode.Fallback, simNode.Fallback},
			{"Shares", appNode.Shares, simNode.Shares},
			{"Usage", appNode.Usage, simNode.Usage},
			{"AckGap", appNode.AckGap, simNode.AckGap},
		} {
			if !reflect.DeepEqual(f.app, f.sim) {
				t.Errorf("%s differ:\n app       %+v\n regionsim %+v", f.name, f.app, f.sim)
			}
		}
		t.Fatal("the app and regionsim build different nodes")
	}
}
