package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/cliconf"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/grpcapi"
	"github.com/allot-dev/allot/pkg/enforcer/httpapi"
	"github.com/allot-dev/allot/pkg/enforcer/node"
	"github.com/allot-dev/allot/pkg/enforcer/overrides"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/quota"
	"github.com/allot-dev/allot/pkg/registry"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// App is one running enforcer process. New builds and binds everything; Run serves until
// its context ends and then shuts down gracefully; Close does the shutdown alone. Safe for
// concurrent use; Close is idempotent and waits for every goroutine App started.
type App struct {
	cfg   Config
	log   hclog.Logger
	clock clock.Clock
	reg   *prometheus.Registry

	holder *rules.Holder
	file   polledRules // file-only rules (a rules file, a directory of envoyproxy/ratelimit files, their xDS server); nil otherwise
	xds    *xdsRules   // the same source as file when the rules come over xDS; nil otherwise
	base   string      // rules file layered under etcd rules ("" if none)

	etcd     *clientv3.Client
	registry *registry.Registry

	sharesW *overrides.Watcher // nil without etcd or with shares.disabled

	redis      redis.UniversalClient
	redisStore *bucket.Redis
	store      bucket.Store // the bucket store under the node: memory, or redisStore

	node   *node.Node // the check core over its layers, shares and usage reports
	srv    appkit.Servers
	debug  *debugServer // listen.debug; nil when not set (debug.go)
	health *health.Server
	traces *appkit.Traces // nil: tracing off

	ctx    context.Context // ended by Close: the parent of every background goroutine
	cancel context.CancelFunc
	wg     sync.WaitGroup

	stopping atomic.Bool // the pre-stop delay has begun: /readyz fails (prestop.go)

	mu       sync.Mutex        // mu guards etcdSrc, serving and closeErr
	etcdSrc  *rules.EtcdSource // set once by buildRules; Reload gives it a new base (SetBase)
	serving  bool              // Run has started the servers
	closeErr error             // Close's result
	once     sync.Once         // Close
	closed   chan struct{}     // closed when Close has finished
}

// New builds an enforcer from cfg: rules loaded, store stack built, registered in etcd
// (bounded by Etcd.StartTimeout: past it the registry keeps trying in the background),
// and both listeners bound (so Addr methods answer before Run). On error everything
// already built is closed.
func New(cfg Config, log hclog.Logger) (*App, error) { return newApp(cfg, log, nil, clock.Real()) }

// NewWithStore is New with store in place of the memory store cfg.Store configures: the
// enforcers of one region in one process (regionsim's demo, pkg/inprocess) share one
// store standing for that region's Redis Cluster. cfg.Store.Kind must be "memory".
func NewWithStore(cfg Config, log hclog.Logger, store bucket.Store) (*App, error) {
	if cfg.Store.Kind != "memory" || store == nil {
		return nil, fmt.Errorf("app: NewWithStore needs store.kind memory and a store (kind %q)", cfg.Store.Kind)
	}
	return newApp(cfg, log, store, clock.Real())
}

// newApp is New with, for tests, a store used instead of the configured memory store and
// the clock every part keeps time with.
func newApp(cfg Config, log hclog.Logger, store bucket.Store, clk clock.Clock) (_ *App, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	a := &App{cfg: cfg, log: log, clock: clk, reg: appkit.NewRegistry(), closed: make(chan struct{}), store: store}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if a.cfg.ID == "" {
		a.cfg.ID = cliconf.HostPID()
	}

	if len(cfg.Etcd.Endpoints) > 0 {
		var err error
		if a.etcd, err = cfg.Etcd.Dial(); err != nil {
			return nil, fmt.Errorf("app: %w", err)
		}
	}
	if err := a.startTracing(); err != nil {
		return nil, err
	}
	if err := a.buildRules(); err != nil {
		return nil, err
	}
	if err := a.buildStore(); err != nil {
		return nil, err
	}
	if err := a.buildNode(); err != nil {
		return nil, err
	}
	if err := a.startShares(); err != nil {
		return nil, err
	}
	if err := a.listen(); err != nil {
		return nil, err
	}
	if a.etcd != nil {
		if err := a.register(); err != nil {
			return nil, err
		}
	}
	if err := registerLayerMetrics(a); err != nil {
		return nil, err
	}
	return a, nil
}

