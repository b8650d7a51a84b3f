// Package inprocess runs a whole multi-region allot deployment in one process, on
// loopback: an embedded etcd (go.etcd.io/etcd/server/v3/embed), one or more quota
// balancer replicas, and for every region a set of enforcers that share one in-memory
// bucket store standing for that region's Redis Cluster. Every part talks to the others
// as in production — real gRPC usage reports over mutual TLS (a CA and certificates made
// under Dir/certs, each region's enforcers with their own), a real etcd election, real
// share sets published in etcd and watched by the enforcers — so what runs here is the
// same code a deployment runs, minus Redis. It is what `regionsim demo` starts, and what tests use to
// exercise the regions together without Docker.
//
// Each enforcer is a pkg/enforcer/app App, so its node is composed by the same
// pkg/enforcer/node.Build as the enforcer binary's and regionsim's.
//
// Which way it errs against a real deployment: the in-memory store is exact and has no
// network, so a region here answers faster and never fails; the shares, reports and
// balancing above it are the real thing. Over the in-memory store an enforcer runs
// without the lease and fallback layers, as the binary does with store.kind memory
// (regionsim's virtual mode layers them over its store); with Config.Redis it runs them.
//
// A Stack owns every goroutine it starts; Close stops them all and waits. Not safe for
// concurrent Start; the accessors are safe once Start returned.
package inprocess

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/aggregator"
	"github.com/allot-dev/allot/pkg/appkit"
	balancerapp "github.com/allot-dev/allot/pkg/balancer/app"
	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	enforcerapp "github.com/allot-dev/allot/pkg/enforcer/app"
	"github.com/allot-dev/allot/pkg/tlsfiles"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/server/v3/embed"
)

// Region is one region of the stack.
type Region struct {
	// Name is the region's name ("us-east").
	Name string
	// Enforcers is how many enforcers the region runs; at least 1.
	Enforcers int
}

// Config shapes a Stack. Regions and Rules are required; the rest has defaults.
type Config struct {
	// Regions, in the balancer's order.
	Regions []Region
	// Rules is the rule set (YAML, as in configs/rules/) every enforcer and balancer
	// loads as its base; rules written under /allot/rules/ in etcd add to it.
	Rules []byte
	// Balancers is the number of balancer replicas (one leads). Default 1.
	Balancers int
	// Interval is the usage-report and balancing interval. Default 10s.
	Interval time.Duration
	// Stale is how long shares live without a refresh (enforcers and balancer). Default 5m.
	Stale time.Duration
	// Learning is how long a new balancer leader waits before reallocating when not every
	// region has reported. Default 2 × Interval.
	Learning time.Duration
	// Redis names, per region, the seed nodes of a real Redis Cluster the region's
	// enforcers use instead of the shared in-memory store ("regionsim demo -redis").
	Redis map[string][]string
	// Dir holds the etcd data and the rules file; "" makes (and removes) a temporary one.
	Dir string
	// Logger gets every part's logs (named per part); nil discards them.
	Logger hclog.Logger
	// Aggregate runs a report aggregator per region (pkg/aggregator, elected in etcd, over
	// mutual TLS like the balancer), and the region's enforcers report through it
	// (balancer.via_aggregator). Default false: the direct path.
	Aggregate bool
	// Tracing is every process's OpenTelemetry tracing (appkit.TracingFromEnv); each
	// balancer and enforcer exports its own spans, as deployed. The zero value is off.
	Tracing appkit.Tracing
}

func (c *Config) withDefaults() error {
	if len(c.Regions) == 0 {
		return errors.New("inprocess: no regions")
	}
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if r.Name == "" || seen[r.Name] {
			return fmt.Errorf("inprocess: region name %q empty or repeated", r.Name)
		}
		seen[r.Name] = true
		if r.Enforcers < 1 {
			return fmt.Errorf("inprocess: region %s: enforcers %d, must be >= 1", r.Name, r.Enforcers)
		}
	}
	if len(c.Rules) == 0 {
		return errors.New("inprocess: no rules")
	}
	if c.Balancers == 0 {
		c.Balancers = 1
	}
	if c.Interval == 0 {
		c.Interval = 10 * time.Second
	}
	if c.Stale == 0 {
		c.Stale = 5 * time.Minute
	}
	if c.Learning == 0 {
		c.Learning = 2 * c.Interval
	}
	switch {
	case c.Balancers < 0:
		return fmt.Errorf("inprocess: balancers %d, must be >= 1", c.Balancers)
	case c.Interval < 0 || c.Stale < 0 || c.Learning < 0:
		return fmt.Errorf("inprocess: interval %v, stale %v, learning %v: must be > 0", c.Interval, c.Stale, c.Learning)
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return nil
}

