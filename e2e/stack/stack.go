// Package stack is allot's multi-region stack for end-to-end drills, built from the same
// images a user would run: per region a Redis Cluster and two or more enforcer processes
// (bin/enforcer, statically built into the local allot/stack image), one etcd cluster the
// regions share, and optionally a real nginx in front of the first region and a real Caddy
// in front of the second, configured exactly as cmd/enforcer/README.md documents. Every
// process is a container started by pkg/testenv (dockertest, host networking, 127.0.0.1
// ports); nothing is pulled.
//
// Geography. etcd and the balancer replicas live in the first region. Every other region
// reaches etcd through a pkg/testenv Link (Toxiproxy in this process)
// that adds the cross-region latency each way (DefaultLatency: 35–75 ms, so round trips of
// 70–150 ms as between real regions) and that the drills cut or blackhole. Inside a
// region, enforcer → Redis is direct. The first region's enforcers dial the balancer
// leader at the address it advertises in its election key; every other region reaches
// each balancer replica through a Link of its own (Region.BalancerLinks, the same latency
// as its etcd links), listed in its enforcers' balancer.addrs (with Options.Aggregate, in
// its aggregator's upstream_addrs), so a drill can cut one region's reports alone; with
// Options.EnforcerLinks each of its enforcers has links of its own (Enforcer.BalancerLinks),
// so a drill can cut one enforcer's.
//
// What it guarantees: Start returns only when every enforcer answers /readyz and counts
// every enforcer of its region as a peer; everything is removed at the cleanup of the test
// that called Start. Start and the methods that change the stack's state must be called
// from the test's goroutine; the read-only methods (Check, Metrics, ...) are safe for
// concurrent use.
package stack

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/testenv"
	"gopkg.in/yaml.v3"
)

// Regions are the three regions of configs/regions, in the order the stack builds them.
var Regions = []string{"us-east", "eu-west", "ap-south"}

// DefaultLatency is the one-way latency added between the first region (where etcd lives)
// and each other region: round trips of 80 ms to eu-west and 140 ms to ap-south.
var DefaultLatency = map[string]time.Duration{"eu-west": 40 * time.Millisecond, "ap-south": 70 * time.Millisecond}

// Options shapes a stack. The zero value is not useful; start from DefaultOptions.
type Options struct {
	// Regions, in order; the first is home to etcd (and the gateway).
	Regions []RegionOptions
	// EtcdMembers is 1 or 3.
	EtcdMembers int
	// Rules is the YAML rules file every enforcer loads (default: configs/rules/example.yaml
	// with DrillRules appended).
	Rules string
	// Gateway puts nginx in front of the first region's enforcers.
	Gateway bool
	// Caddy puts Caddy in front of the second region's enforcers (or the first's when
	// there is one region and no Gateway): forward_auth passes the enforcers' refusals
	// through as they are, so they must answer 429, not the 403 nginx needs.
	Caddy bool
	// Jitter is added to each link's latency (uniform ±).
	Jitter time.Duration
	// Enforcer overrides config fields of every enforcer (YAML merged over the stack's
	// defaults, e.g. "lease: {ttl: 500ms}").
	Enforcer string

	// Balancers is the number of bin/balancer replicas (0: none; the enforcers' usage
	// reports are then dropped and every region enforces its default split).
	Balancers int
	// BalanceInterval is the balancer's interval and the enforcers' report interval.
	BalanceInterval time.Duration
	// SessionTTL is the balancer's election lease (whole seconds).
	SessionTTL time.Duration
	// ShareStale is the staleness period, for the enforcers and the balancer.
	ShareStale time.Duration
	// Balancer overrides config fields of every balancer replica (YAML).
	Balancer string
	// Aggregate runs a report aggregator per region (bin/balancer with an aggregate
	// section, docs/design.md §12), reaching etcd and the balancer replicas through the
	// region's links (aggregate.upstream_addrs; the first region's directly); the region's
	// enforcers report through it (balancer.via_aggregator) instead of to the replicas.
	// Needs Balancers > 0.
	Aggregate bool
	// EnforcerLinks gives every enforcer of a region other than the first links of its own
	// to the balancer replicas (Enforcer.BalancerLinks, listed in its own config's
	// balancer.addrs; Region.BalancerLinks lists them all), so a drill can cut one
	// enforcer's reports while its region-mates' go through. Not with Aggregate.
	EnforcerLinks bool
	// AdminToken, if not empty, turns on the balancers' admin API (pkg/balancer/admin on
	// their HTTP listeners) with one named token, "drill:" + AdminToken (in a tokens file
	// under Dir; at least adminauth.MinSecretLen bytes).
	AdminToken string

	// FallbackTimeout is how long a check waits for Redis before it alone is answered
	// locally (fallback.timeout; the shard's breaker hears the call's outcome, with the
	// shipped 100 ms reply timeout, not the wait). Default the shipped 5 ms, or
	// ALLOT_STACK_FALLBACK_TIMEOUT: on a machine starved of CPU a few checks miss 5 ms and
	// are answered locally; the drills report those answers apart (stack.Shared).
	FallbackTimeout time.Duration
}