// startTracing starts the process's tracer provider when the OTEL_* variables configure
// an exporter (cfg.Tracing): then every check and usage report is a span (pkg/tracing).
func (a *App) startTracing() (err error) {
	a.traces, err = appkit.StartTracing(a.cfg.Tracing, attribute.String("service.name", "allot-enforcer"),
		attribute.String("service.instance.id", a.cfg.ID), attribute.String("allot.region", a.cfg.Region))
	if err != nil {
		return fmt.Errorf("app: %w", err)
	}
	if t := a.cfg.Tracing; t.Enabled {
		a.log.Info("tracing", "endpoint", t.Endpoint, "sampler", t.Sampler, "ratio", t.Ratio)
	}
	return nil
}

func (a *App) compileOptions() rules.CompileOptions {
	return rules.CompileOptions{Region: a.cfg.Region, Regions: a.cfg.Regions, IPv6Prefix: a.cfg.Rules.IPv6Prefix}
}

func (a *App) onRulesError(err error) {
	a.log.Error(rules.Describe(err), "error", err)
}

func (a *App) onRulesLoad(s *rules.Snapshot) {
	a.log.Info("rules loaded", "version", s.Version(), "rules", s.Len())
}

func (a *App) sourceOptions() []rules.Option {
	return []rules.Option{
		rules.WithClock(a.clock), rules.WithInterval(a.cfg.Rules.PollInterval), rules.WithLogger(a.log.Named("rules")),
		rules.WithOnError(a.onRulesError), rules.WithOnLoad(a.onRulesLoad),
	}
}

// buildRules loads the rules: a bad file at start is an error (an enforcer should not
// start on rules it cannot read); etcd unreachable at start is not (the holder serves the
// file base, or nothing, until etcd answers).
func (a *App) buildRules() error {
	a.holder = rules.NewHolder(nil)
	rc := a.cfg.Rules
	if rc.Format == FormatEnvoy && rc.XDS.Server != "" {
		src, err := newXDSRules(a)
		if err != nil {
			return err
		}
		a.file, a.xds = src, src
		return src.start(a.ctx, a.cfg.Etcd.StartTimeout)
	}
	if rc.Format == FormatEnvoy {
		src, err := rules.NewEnvoyDirSource(rc.Dir, rc.MergeDomains, a.holder, a.compileOptions(), a.sourceOptions()...)
		if err != nil {
			return fmt.Errorf("app: rules dir (%s): %w", FormatEnvoy, err)
		}
		a.file = src
		return nil
	}
	if rc.EtcdPrefix == "" {
		f, err := rules.NewFileSource(rc.File, a.holder, a.compileOptions(), a.sourceOptions()...)
		if err != nil {
			return fmt.Errorf("app: rules file: %w", err)
		}
		a.file = f
		return nil
	}
	a.base = rc.File
	var set *rules.Set
	if a.base != "" {
		var err error
		if set, err = loadBase(a.base); err != nil {
			return err
		}
		// Serve the base rules until etcd answers.
		opt := a.compileOptions()
		opt.Now = a.clock.Now()
		snap, err := rules.Compile(set, opt)
		if err != nil {
			return fmt.Errorf("app: base rules file: %w", err)
		}
		a.holder.Store(snap)
	}
	src, err := a.newEtcdSource(set)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(a.ctx, a.cfg.Etcd.StartTimeout)
	defer cancel()
	if err := src.Load(ctx); err != nil {
		a.log.Warn("rules not loaded from etcd at start; serving the base rules (if any) and retrying", "error", err)
	}
	a.mu.Lock()
	a.etcdSrc = src
	a.mu.Unlock()
	return nil
}

// polledRules is a rules source the process polls and reloads on SIGHUP:
// *rules.FileSource, *rules.EnvoyDirSource or *xdsRules.
type polledRules interface {
	Run(ctx context.Context) error
	Reload() error
	Status() rules.Status
	Close() error
}

// newEtcdSource builds an etcd rules source layered over base (nil: none).
func (a *App) newEtcdSource(base *rules.Set) (*rules.EtcdSource, error) {
	opts := a.sourceOptions()
	if base != nil {
		opts = append(opts, rules.WithBase(base))
	}
	src, err := rules.NewEtcdSource(a.etcd, a.cfg.Rules.EtcdPrefix, a.holder, a.compileOptions(), opts...)
	if err != nil {
		return nil, fmt.Errorf("app: etcd rules: %w", err)
	}
	return src, nil
}

// peers is N for the lease and fallback layers.
func (a *App) peers() int {
	if a.registry != nil {
		return a.registry.Peers()
	}
	return a.cfg.Peers
}