// Stack is a running deployment. Build it with Start.
type Stack struct {
	cfg     Config
	dir     string
	tempDir bool
	certs   certs.Files // the report API's mutual TLS
	etcd    *embed.Etcd
	etcdURL string

	balancers []*balancerapp.App
	dashToken string // a read-only dashboard token (dashboard.tokens_file)
	enforcers map[string][]*enforcerapp.App
	aggs      map[string]*aggregator.Aggregator
	stores    map[string]*bucket.Memory

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	err    error
}

// Start brings the stack up: etcd ready, every balancer and enforcer built and serving.
// On error everything already started is stopped.
func Start(cfg Config) (_ *Stack, err error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	s := &Stack{cfg: cfg, dir: cfg.Dir, enforcers: map[string][]*enforcerapp.App{}, aggs: map[string]*aggregator.Aggregator{}, stores: map[string]*bucket.Memory{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Close())
		}
	}()
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "allot-inprocess-"); err != nil {
			return nil, err
		}
		s.tempDir = true
	}
	rulesFile := filepath.Join(s.dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, cfg.Rules, 0o644); err != nil {
		return nil, fmt.Errorf("inprocess: while writing the rules: %w", err)
	}
	if err := s.startEtcd(); err != nil {
		return nil, err
	}
	weights := make(map[string]float64, len(cfg.Regions))
	names := make([]string, len(cfg.Regions))
	for i, r := range cfg.Regions {
		weights[r.Name], names[i] = 1, r.Name
	}
	// Reports are authenticated as in production (issue 27 §1): mutual TLS, each region's
	// enforcers with their own certificate, made under Dir/certs.
	s.certs = certs.Files{Dir: filepath.Join(s.dir, "certs")}
	if _, err := certs.Generate(s.certs.Dir, certs.Options{Regions: names, Now: time.Now()}); err != nil {
		return nil, fmt.Errorf("inprocess: %w", err)
	}
	// The dashboard masks identities without a token (issue 27 §4): a read-only token of
	// the demo's own, which DashboardURL carries.
	tok := make([]byte, 16)
	rand.Read(tok) // never fails (crypto/rand)
	s.dashToken = hex.EncodeToString(tok)
	dashTokens := filepath.Join(s.dir, "dashboard-tokens")
	if err := os.WriteFile(dashTokens, []byte("demo:"+s.dashToken+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("inprocess: while writing the dashboard token: %w", err)
	}
	for i := range cfg.Balancers {
		bc := balancerapp.DefaultConfig()
		bc.Dashboard.TokensFile, bc.Dashboard.TokensEnv = dashTokens, ""
		bc.Listen.TLS = balancerapp.ServerTLSConfig{Enabled: true, CertFile: s.certs.Balancer(), KeyFile: s.certs.BalancerKey(), ClientCAFile: s.certs.CA()}
		bc.Regions, bc.ID = names, fmt.Sprintf("balancer-%d", i+1)
		bc.Listen.GRPC, bc.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
		bc.Etcd.Endpoints = []string{s.etcdURL}
		bc.Rules.File, bc.Rules.EtcdPrefix = rulesFile, contract.RulesPrefix
		bc.Balance.Interval, bc.Balance.Stale, bc.Balance.Learning = cfg.Interval, cfg.Stale, cfg.Learning
		bc.Balance.SilentAfter = max(bc.Balance.SilentAfter, 2*cfg.Interval)
		bc.Tracing = cfg.Tracing
		b, err := balancerapp.New(bc, cfg.Logger.Named(bc.ID))
		if err != nil {
			return nil, fmt.Errorf("inprocess: balancer %d: %w", i+1, err)
		}
		s.balancers = append(s.balancers, b)
		s.run(func(ctx context.Context) error { return b.Run(ctx) })
	}
	if cfg.Aggregate {
		for _, r := range cfg.Regions {
			if err := s.startAggregator(r.Name, names, rulesFile); err != nil {
				return nil, err
			}
		}
	}
	for _, r := range cfg.Regions {
		var store *bucket.Memory
		if len(cfg.Redis[r.Name]) == 0 {
			store = bucket.NewMemory(clock.Real(), 0)
			s.stores[r.Name] = store
		}
		for j := range r.Enforcers {
			ec := enforcerapp.DefaultConfig()
			ec.Region, ec.ID = r.Name, fmt.Sprintf("%s-%d", r.Name, j+1)
			ec.Regions = weights
			ec.Store.Kind = "memory"
			if store == nil {
				ec.Store.Kind, ec.Store.Addrs = "redis-cluster", cfg.Redis[r.Name]
			}
			ec.Etcd.Endpoints = []string{s.etcdURL}
			ec.Rules.File, ec.Rules.EtcdPrefix = rulesFile, contract.RulesPrefix
			ec.Listen.GRPC, ec.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
			ec.Shares.StaleAfter = cfg.Stale
			ec.Balancer.Enabled, ec.Balancer.Interval = true, cfg.Interval
			ec.Balancer.ViaAggregator = cfg.Aggregate
			ec.Balancer.TLS = enforcerapp.TLSConfig{Enabled: true, CAFile: s.certs.CA(),
				CertFile: s.certs.Enforcer(r.Name), KeyFile: s.certs.EnforcerKey(r.Name)}
			ec.Tracing = cfg.Tracing
			var e *enforcerapp.App
			var err error
			if store != nil {
				e, err = enforcerapp.NewWithStore(ec, cfg.Logger.Named(ec.ID), store)
			} else {
				e, err = enforcerapp.New(ec, cfg.Logger.Named(ec.ID))
			}
			if err != nil {
				return nil, fmt.Errorf("inprocess: enforcer %s: %w", ec.ID, err)
			}
			s.enforcers[r.Name] = append(s.enforcers[r.Name], e)
			s.run(func(ctx context.Context) error { return e.Run(ctx) })
		}
	}
	return s, nil
}