// fallbackTimeout is DefaultOptions' FallbackTimeout.
func fallbackTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("ALLOT_STACK_FALLBACK_TIMEOUT")); err == nil && d > 0 {
		return d
	}
	return 5 * time.Millisecond
}

// RegionOptions shapes one region.
type RegionOptions struct {
	Name string
	// Enforcers is the number of enforcer processes (≥ 1; the design runs ≥ 2).
	Enforcers int
	// Replicas per Redis master (1 where a drill needs failover).
	Replicas int
	// Latency is the one-way latency to the first region (0 for the first region).
	Latency time.Duration
}

// DefaultOptions is three regions of two enforcers each over 3-master clusters without
// replicas, a 3-member etcd, no gateway and no balancer, with the shipped configs'
// intervals (balancing 10 s, election lease 10 s, staleness 5 min) and fallback settings.
func DefaultOptions() Options {
	o := Options{EtcdMembers: 3, Jitter: 5 * time.Millisecond,
		BalanceInterval: 10 * time.Second, SessionTTL: 10 * time.Second, ShareStale: 5 * time.Minute,
		FallbackTimeout: fallbackTimeout()}
	for _, r := range Regions {
		o.Regions = append(o.Regions, RegionOptions{Name: r, Enforcers: 2, Latency: DefaultLatency[r]})
	}
	return o
}

// Stack is a running stack.
type Stack struct {
	Regions   []*Region
	Etcd      *testenv.EtcdCluster
	Links     *testenv.Links
	Gateway   *Gateway // nginx; nil unless Options.Gateway
	Caddy     *Gateway // nil unless Options.Caddy
	Balancers []*Balancer
	// Aggregators, one per region in Regions' order with Options.Aggregate.
	Aggregators []*Balancer
	Dir         string // configs and rules files, bind-mounted at the same path
	Image       string // the stack image
	// Certs are the report API's mutual TLS (under Dir/certs): the balancers serve with
	// them and each region's enforcers report with their region's certificate, as the
	// shipped configs do.
	Certs certs.Files

	RulesFile string

	opt   Options  // what Start was given (StartEnforcer's links and configs)
	names []string // the regions' names, in order
}

// Region is one region's Redis Cluster and enforcers.
type Region struct {
	Name      string
	Redis     *testenv.Cluster
	Enforcers []*Enforcer
	// EtcdLinks are this region's paths to the etcd members (empty for the first region,
	// which reaches etcd directly); EtcdEndpoints what its enforcers dial.
	EtcdLinks     []*testenv.Link
	EtcdEndpoints []string
	// BalancerLinks are this region's paths to the balancer replicas, one per replica in
	// Stack.Balancers' order (empty for the first region and without balancers);
	// BalancerAddrs are their addresses: its enforcers' balancer.addrs, or with
	// Options.Aggregate its aggregator's aggregate.upstream_addrs.
	BalancerLinks []*testenv.Link
	BalancerAddrs []string

	config  string        // the region's enforcer config file
	latency time.Duration // one way to the first region (its links')
}