// buildStore builds the bucket store the node is layered over: memory, or Redis.
func (a *App) buildStore() error {
	sc := a.cfg.Store
	if sc.Kind == "memory" {
		if a.store == nil {
			a.store = bucket.NewMemory(a.clock, sc.MaxKeys)
		}
		return nil
	}
	tlsCfg, err := sc.TLS.Build()
	if err != nil {
		return fmt.Errorf("app: redis tls: %w", err)
	}
	// RESP2: with RESP3 go-redis looks for push notifications around every command, which
	// cost ~3.5% of the server's CPU under load; the take script needs nothing RESP3 adds.
	// No retries: a retried script may take twice (errs under) and the fallback layer's
	// deadline leaves no room for one anyway.
	if sc.Kind == "redis-cluster" {
		a.redis = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: sc.Addrs, Username: sc.Username, Password: sc.Password, TLSConfig: tlsCfg,
			DialTimeout: sc.DialTimeout, ReadTimeout: sc.ReadTimeout, WriteTimeout: sc.WriteTimeout,
			PoolSize: sc.PoolSize, MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true, Protocol: 2,
			// A paused or dead master sends no MOVED, so without a periodic reload the
			// client keeps sending its slots to it for up to a minute after a replica took
			// over (go-redis's default); the breaker would keep those keys local that long.
			ClusterStateReloadInterval: time.Second,
		})
	} else {
		a.redis = redis.NewClient(&redis.Options{
			Addr: sc.Addrs[0], Username: sc.Username, Password: sc.Password, TLSConfig: tlsCfg,
			DialTimeout: sc.DialTimeout, ReadTimeout: sc.ReadTimeout, WriteTimeout: sc.WriteTimeout,
			PoolSize: sc.PoolSize, MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true, Protocol: 2,
		})
	}
	if a.redisStore, err = bucket.NewRedis(a.redis, bucket.RedisOptions{KeyPrefix: sc.KeyPrefix, Pipeline: sc.Pipeline}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(a.ctx, sc.DialTimeout+time.Second)
	if err := a.redisStore.Preload(ctx); err != nil {
		a.log.Warn("could not load the take script at start; Redis takes will load it on first use", "error", err)
	}
	cancel()
	a.store = a.redisStore
	return nil
}

// buildNode composes the enforcer node over the store (pkg/enforcer/node: the same Build
// regionsim runs), with this process's dependencies: its clock, registry, peers and the
// gRPC report transport.
func (a *App) buildNode() (err error) {
	nc := a.cfg.nodeConfig()
	deps := node.Deps{
		Rules: a.holder, Store: a.store, Peers: a.peers, Clock: a.clock, Logger: a.log, Registerer: a.reg,
		Transport: a.reportTransport, Tracing: a.traces.Provider(),
	}
	if a.redisStore != nil {
		deps.Peek = a.redisStore // explain reads levels in Redis, under fallback → lease
		deps.Shard = a.redisStore.ShardOf
		deps.Quotas = a.redisStore // calendar quota counters beside the buckets
	} else {
		deps.Quotas = quota.NewMemory() // the memory store: this process's counts only
	}
	if nc.Layers {
		if !nc.NoLease {
			deps.LeaseObserver = newLeaseMetrics(a.reg)
		}
		deps.FallbackObserver = newFallbackMetrics(a.reg)
	}
	a.node, err = node.Build(nc, deps)
	return err
}