// startAggregator starts region's report aggregator as the balancer binary runs one
// (pkg/balancer/app with an aggregate section): its report API on loopback over mutual
// TLS (the balancer's server certificate, the CA verifying the region's enforcers),
// forwarding to the balancer leader with the region's certificate, elected in etcd.
func (s *Stack) startAggregator(region string, names []string, rulesFile string) error {
	bc := balancerapp.DefaultConfig()
	bc.Listen.TLS = balancerapp.ServerTLSConfig{Enabled: true, CertFile: s.certs.Balancer(), KeyFile: s.certs.BalancerKey(), ClientCAFile: s.certs.CA()}
	bc.Regions, bc.ID = names, "aggregator-"+region
	bc.Listen.GRPC, bc.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	bc.Etcd.Endpoints = []string{s.etcdURL}
	bc.Rules.File = rulesFile
	bc.Balance.Interval = s.cfg.Interval
	bc.Aggregate = balancerapp.AggregateConfig{Region: region, UpstreamTLS: tlsfiles.Client{Enabled: true, CAFile: s.certs.CA(),
		CertFile: s.certs.Enforcer(region), KeyFile: s.certs.EnforcerKey(region)}}
	bc.Tracing = s.cfg.Tracing
	a, err := balancerapp.New(bc, s.cfg.Logger.Named(bc.ID))
	if err != nil {
		return fmt.Errorf("inprocess: aggregator %s: %w", region, err)
	}
	s.aggs[region] = a.Aggregator()
	s.run(func(ctx context.Context) error { return a.Run(ctx) })
	return nil
}

// Aggregators returns each region's report aggregator (Config.Aggregate), nil without.
func (s *Stack) Aggregators() map[string]*aggregator.Aggregator { return s.aggs }

