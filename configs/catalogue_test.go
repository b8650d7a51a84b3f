package configs

import (
	"errors"
	"regexp"
	"slices"
	"sort"
	"testing"
	"time"

	bapp "github.com/allot-dev/allot/pkg/balancer/app"
	"github.com/allot-dev/allot/pkg/enforcer/app"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// catalogue is every series name a process's /metrics can show.
type catalogue map[string]string // name → where it comes from

func (c catalogue) sorted() []string {
	out := make([]string, 0, len(c))
	for n := range c {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

var fqName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

// add puts in every metric r registers. Names come from the collectors' descriptors, so a
// vector without children yet (a breaker that never tripped) is known too. Histograms and
// summaries show as <name>_bucket / _sum / _count: their type comes from the gathered
// families, or, for a vector without children, from the registry itself: registering a
// collector that describes the same descriptor fails with AlreadyRegisteredError naming
// the collector already there (*prometheus.HistogramVec, ...). Nothing is registered.
func (c catalogue) add(t *testing.T, from string, r *prometheus.Registry) {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() { r.Describe(ch); close(ch) }()
	descs := map[string]*prometheus.Desc{}
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("%s: cannot read the name of %s", from, d)
		}
		descs[m[1]] = d
	}
	mfs, err := r.Gather()
	if err != nil {
		t.Fatalf("%s: gather: %v", from, err)
	}
	gathered := map[string]dto.MetricType{}
	for _, mf := range mfs {
		gathered[mf.GetName()] = mf.GetType()
	}
	for n, d := range descs {
		typ, ok := gathered[n]
		if !ok {
			typ = vectorType(t, r, d)
		}
		c.put(n, typ, from)
	}
	for n, typ := range gathered {
		c.put(n, typ, from)
	}
}

func (c catalogue) put(name string, typ dto.MetricType, from string) {
	c[name] = from
	switch typ {
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		c[name+"_bucket"], c[name+"_sum"], c[name+"_count"] = from, from, from
	case dto.MetricType_SUMMARY:
		c[name+"_sum"], c[name+"_count"] = from, from
	}
}

// descCollector describes one descriptor and collects nothing.
type descCollector struct{ d *prometheus.Desc }

func (c descCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.d }
func (c descCollector) Collect(chan<- prometheus.Metric)    {}

// vectorType is the type of the collector registered in r with exactly descriptor d, when
// it is a histogram or summary vector; untyped (a plain name) otherwise.
func vectorType(t *testing.T, r *prometheus.Registry, d *prometheus.Desc) dto.MetricType {
	t.Helper()
	err := r.Register(descCollector{d})
	if err == nil {
		r.Unregister(descCollector{d})
		t.Fatalf("%s registered twice: the catalogue's probe must never succeed", d)
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		switch are.ExistingCollector.(type) {
		case *prometheus.HistogramVec:
			return dto.MetricType_HISTOGRAM
		case *prometheus.SummaryVec:
			return dto.MetricType_SUMMARY
		}
	}
	return dto.MetricType_UNTYPED
}

// processes builds each process in-process and gathers its registry: an enforcer on the
// memory store, one on the Redis stack (lease and fallback layers), and one with etcd
// configured too (registry, etcd rules, shares, usage reports). Redis and etcd are closed
// loopback ports, so nothing is ever reached: the layers are built, which is what
// registers their metrics. The registry is the one the process serves /metrics from
// (App.Registry). Then a balancer replica, built but not run (it never campaigns).
func processes(t *testing.T) catalogue {
	t.Helper()
	c := catalogue{}
	// The report API's mutual TLS, as the shipped configs have it (issue 27 §1).
	f := testenv.Certs(t, "", "us-east")
	for _, tc := range []struct {
		name  string
		store app.StoreConfig
		etcd  bool
	}{
		{"enforcer (memory store)", app.StoreConfig{Kind: "memory"}, false},
		{"enforcer (redis store)", app.StoreConfig{Kind: "redis", Addrs: []string{"127.0.0.1:1"}}, false},
		// With etcd configured: the registry, the etcd rules source, the share table and
		// the usage reporter.
		{"enforcer (redis store, etcd, balancer)", app.StoreConfig{Kind: "redis", Addrs: []string{"127.0.0.1:1"}}, true},
	} {
		cfg := app.DefaultConfig()
		cfg.Region, cfg.ID = "us-east", "catalogue"
		cfg.Rules.File = "rules/example.yaml"
		cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Store.Kind, cfg.Store.Addrs = tc.store.Kind, tc.store.Addrs
		cfg.Store.DialTimeout = 100 * time.Millisecond // a closed port refuses at once anyway
		if tc.etcd {
			cfg.Etcd.Endpoints = []string{"127.0.0.1:1"}
			cfg.Rules.EtcdPrefix = "/allot/rules/"
			cfg.Etcd.DialTimeout, cfg.Etcd.StartTimeout = 100*time.Millisecond, 200*time.Millisecond
			cfg.Balancer.Enabled = true
			cfg.Balancer.TLS = app.TLSConfig{Enabled: true, CAFile: f.CA(), CertFile: f.Enforcer("us-east"), KeyFile: f.EnforcerKey("us-east")}
		}
		a, err := app.New(cfg, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		c.add(t, tc.name, a.Registry())
		if err := a.Close(); err != nil {
			t.Fatalf("%s: close: %v", tc.name, err)
		}
	}
	bc := bapp.DefaultConfig()
	bc.Regions, bc.ID = []string{"us-east", "eu-west", "ap-south"}, "catalogue"
	bc.Etcd.Endpoints, bc.Etcd.DialTimeout = []string{"127.0.0.1:1"}, 100*time.Millisecond
	bc.Rules.File = "rules/example.yaml"
	bc.Listen.GRPC, bc.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	bc.Listen.TLS = bapp.ServerTLSConfig{Enabled: true, CertFile: f.Balancer(), KeyFile: f.BalancerKey(), ClientCAFile: f.CA()}
	b, err := bapp.New(bc, nil)
	if err != nil {
		t.Fatalf("balancer: %v", err)
	}
	c.add(t, "balancer", b.Registry())
	if err := b.Close(); err != nil {
		t.Fatalf("balancer: close: %v", err)
	}
	return c
}

func TestCatalogueHasTheLayers(t *testing.T) {
	c := processes(t)
	for _, n := range []string{
		"allot_enforcer_decisions_total", "allot_enforcer_check_seconds_bucket",
		"allot_enforcer_plan_decisions_total", "allot_fallback_breaker_state",
		"allot_fallback_transitions_total", "allot_fallback_local_answers_total", "allot_lease_table_keys", "allot_memory_store_keys",
		"allot_rules_failures_total", "allot_usage_reports_sent_total", "allot_usage_report_identities_bucket",
		"allot_shares_age_seconds", "allot_registry_healthy",
		"allot_balancer_leader", "allot_balancer_report_lag_seconds_bucket", "allot_balancer_recompute_seconds_bucket",
		"allot_balancer_share_drift_max",
	} {
		if _, ok := c[n]; !ok {
			t.Errorf("%s is not in the catalogue; have %q", n, c.sorted())
		}
	}
}

// The probe finds a histogram vector that has no child yet, and registers nothing.
func TestCatalogueTypesVectorsWithoutChildren(t *testing.T) {
	r := prometheus.NewRegistry()
	r.MustRegister(prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h_seconds", Help: "h"}, []string{"region"}),
		prometheus.NewSummaryVec(prometheus.SummaryOpts{Name: "s_seconds", Help: "s"}, []string{"region"}),
		prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"region"}))
	c := catalogue{}
	c.add(t, "test", r)
	want := []string{"c_total", "h_seconds", "h_seconds_bucket", "h_seconds_count", "h_seconds_sum", "s_seconds", "s_seconds_count", "s_seconds_sum"}
	if got := c.sorted(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if mfs, _ := r.Gather(); len(mfs) != 0 {
		t.Fatalf("the probe left %d families behind", len(mfs))
	}
}