// reportTransport sends the node's usage reports to the balancer over gRPC: to
// balancer.addrs, or to the leader named in etcd.
func (a *App) reportTransport(rc report.ReporterConfig) (node.Reporter, error) {
	bc := a.cfg.Balancer
	tlsCfg, err := bc.TLS.Build()
	if err != nil {
		return nil, fmt.Errorf("app: balancer.tls (this region's report certificate): %w; `balancer certs -dir bin/certs` makes them", err)
	}
	if tlsCfg == nil || len(tlsCfg.Certificates) == 0 {
		a.log.Warn("USAGE REPORTS ARE NOT AUTHENTICATED: balancer.insecure is set; only a balancer that believes anyone's reports (listen.insecure_reports) takes them. Use mutual TLS outside a test.")
	}
	if len(bc.Addrs) > 0 {
		rc.Addrs = bc.Addrs // as this region reaches the replicas
	} else if bc.ViaAggregator {
		rc.Leader = report.EtcdLeader(a.etcd, contract.AggregatorElection(bc.AggregatorPrefix, a.cfg.Region))
	} else {
		rc.Leader = report.EtcdLeader(a.etcd, bc.ElectionPrefix)
	}
	rc.TLS = tlsCfg
	overrideIfSet(&rc.SendTimeout, bc.SendTimeout)
	r, err := report.NewReporter(rc)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (a *App) listen() (err error) {
	ka := keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
		MaxConnectionAge: a.cfg.Listen.MaxConnectionAge, MaxConnectionAgeGrace: a.cfg.maxConnectionAgeGrace()}
	tlsOpt, err := a.grpcTLS()
	if err != nil {
		return err
	}
	a.srv.GRPC = grpc.NewServer(
		tlsOpt,
		grpc.ChainUnaryInterceptor(grpcapi.RecoverUnary(a.log.Named("grpc"))),
		grpc.MaxRecvMsgSize(64<<10),
		grpc.MaxConcurrentStreams(a.cfg.Listen.MaxConcurrentStreams),
		grpc.KeepaliveParams(ka),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Reused workers keep their grown stacks: a goroutine per call spent ~13% of the
		// server's CPU growing (copying) stacks. Past the pool, gRPC starts a goroutine.
		grpc.NumStreamWorkers(uint32(32*runtime.GOMAXPROCS(0))),
		// Envoy's request and allot's answer by hand, everything else by gRPC's protobuf
		// codec (grpcapi.Codec: the same bytes, a third of the CPU).
		grpc.ForceServerCodecV2(grpcapi.Codec()),
	)
	grpcapi.New(a.node.Enforcer(), a.cfg.grpcConfig()).Register(a.srv.GRPC)
	a.health = health.NewServer()
	healthpb.RegisterHealthServer(a.srv.GRPC, a.health)
	var h http.Handler = httpapi.Handler(a.node.Enforcer(), a.cfg.authConfig(), a.reg, a.Ready, a.log.Named("http"))
	if h, err = a.withExplain(h); err != nil { // GET /v1/explain (explain.go)
		return err
	}
	if a.cfg.Pprof {
		mux := http.NewServeMux()
		mux.Handle("/", h)
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		h = mux
	}
	a.srv.HTTP = appkit.NewHTTPServer(h, appkit.DefaultHTTPLimits)
	a.srv.Log = a.log
	if err := a.srv.Listen(a.cfg.Listen.GRPC, a.cfg.Listen.HTTP); err != nil {
		return fmt.Errorf("app: %w", err)
	}
	return a.listenDebug()
}

// register joins the region in etcd; a slow or absent etcd only delays it.
func (a *App) register() error {
	addr := a.cfg.Listen.Advertise
	if addr == "" {
		addr = a.GRPCAddr()
	}
	if addr == "" {
		addr = a.HTTPAddr()
	}
	rc := registry.DefaultConfig()
	rc.Region, rc.ID, rc.Addr = a.cfg.Region, a.cfg.ID, addr
	rc.HTTPAddr = a.HTTPAddr() // for the balancer's explain
	rc.Prefix, rc.TTL, rc.Logger, rc.Clock = a.cfg.Etcd.RegistryPrefix, a.cfg.Etcd.RegistrationTTL, a.log.Named("registry"), a.clock
	r, err := registry.New(a.etcd, rc)
	if err != nil {
		return err
	}
	a.registry = r
	r.OnChange(func(n int) { a.log.Info("peers in region changed", "peers", n) })
	ctx, cancel := context.WithTimeout(a.ctx, a.cfg.Etcd.StartTimeout)
	defer cancel()
	switch err := r.Start(ctx); {
	case errors.Is(err, registry.ErrDuplicateID):
		return fmt.Errorf("app: %w", err)
	case err != nil:
		a.log.Warn("not registered in etcd yet; serving with the last known peer count and retrying", "error", err)
	}
	return nil
}

// GRPCAddr and HTTPAddr are the bound addresses ("" when not listening).
func (a *App) GRPCAddr() string { return a.srv.GRPCAddr() }

// HTTPAddr is the bound HTTP address.
func (a *App) HTTPAddr() string { return a.srv.HTTPAddr() }

// Enforcer returns the check core (for tests and embedding).
func (a *App) Enforcer() *enforcer.Enforcer { return a.node.Enforcer() }

// Node returns the enforcer node: the check core, its layers, shares and usage table.
func (a *App) Node() *node.Node { return a.node }

// Registry returns the Prometheus registry every metric is in.
func (a *App) Registry() *prometheus.Registry { return a.reg }

// Rules returns the holder of the rules in force.
func (a *App) Rules() *rules.Holder { return a.holder }

// overrideIfSet replaces a layer's default with the configured value when one was given
// (zero means "use the layer's default").
func overrideIfSet[T int | int64 | uint64 | float64 | time.Duration](dst *T, v T) {
	if v > 0 {
		*dst = v
	}
}
