package app

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSharesConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	list := write("list.yaml", "region: eu-west\nrules: {file: r}\nregions: [us-east, eu-west, ap-south]\n")
	weights := write("weights.yaml", "region: eu-west\nrules: {file: r}\nregions: {us-east: 2, eu-west: , ap-south: 0.5}\nshares: {stale_after: 1m}\n")
	old := write("old.yaml", "region: eu-west\nrules: {file: r, default_share: 0.5}\n")

	cfg, err := Parse([]string{"-config", list}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Regions.String() != "ap-south=1,eu-west=1,us-east=1" || cfg.Shares.StaleAfter != 5*time.Minute || cfg.Shares.EtcdPrefix != contract.SharesPrefix {
		t.Fatalf("list form: regions %s, shares %+v", cfg.Regions, cfg.Shares)
	}
	cfg, err = Parse([]string{"-config", weights}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Regions.String() != "ap-south=0.5,eu-west=1,us-east=2" || cfg.Shares.StaleAfter != time.Minute {
		t.Fatalf("mapping form: regions %s, shares %+v", cfg.Regions, cfg.Shares)
	}
	cfg, err = Parse([]string{"-region", "eu-west", "-rules-file", "r", "-shares-stale-after", "30s"},
		env(map[string]string{"ALLOT_REGIONS": "us-east=3, eu-west", "ALLOT_SHARES_ETCD_PREFIX": "/x/"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Regions.String() != "eu-west=1,us-east=3" || cfg.Shares.StaleAfter != 30*time.Second || cfg.Shares.EtcdPrefix != "/x/" {
		t.Fatalf("environment and flags: regions %s, shares %+v", cfg.Regions, cfg.Shares)
	}

	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-config", old}, nil, "rules.default_share 0.5 is no longer supported"},
		{[]string{"-region", "r", "-rules-file", "r", "-default-share", "1"}, nil, "rules.default_share 1 is no longer supported"},
		{[]string{"-region", "r", "-rules-file", "r"}, map[string]string{"ALLOT_DEFAULT_SHARE": "0.3"}, "rules.default_share 0.3"},
		{[]string{"-region", "sa-east", "-rules-file", "r", "-regions", "us-east,eu-west"}, nil, `region "sa-east" is not one of regions (eu-west=1,us-east=1)`},
		{[]string{"-region", "us-east", "-rules-file", "r", "-regions", "us-east=0,eu-west"}, nil, "regions: us-east weight 0, must be finite and in (0, 1e6]"},
		{[]string{"-region", "us-east", "-rules-file", "r", "-regions", "us-east=x"}, nil, `weight "x"`},
		{[]string{"-region", "us-east", "-rules-file", "r", "-shares-stale-after", "0s"}, nil, "shares.stale_after 0s, must be > 0"},
	} {
		_, err := Parse(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q, %v): %v, want %q", tc.args, tc.env, err, tc.want)
		}
	}
	c := DefaultConfig()
	c.Region, c.Rules.File, c.Etcd.Endpoints, c.Shares.EtcdPrefix = "us-east", "r", []string{"http://e:1"}, ""
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "shares.etcd_prefix is empty") {
		t.Errorf("empty prefix with etcd: %v", err)
	}
	c.Shares.Disabled = true
	if err := c.Validate(); err != nil {
		t.Errorf("empty prefix, shares disabled: %v", err)
	}
}

// An App with etcd watches the balancer's shares: a key the set lists is held to its
// share, the rest to the default split (here two equal regions: half).
func TestAppAppliesPublishedShares(t *testing.T) {
	e := testenv.Etcd(t, 1)
	cli := e.Client(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - id: default\n    limits: [{name: minute, rate: 8, per: 1m}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Region, cfg.ID, cfg.Rules.File = "us-east", "e1", path
	cfg.Regions = contract.Regions{"us-east": 1, "eu-west": 1}
	cfg.Etcd.Endpoints = e.Endpoints()
	cfg.Etcd.RegistrationTTL = 2 * time.Second
	cfg.Shares.EtcdPrefix = "/t/shares/"
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"

	// Published before the enforcer starts: New loads it, so the first check obeys it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	es := []contract.Entry{{Rule: "default", Identity: "key:small", Shares: map[string]float64{"us-east": 0.25, "eu-west": 0.75}}}
	for i, c := range contract.Split(es, 4, 9, 0) {
		if _, err := cli.Put(ctx, contract.ChunkKey(cfg.Shares.EtcdPrefix, i), string(c)); err != nil {
			t.Fatal(err)
		}
	}
	hb, _ := json.Marshal(contract.Head{LeaderRev: 4, Version: 9, Chunks: 1, Entries: 1, PublishedAt: time.Now(), Regions: []string{"us-east", "eu-west"}})
	if _, err := cli.Put(ctx, contract.HeadKey(cfg.Shares.EtcdPrefix), string(hb)); err != nil {
		t.Fatal(err)
	}

	a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	defer func() {
		a.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if rev, ver := a.Shares().Applied(); rev != 4 || ver != 9 {
		t.Fatalf("applied %d/%d at start, want 4/9", rev, ver)
	}
	admitted := func(key string) (n int, d enforcer.Decision) {
		for range 10 {
			var err error
			if d, err = a.Enforcer().Check(ctx, &enforcer.Request{Attrs: rules.Attrs{APIKey: key}}); err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
		}
		return n, d
	}
	if n, d := admitted("small"); n != 2 || d.Share != 0.25 {
		t.Fatalf("key:small: %d admitted (share %g), want 8 × 0.25 = 2", n, d.Share)
	}
	if n, d := admitted("other"); n != 4 || d.Share != 0.5 {
		t.Fatalf("key:other: %d admitted (share %g), want the default half, 4", n, d.Share)
	}
	if err := testutil.GatherAndCompare(a.Registry(), strings.NewReader(`
# HELP allot_shares_version Version of the share set in force (0 before any).
# TYPE allot_shares_version gauge
allot_shares_version 9
`), "allot_shares_version"); err != nil {
		t.Fatal(err)
	}
}