// run starts f in a goroutine the Stack owns; Close cancels its context and waits.
func (s *Stack) run(f func(context.Context) error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := f(s.ctx); err != nil && s.ctx.Err() == nil {
			s.cfg.Logger.Error("a part of the stack stopped", "error", err)
		}
	}()
}

func (s *Stack) startEtcd() error {
	peer, err := freePort()
	if err != nil {
		return err
	}
	client, err := freePort()
	if err != nil {
		return err
	}
	ec := embed.NewConfig()
	ec.Name = "inprocess"
	ec.Dir = filepath.Join(s.dir, "etcd")
	pu := url.URL{Scheme: "http", Host: peer}
	cu := url.URL{Scheme: "http", Host: client}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ec.InitialCluster = ec.Name + "=" + pu.String()
	// etcd logs its own listeners' closing at error level on every Close; the stack's
	// callers see etcd's health through the parts that use it.
	ec.LogLevel = "panic"
	ec.LogOutputs = []string{"stderr"}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("inprocess: while starting etcd: %w", err)
	}
	s.etcd = e
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		return errors.New("inprocess: etcd not ready within 30 s")
	}
	s.etcdURL = cu.String()
	return nil
}

// freePort returns a loopback address nothing listens on now. Another process may take
// it before etcd binds it; Start then fails and says so.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("inprocess: no free port: %w", err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// EtcdEndpoint is the embedded etcd's client URL.
func (s *Stack) EtcdEndpoint() string { return s.etcdURL }

// Targets maps each region to its enforcers' gRPC addresses (allot.v1 and Envoy RLS).
func (s *Stack) Targets() map[string][]string {
	out := make(map[string][]string, len(s.enforcers))
	for r, es := range s.enforcers {
		for _, e := range es {
			out[r] = append(out[r], e.GRPCAddr())
		}
	}
	return out
}

// HTTPTargets maps each region to its enforcers' HTTP addresses.
func (s *Stack) HTTPTargets() map[string][]string {
	out := make(map[string][]string, len(s.enforcers))
	for r, es := range s.enforcers {
		for _, e := range es {
			out[r] = append(out[r], e.HTTPAddr())
		}
	}
	return out
}

// Enforcers returns region's enforcers.
func (s *Stack) Enforcers(region string) []*enforcerapp.App { return s.enforcers[region] }

// Certs are the report API's certificates (a CA, the balancers', one per region).
func (s *Stack) Certs() certs.Files { return s.certs }

// Balancers returns the balancer replicas.
func (s *Stack) Balancers() []*balancerapp.App { return s.balancers }

// Leader returns the balancer replica leading now, or nil.
func (s *Stack) Leader() *balancerapp.App {
	for _, b := range s.balancers {
		if ok, _ := b.Service().Leading(); ok {
			return b
		}
	}
	return nil
}

// DashboardToken is a read-only dashboard token: with it the dashboard shows identities.
func (s *Stack) DashboardToken() string { return s.dashToken }

// DashboardURL is the leading replica's dashboard, signed in with DashboardToken (the
// page sets a cookie and drops the token from the address bar).
func (s *Stack) DashboardURL() string {
	return "http://" + s.BalancerHTTP() + "/dashboard/?token=" + s.dashToken
}

// BalancerHTTP is the HTTP address (dashboard, /metrics) of the leading replica, or of the
// first one while none leads.
func (s *Stack) BalancerHTTP() string {
	if b := s.Leader(); b != nil {
		return b.HTTPAddr()
	}
	if len(s.balancers) > 0 {
		return s.balancers[0].HTTPAddr()
	}
	return ""
}

// Close stops every part (enforcers, then balancers, then etcd), waits for them and
// removes a temporary Dir. Idempotent.
func (s *Stack) Close() error {
	s.once.Do(func() {
		var errs []error
		for _, es := range s.enforcers {
			for _, e := range es {
				errs = append(errs, e.Close())
			}
		}
		for _, b := range s.balancers {
			errs = append(errs, b.Close())
		}
		s.cancel()
		s.wg.Wait()
		if s.etcd != nil {
			s.etcd.Close()
			<-s.etcd.Server.StopNotify()
		}
		if s.tempDir {
			errs = append(errs, os.RemoveAll(s.dir))
		}
		s.err = errors.Join(errs...)
	})
	return s.err
}