// Start builds the stack shaped by opt and returns once it is ready (see the package
// doc). It fails t when any part does not come up.
func Start(t testing.TB, opt Options) *Stack {
	t.Helper()
	began := time.Now()
	if len(opt.Regions) == 0 {
		t.Fatal("stack: Options.Regions is empty")
	}
	if opt.EnforcerLinks && opt.Aggregate {
		t.Fatal("stack: Options.EnforcerLinks with Aggregate: the enforcers report to their region's aggregator")
	}
	s := &Stack{Dir: t.TempDir(), Links: testenv.NewLinks(t), opt: opt}
	s.Image = testenv.StackImage(t)
	imaged := time.Since(began)

	// etcd and every region's Redis Cluster at once: container start-up dominates.
	s.Regions = make([]*Region, len(opt.Regions))
	fns := []func(tb testing.TB){func(tb testing.TB) { s.Etcd = testenv.Etcd(tb, opt.EtcdMembers) }}
	for i, ro := range opt.Regions {
		if ro.Enforcers < 1 {
			t.Fatalf("stack: region %s: Enforcers = %d, want ≥ 1", ro.Name, ro.Enforcers)
		}
		s.Regions[i] = &Region{Name: ro.Name, latency: ro.Latency}
		fns = append(fns, func(tb testing.TB) {
			s.Regions[i].Redis = testenv.RedisCluster(tb, testenv.ClusterOptions{Masters: 3, ReplicasPerMaster: ro.Replicas, NodeTimeout: 2 * time.Second})
		})
	}
	Parallel(t, fns...)
	infra := time.Since(began)

	for i, r := range s.Regions {
		if i == 0 {
			r.EtcdEndpoints = s.Etcd.Endpoints()
			continue
		}
		for j, m := range s.Etcd.Members {
			k := s.Links.Add(t, fmt.Sprintf("%s-etcd-%d", r.Name, j), strings.TrimPrefix(m.ClientURL, "http://"), opt.Regions[i].Latency, opt.Jitter)
			r.EtcdLinks = append(r.EtcdLinks, k)
			r.EtcdEndpoints = append(r.EtcdEndpoints, "http://"+k.Addr)
		}
	}

	// The balancer replicas' addresses are fixed now, so that every other region's
	// enforcers can be given their own links to them (balancer.addrs).
	s.Balancers = make([]*Balancer, opt.Balancers)
	for i := range s.Balancers {
		s.Balancers[i] = newBalancer(t, i)
	}
	for i, r := range s.Regions {
		if i == 0 || opt.EnforcerLinks { // with EnforcerLinks each enforcer's are made as it starts
			continue
		}
		for j, b := range s.Balancers {
			k := s.Links.Add(t, fmt.Sprintf("%s-balancer-%d", r.Name, j), b.GRPC, opt.Regions[i].Latency, opt.Jitter)
			r.BalancerLinks = append(r.BalancerLinks, k)
			r.BalancerAddrs = append(r.BalancerAddrs, k.Addr)
		}
	}

	rules := opt.Rules
	if rules == "" {
		rules = DefaultRules(t)
	}
	s.RulesFile = filepath.Join(s.Dir, "rules.yaml")
	writeFile(t, s.RulesFile, rules)
	for _, r := range s.Regions {
		s.names = append(s.names, r.Name)
	}
	names := s.names
	s.Certs = testenv.Certs(t, filepath.Join(s.Dir, "certs"), names...)
	for i, r := range s.Regions {
		r.config = filepath.Join(s.Dir, r.Name+".yaml")
		writeFile(t, r.config, enforcerConfig(t, r, names, s.RulesFile, s.Certs, i == 0 && opt.Gateway, opt, r.BalancerAddrs))
	}
	if opt.Balancers > 0 {
		if opt.AdminToken != "" {
			writeFile(t, adminTokensFile(s), "drill:"+opt.AdminToken+"\n")
		}
		writeFile(t, balancerConfigFile(s), balancerConfig(t, s, names, opt))
	}
	var starts []func(tb testing.TB)
	for _, b := range s.Balancers {
		starts = append(starts, func(tb testing.TB) { s.startBalancer(tb, balancerConfigFile(s), b) })
	}
	if opt.Aggregate {
		if opt.Balancers == 0 {
			t.Fatal("stack: Options.Aggregate needs Balancers > 0")
		}
		for i, r := range s.Regions {
			b := newBalancer(t, 100+i)
			b.ID = "agg-" + r.Name
			s.Aggregators = append(s.Aggregators, b)
			conf := filepath.Join(s.Dir, "aggregator-"+r.Name+".yaml")
			writeFile(t, conf, aggregatorConfig(t, s, r, names, opt))
			starts = append(starts, func(tb testing.TB) { s.startBalancer(tb, conf, b) })
		}
	}
	for i, r := range s.Regions {
		r.Enforcers = make([]*Enforcer, opt.Regions[i].Enforcers)
		for j := range r.Enforcers {
			starts = append(starts, func(tb testing.TB) { r.Enforcers[j] = s.startEnforcer(tb, r, j) })
		}
	}
	Parallel(t, starts...)
	for _, r := range s.Regions {
		for _, e := range r.Enforcers {
			r.BalancerLinks = append(r.BalancerLinks, e.BalancerLinks...)
			e.WaitPeers(t, len(r.Enforcers), time.Minute)
		}
	}
	if opt.Gateway {
		s.Gateway = StartGateway(t, s.Regions[0].Enforcers)
	}
	if opt.Caddy {
		behind := s.Regions[0]
		if len(s.Regions) > 1 {
			behind = s.Regions[1]
		} else if opt.Gateway {
			t.Fatal("stack: Options.Caddy with Gateway needs a second region (nginx's region refuses with 403)")
		}
		s.Caddy = StartCaddy(t, behind.Enforcers)
	}
	if opt.Balancers > 0 {
		s.Leader(t, time.Minute)
	}
	t.Logf("stack: %d regions × %v enforcers, etcd × %d, %d balancers, nginx %v, caddy %v: ready in %v (image %v, Redis+etcd %v)",
		len(s.Regions), enforcerCounts(s), opt.EtcdMembers, opt.Balancers, opt.Gateway, opt.Caddy,
		time.Since(began).Round(time.Millisecond), imaged.Round(time.Millisecond), infra.Round(time.Millisecond))
	return s
}

