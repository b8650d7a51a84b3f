package scenario

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const issueExample = `name: shift-eu-to-us
duration: 180s
seed: 7
interval: 10s              # balancer interval (default 10s)
propagation: 500ms         # publish → applied delay, virtual mode (default 500ms)
regions:
  us-east:  {enforcers: 3}
  eu-west:  {enforcers: 3}
  ap-south: {enforcers: 2}
keys:
  - name: acme
    limit: {rate: 1000, per: 1s, burst: 2000}
    phases:                # offered requests/s per region from ` + "`at`" + ` on
      - {at: 0s,   offered: {eu-west: 1500}}
      - {at: 60s,  offered: {us-east: 1500}}
      - {at: 120s, offered: {us-east: 400, eu-west: 400, ap-south: 400}}
faults:                    # optional
  - {at: 30s, for: 20s, kind: redis-down, region: eu-west}
  - {at: 90s, for: 400s, kind: balancer-down}
  - {at: 100s, for: 30s, kind: region-isolated, region: ap-south}
expect:                    # optional; these are the defaults
  max_window_ratio: 1.01
  steady_ratio: 0.97
  recovery_s: 15
`

func TestParseIssueExample(t *testing.T) {
	sc, err := Parse([]byte(issueExample), "shift.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != "shift-eu-to-us" || sc.Duration != 180*time.Second || sc.Seed != 7 ||
		sc.Interval != 10*time.Second || sc.Propagation != 500*time.Millisecond {
		t.Fatalf("header: %+v", sc)
	}
	want := []Region{{"us-east", 3}, {"eu-west", 3}, {"ap-south", 2}}
	if len(sc.Regions) != 3 {
		t.Fatalf("regions %v", sc.Regions)
	}
	for i := range want {
		if sc.Regions[i] != want[i] {
			t.Fatalf("region %d = %v, want %v (file order)", i, sc.Regions[i], want[i])
		}
	}
	k := sc.Keys[0]
	if k.Name != "acme" || k.Limit != (Limit{1000, time.Second, 2000}) || len(k.Phases) != 3 {
		t.Fatalf("key %+v", k)
	}
	if got := k.OfferedAt(1, 10*time.Second); got != 1500 {
		t.Fatalf("eu-west at 10s offers %g", got)
	}
	if got := k.OfferedAt(1, 60*time.Second); got != 0 {
		t.Fatalf("eu-west at 60s offers %g, want 0 (not named)", got)
	}
	if got := k.OfferedAt(2, 150*time.Second); got != 400 {
		t.Fatalf("ap-south at 150s offers %g", got)
	}
	if len(sc.Faults) != 3 || sc.Faults[0].Region != 1 || sc.Faults[1].Region != -1 || sc.Faults[2].Kind != RegionIsolated {
		t.Fatalf("faults %+v", sc.Faults)
	}
	if sc.Expect != (Expect{1.01, 0.97, 15}) {
		t.Fatalf("expect %+v", sc.Expect)
	}
}

func TestParseDefaults(t *testing.T) {
	sc, err := Parse([]byte(`name: d
duration: 1m
regions: {us-east: {enforcers: 1}}
keys:
  - name: k
    limit: {rate: 6000, per: 1m}
    phases: [{at: 0, offered: {us-east: 10}}]
`), "")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Seed != DefaultSeed || sc.Interval != DefaultInterval || sc.Propagation != DefaultPropagation {
		t.Fatalf("defaults %+v", sc)
	}
	if sc.Expect != (Expect{DefaultMaxWindowRatio, DefaultSteadyRatio, DefaultRecoveryS}) {
		t.Fatalf("expect defaults %+v", sc.Expect)
	}
	l := sc.Keys[0].Limit
	if l.Burst != 6000 || l.Per != time.Minute || l.PerSecond() != 100 {
		t.Fatalf("limit %+v: burst defaults to the rate per `per`", l)
	}
}

func TestParseErrorsNameFieldAndLine(t *testing.T) {
	base := func(extra string) string {
		return `name: x
duration: 60s
regions:
  us-east: {enforcers: 2}
keys:
  - name: k
    limit: {rate: 10}
    phases:
      - {at: 0s, offered: {us-east: 5}}
` + extra
	}
	cases := []struct {
		name, in, want string
	}{
		{"unknown top field", base("colour: blue\n"), "x.yaml:10: colour: unknown field"},
		{"unknown key field", strings.Replace(base(""), "    limit:", "    cost: 3\n    limit:", 1), "x.yaml:7: keys[0].cost: unknown field"},
		{"unknown limit field", strings.Replace(base(""), "{rate: 10}", "{rate: 10, window: 1s}", 1), "x.yaml:7: keys[0] \"k\".limit.window: unknown field"},
		{"unknown region in offered", strings.Replace(base(""), "{us-east: 5}", "{mars: 5}", 1), "x.yaml:9: keys[0] \"k\".phases[0].offered.mars: unknown region"},
		{"bad duration", strings.Replace(base(""), "60s", "sixty", 1), "x.yaml:2: duration: \"sixty\": want a duration"},
		{"number as duration", strings.Replace(base(""), "60s", "60", 1), "x.yaml:2: duration: \"60\": want a duration"},
		{"negative rate", strings.Replace(base(""), "rate: 10", "rate: -1", 1), "x.yaml:7: keys[0] \"k\".limit.rate: -1: must be > 0"},
		{"fault kind", base("faults:\n  - {at: 1s, for: 1s, kind: meteor}\n"), "x.yaml:11: faults[0].kind: \"meteor\""},
		{"fault region missing", base("faults:\n  - {at: 1s, for: 1s, kind: redis-down}\n"), "x.yaml:11: faults[0].region: missing"},
		{"balancer-down with region", base("faults:\n  - {at: 1s, for: 1s, kind: balancer-down, region: us-east}\n"), "faults[0].region: balancer-down takes no region"},
		{"leader-change with region", base("faults:\n  - {at: 1s, for: 1s, kind: leader-change, region: us-east}\n"), "faults[0].region: leader-change takes no region"},
		{"enforcer out of range", base("faults:\n  - {at: 1s, for: 1s, kind: enforcer-isolated, region: us-east, enforcer: 9}\n"), "faults[0].enforcer: 9: want an index in [0, "},
		{"enforcer not whole", base("faults:\n  - {at: 1s, for: 1s, kind: enforcer-isolated, region: us-east, enforcer: 0.5}\n"), "faults[0].enforcer: 0.5"},
		{"enforcer on another kind", base("faults:\n  - {at: 1s, for: 1s, kind: redis-down, region: us-east, enforcer: 0}\n"), "faults[0].enforcer: only enforcer-isolated takes an enforcer"},
		{"region-restart without region", base("faults:\n  - {at: 1s, for: 1s, kind: region-restart}\n"), "faults[0].region: missing"},
		{"unknown expect field", base("expect: {p99: 3}\n"), "x.yaml:10: expect.p99: unknown field"},
		{"missing keys", "name: x\nduration: 1s\nregions: {us-east: {enforcers: 1}}\n", "x.yaml:1: keys: missing"},
		{"bad region name", strings.Replace(base(""), "us-east: {enforcers: 2}", "US_East: {enforcers: 2}", 1), "x.yaml:4: regions: \"US_East\""},
		{"zero enforcers", strings.Replace(base(""), "enforcers: 2", "enforcers: 0", 1), "x.yaml:4: regions.us-east.enforcers: 0: must be in"},
		{"string seed", strings.Replace(base(""), "duration: 60s", "duration: 60s\nseed: abc", 1), "x.yaml:3: seed: \"abc\": want a whole number"},
		{"two documents", base("---\nname: y\n"), "more than one YAML document"},
		{"not a mapping", "- 1\n- 2\n", "x.yaml:1: want a mapping"},
		{"empty", "", "empty file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.in), "x.yaml")
			if err == nil {
				t.Fatalf("no error for\n%s", c.in)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestParsePhaseOrderAndDuplicates(t *testing.T) {
	in := `name: x
duration: 60s
regions: {us-east: {enforcers: 1}}
keys:
  - name: k
    limit: {rate: 10}
    phases:
      - {at: 30s, offered: {us-east: 5}}
      - {at: 10s, offered: {us-east: 5}}
`
	_, err := Parse([]byte(in), "x.yaml")
	if err == nil || !strings.Contains(err.Error(), "x.yaml:9:") || !strings.Contains(err.Error(), "increasing order") {
		t.Fatalf("got %v, want an error at line 9 about order", err)
	}
	in = `name: x
duration: 60s
regions: {us-east: {enforcers: 1}}
keys:
  - {name: k, limit: {rate: 10}, phases: [{at: 0s, offered: {us-east: 1}}]}
  - {name: k, limit: {rate: 10}, phases: [{at: 0s, offered: {us-east: 1}}]}
`
	_, err = Parse([]byte(in), "x.yaml")
	if err == nil || !strings.Contains(err.Error(), "x.yaml:6: keys[1].name: \"k\" appears twice") {
		t.Fatalf("got %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(issueExample))
	f.Add([]byte("name: x\nduration: 1s\nregions: {a: {enforcers: 1}}\nkeys: [{name: k, limit: {rate: 1}, phases: [{at: 0s, offered: {a: 1}}]}]\n"))
	f.Add([]byte("&a [*a]"))
	f.Add([]byte("name: &n x\nduration: *n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := Parse(data, "f.yaml")
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		// A scenario that parsed is runnable: every invariant the simulator relies on holds.
		if len(sc.Regions) == 0 || len(sc.Keys) == 0 || sc.Duration <= 0 {
			t.Fatalf("accepted an empty scenario: %+v", sc)
		}
		for _, k := range sc.Keys {
			if !(k.Limit.PerSecond() > 0) || k.Limit.Burst < 1 || len(k.Phases) == 0 {
				t.Fatalf("accepted key %+v", k)
			}
			for i, p := range k.Phases {
				if len(p.Offered) != len(sc.Regions) || (i > 0 && p.At <= k.Phases[i-1].At) || p.At >= sc.Duration {
					t.Fatalf("accepted phases %+v", k.Phases)
				}
			}
		}
		for _, ft := range sc.Faults {
			if ft.For <= 0 || ft.Region >= len(sc.Regions) || (ft.Kind != BalancerDown && ft.Region < 0) {
				t.Fatalf("accepted fault %+v", ft)
			}
		}
	})
}

// The fault kinds of issue 21 §1: one enforcer cut off, a leader change, a region restart.
func TestParseNewFaultKinds(t *testing.T) {
	sc, err := Parse([]byte(`name: f
duration: 100s
regions:
  us-east: {enforcers: 2}
  eu-west: {enforcers: 3}
keys:
  - name: k
    limit: {rate: 10, per: 1s}
    phases: [{at: 0s, offered: {us-east: 5}}]
faults:
  - {at: 10s, for: 20s, kind: enforcer-isolated, region: eu-west, enforcer: 2}
  - {at: 20s, for: 5s, kind: leader-change}
  - {at: 30s, for: 10s, kind: region-restart, region: us-east}
  - {at: 40s, for: 10s, kind: enforcer-isolated, region: us-east}
`), "f.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []Fault{
		{At: 10 * time.Second, For: 20 * time.Second, Kind: EnforcerIsolated, Region: 1, Enforcer: 2},
		{At: 20 * time.Second, For: 5 * time.Second, Kind: LeaderChange, Region: -1},
		{At: 30 * time.Second, For: 10 * time.Second, Kind: RegionRestart, Region: 0},
		{At: 40 * time.Second, For: 10 * time.Second, Kind: EnforcerIsolated, Region: 0}, // enforcer 0 by default
	}
	if len(sc.Faults) != len(want) {
		t.Fatalf("faults %+v", sc.Faults)
	}
	for i := range want {
		if sc.Faults[i] != want[i] {
			t.Errorf("fault %d = %+v, want %+v", i, sc.Faults[i], want[i])
		}
	}
}