func enforcerCounts(s *Stack) []int {
	var out []int
	for _, r := range s.Regions {
		out = append(out, len(r.Enforcers))
	}
	return out
}

// Region returns the region named name, or nil.
func (s *Stack) Region(name string) *Region {
	for _, r := range s.Regions {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// Enforcers returns every enforcer of every region.
func (s *Stack) Enforcers() []*Enforcer {
	var out []*Enforcer
	for _, r := range s.Regions {
		out = append(out, r.Enforcers...)
	}
	return out
}

// DrillRules are the rules the drills count on, appended to the shipped example rules.
// Each is selected by plan, so a drill's keys never meet another drill's limits:
//
//	drill         100/s, burst 100 (no minute limit): over-admission is easy to count
//	drill-closed  the same, fail_mode: closed
//	drill-lease   600/s, burst 600: busy keys lease batches (200/s a region, 10 a batch)
//	drill-shift   300/s, burst 300: the key whose traffic moves between regions
//	drill-slow    5/s, burst 5: a limit a few checks exhaust
//	drill-inflight  9 in flight at once globally (3 a region), slots timing out after 3 s
const DrillRules = `
- id: drill
  match: {plan: drill}
  limits: [{name: second, rate: 100, per: 1s, burst: 100}]
  reason: e2e drills
- id: drill-closed
  match: {plan: drill-closed}
  limits: [{name: second, rate: 100, per: 1s, burst: 100}]
  fail_mode: closed
  reason: e2e drills, failing closed
- id: drill-lease
  match: {plan: drill-lease}
  limits: [{name: second, rate: 600, per: 1s, burst: 600}]
  reason: e2e drills, busy enough for leases
- id: drill-shift
  match: {plan: drill-shift}
  limits: [{name: second, rate: 300, per: 1s, burst: 300}]
  reason: e2e balancer drills
- id: drill-slow
  match: {plan: drill-slow}
  limits: [{name: second, rate: 5, per: 1s, burst: 5}]
  reason: e2e drills
- id: drill-inflight
  match: {plan: drill-inflight}
  limits: [{name: inflight, concurrent: 9, timeout: 3s}]
  reason: e2e drills, slots that heal
`

// DefaultRules is configs/rules/example.yaml (what a user starts from) without its per-IP
// cap and with DrillRules appended to its rules.
func DefaultRules(t testing.TB) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(RepoRoot(t), "configs", "rules", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("stack: configs/rules/example.yaml: %v", err)
	}
	var extra []any
	if err := yaml.Unmarshal([]byte(DrillRules), &extra); err != nil {
		t.Fatalf("stack: DrillRules: %v", err)
	}
	list, _ := doc["rules"].([]any)
	// The drills send every request from one address (the test's), so the example's
	// per-IP cap would hold every drill key to its 50/s: the drills leave it out.
	list = slices.DeleteFunc(list, func(r any) bool {
		m, _ := r.(map[string]any)
		return m["id"] == "per-ip-cap"
	})
	doc["rules"] = append(list, extra...)
	doc["version"] = fmt.Sprint(doc["version"], "+drills")
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// RepoRoot is the directory holding go.mod, found from this source file.
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("stack: cannot find the repository root")
	}
	for dir := filepath.Dir(file); dir != filepath.Dir(dir); dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
	}
	t.Fatal("stack: no go.mod above " + file)
	return ""
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Parallel runs fns concurrently, each with a testing.TB whose Fatal ends only that
// function (the testenv constructors call t.Fatal, which must not run on another
// goroutine than the test's), and fails t with every failure once all have returned.
func Parallel(t testing.TB, fns ...func(tb testing.TB)) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]string, len(fns))
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := &goTB{TB: t}
			defer func() { errs[i] = g.failure() }()
			fn(g)
		}()
	}
	wg.Wait()
	var failed []string
	for _, e := range errs {
		if e != "" {
			failed = append(failed, e)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("stack: %s", strings.Join(failed, "\n"))
	}
}

// goTB is a testing.TB for a goroutine: Fatal and FailNow record and end the goroutine;
// Skip is a failure (a part of the stack cannot be skipped); the rest is t's.
type goTB struct {
	testing.TB

	mu  sync.Mutex // mu guards msg
	msg []string
}

func (g *goTB) record(s string) {
	g.mu.Lock()
	g.msg = append(g.msg, s)
	g.mu.Unlock()
}

func (g *goTB) failure() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return strings.Join(g.msg, "; ")
}

func (g *goTB) Helper()                         {}
func (g *goTB) Error(args ...any)               { g.record(fmt.Sprint(args...)) }
func (g *goTB) Errorf(f string, args ...any)    { g.record(fmt.Sprintf(f, args...)) }
func (g *goTB) Fail()                           { g.record("failed") }
func (g *goTB) FailNow()                        { g.record("failed"); runtime.Goexit() }
func (g *goTB) Fatal(args ...any)               { g.record(fmt.Sprint(args...)); runtime.Goexit() }
func (g *goTB) Fatalf(f string, args ...any)    { g.record(fmt.Sprintf(f, args...)); runtime.Goexit() }
func (g *goTB) Skip(args ...any)                { g.Fatal(args...) }
func (g *goTB) Skipf(f string, args ...any)     { g.Fatalf(f, args...) }
func (g *goTB) SkipNow()                        { g.Fatal("skipped") }
func (g *goTB) Failed() bool                    { return g.failure() != "" || g.TB.Failed() }
func (g *goTB) Logf(format string, args ...any) { g.TB.Logf(format, args...) }
