package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/aggregator"
	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/balancer/dashboard"
	"github.com/allot-dev/allot/pkg/cliconf"
	"github.com/allot-dev/allot/pkg/rules"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("app: closed")

// App is one running balancer replica. New builds and binds everything; Run serves and
// campaigns until its context ends, then shuts down gracefully (resigning leadership so a
// standby takes over at once); Close does the shutdown alone. Safe for concurrent use;
// Close is idempotent and waits for every goroutine App started.
type App struct {
	mu       sync.Mutex // mu guards serving and closeErr
	serving  bool
	closeErr error

	cfg   Config
	log   hclog.Logger
	reg   *prometheus.Registry
	etcd  *clientv3.Client
	files []*rules.FileSource
	srcs  []*rules.EtcdSource
	table *balancer.RuleTable
	svc   *balancer.Service
	agg   *aggregator.Aggregator // aggregate mode: instead of svc (and rules, dashboard, admin)
	dash  *dashboard.Dashboard
	srv   appkit.Servers
	trace *appkit.Traces // nil: tracing off
	mux   *http.ServeMux // the HTTP routes (admin.go adds the admin API's)
	rules *rules.Holder  // the rules in force here
	base  *rules.Set     // the base rules file under etcd's rules, nil without

	ctx    context.Context // ended by Close: the parent of every background goroutine
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	closed chan struct{}
}

// New builds a replica from cfg: etcd client, rules loaded (a bad rules file is an error;
// etcd rules not loaded yet is not), both listeners bound. On error everything already
// built is closed.
func New(cfg Config, log hclog.Logger) (_ *App, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	a := &App{cfg: cfg, log: log, reg: appkit.NewRegistry(), closed: make(chan struct{})}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if a.cfg.ID == "" {
		a.cfg.ID = cliconf.HostPID()
	}
	if a.trace, err = appkit.StartTracing(cfg.Tracing, attribute.String("service.name", "allot-balancer"),
		attribute.String("service.instance.id", a.cfg.ID)); err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	if t := cfg.Tracing; t.Enabled {
		log.Info("tracing", "endpoint", t.Endpoint, "sampler", t.Sampler, "ratio", t.Ratio)
	}
	if a.etcd, err = cfg.Etcd.Dial(); err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	if cfg.aggregating() {
		if err := a.listen(); err != nil {
			return nil, err
		}
		return a, a.buildAggregator()
	}
	if err := a.buildRules(); err != nil {
		return nil, err
	}
	if err := a.listen(); err != nil {
		return nil, err
	}
	sc := cfg.serviceConfig()
	sc.Core.Limits = a.table.Limits
	sc.Etcd, sc.Logger, sc.Registerer = a.etcd, log.Named("balancer"), a.reg
	sc.Tracer = a.trace.Tracer("github.com/allot-dev/allot/pkg/balancer")
	sc.RegionFromPeer = cfg.Listen.mutualTLS()
	if sc.Advertise == "" {
		sc.Advertise = a.GRPCAddr()
	}
	if h := a.cfg.Listen.DashboardURL; h != "" {
		sc.Dashboard = h
	} else if h := a.HTTPAddr(); h != "" {
		scheme := "http"
		if a.cfg.Admin.TLS.Enabled {
			scheme = "https"
		}
		sc.Dashboard = scheme + "://" + h + "/dashboard/"
	}
	if a.svc, err = balancer.NewService(sc); err != nil {
		return nil, err
	}
	if err := a.buildDashboard(); err != nil {
		return nil, err
	}
	allotv1.RegisterBalancerServer(a.srv.GRPC, dashboard.Tap(a.svc, a.dash))
	if err := a.buildAdmin(); err != nil {
		return nil, err
	}
	return a, nil
}

// buildRules loads the rules the enforcers load, compiled for no region with the region
// weights (see balancer.RuleTable).
func (a *App) buildRules() error {
	rc := a.cfg.Rules
	opt, err := balancer.CompileOptionsFor(a.cfg.Regions, a.cfg.weights(), rules.CompileOptions{IPv6Prefix: rc.IPv6Prefix})
	if err != nil {
		return err
	}
	var base *rules.Set
	if rc.EtcdPrefix != "" && rc.File != "" {
		if base, err = rules.LoadFile(rc.File); err == nil {
			err = base.Validate()
		}
		if err != nil {
			return fmt.Errorf("app: base rules file: %w", err)
		}
	}
	opts := []rules.Option{rules.WithInterval(rc.PollInterval), rules.WithLogger(a.log.Named("rules")),
		rules.WithOnError(func(err error) { a.log.Error(rules.Describe(err), "error", err) })}
	h := rules.NewHolder(nil)
	a.rules, a.base = h, base
	a.table = balancer.NewRuleTable(h, a.cfg.Regions)
	if rc.EtcdPrefix == "" {
		f, err := rules.NewFileSource(rc.File, h, opt, opts...)
		if err != nil {
			return fmt.Errorf("app: rules file: %w", err)
		}
		a.files = append(a.files, f)
		return nil
	}
	o := opts
	if base != nil {
		o = append(o, rules.WithBase(base))
		snap, err := rules.Compile(base, opt)
		if err != nil {
			return fmt.Errorf("app: base rules file: %w", err)
		}
		h.Store(snap) // serve the base until etcd answers
	}
	src, err := rules.NewEtcdSource(a.etcd, rc.EtcdPrefix, h, opt, o...)
	if err != nil {
		return fmt.Errorf("app: etcd rules: %w", err)
	}
	a.srcs = append(a.srcs, src)
	ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
	if err := src.Load(ctx); err != nil {
		a.log.Warn("rules not loaded from etcd at start; retrying", "error", err)
	}
	cancel()
	return nil
}

func (a *App) listen() (err error) {
	var opts []grpc.ServerOption
	srvTLS, err := a.cfg.Listen.TLS.Build()
	if err != nil {
		return fmt.Errorf("app: listen.tls (the report API's certificates): %w; %s", err, certsHint)
	}
	if !a.cfg.Listen.mutualTLS() {
		a.log.Warn("REPORTS ARE NOT AUTHENTICATED: listen.insecure_reports is set and listen.tls.client_ca_file is not; anyone who reaches "+
			a.cfg.Listen.GRPC+" can forge any region's usage and move its shares. Use mutual TLS outside a test.", "certs", certsHint)
	}
	if srvTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(srvTLS)))
	}
	// A report of MaxEntries identities is ≈ 60 bytes an entry.
	opts = append(opts, grpc.MaxRecvMsgSize(max(4<<20, 128*a.cfg.Balance.MaxEntries)))
	a.srv.GRPC = grpc.NewServer(opts...)
	mux := http.NewServeMux()
	a.mux = mux
	mux.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		role := "standby"
		if a.agg != nil && a.agg.Elected() {
			role = "aggregator"
		} else if a.svc != nil {
			if ok, _ := a.svc.Leading(); ok {
				role = "leader"
			}
		}
		fmt.Fprintln(w, "ready:", role)
	})
	if !a.cfg.aggregating() {
		a.serveDashboard(mux)
	}
	a.srv.HTTP = appkit.NewHTTPServer(mux, httpLimits)
	a.srv.Log = a.log
	if err := a.srv.Listen(a.cfg.Listen.GRPC, a.cfg.Listen.HTTP); err != nil {
		return fmt.Errorf("app: %w", err)
	}
	return nil
}

// GRPCAddr and HTTPAddr are the bound addresses ("" when not listening).
func (a *App) GRPCAddr() string { return a.srv.GRPCAddr() }

// HTTPAddr is the bound HTTP address.
func (a *App) HTTPAddr() string { return a.srv.HTTPAddr() }

// Service returns the balancer service (for tests).
func (a *App) Service() *balancer.Service { return a.svc }

// Aggregator returns the region's report aggregator in aggregate mode, else nil.
func (a *App) Aggregator() *aggregator.Aggregator { return a.agg }

// Registry returns the Prometheus registry every metric is in.
func (a *App) Registry() *prometheus.Registry { return a.reg }

// Ready is /readyz: it fails only when closed or when etcd rules never loaded (without a
// base file): a replica without rules would ignore every identity. A standby is ready (it
// answers reports with a redirect).
func (a *App) Ready() error {
	select {
	case <-a.closed:
		return ErrClosed
	default:
	}
	if a.cfg.Rules.File == "" {
		for _, s := range a.srcs {
			if st := s.Status(); st.Loads == 0 {
				return fmt.Errorf("rules: none loaded from etcd yet (last error: %v)", st.LastError)
			}
		}
	}
	return nil
}

// Run serves the report API and HTTP, keeps the rules sources running and campaigns; it
// returns when ctx ends or a server fails, after a graceful Close.
func (a *App) Run(ctx context.Context) error {
	a.mu.Lock()
	select {
	case <-a.closed:
		a.mu.Unlock()
		return ErrClosed
	default:
	}
	if a.serving {
		a.mu.Unlock()
		return errors.New("app: Run called twice")
	}
	a.serving = true
	a.mu.Unlock()
	errc := a.srv.Serve(&a.wg)
	if a.agg != nil {
		if err := a.agg.Start(); err != nil {
			return errors.Join(err, a.Close())
		}
		a.log.Info("serving as report aggregator", "id", a.cfg.ID, "region", a.cfg.Aggregate.Region, "grpc", a.GRPCAddr(), "http", a.HTTPAddr())
		var err error
		select {
		case <-ctx.Done():
		case err = <-errc:
			err = fmt.Errorf("app: %w", err)
		case <-a.closed:
		}
		return errors.Join(err, a.Close())
	}
	a.wg.Go(func() { a.dash.Run(a.ctx) })
	for _, f := range a.files {
		a.wg.Go(func() { f.Run(a.ctx) })
	}
	for _, s := range a.srcs {
		a.wg.Go(func() { s.Run(a.ctx) })
	}
	if err := a.svc.Start(); err != nil {
		return errors.Join(err, a.Close())
	}
	a.log.Info("serving", "id", a.cfg.ID, "regions", a.cfg.Regions, "grpc", a.GRPCAddr(), "http", a.HTTPAddr())
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		err = fmt.Errorf("app: %w", err)
	case <-a.closed:
	}
	return errors.Join(err, a.Close())
}

// Close resigns leadership, drains the servers (up to DrainTimeout), stops the rules
// sources, closes the etcd client and exports the queued spans (within the tracing
// shutdown timeout, 5 s). Idempotent; every call returns the first's result.
func (a *App) Close() error {
	a.once.Do(func() {
		var errs []error
		if a.svc != nil {
			errs = append(errs, a.svc.Close())
		}
		if a.agg != nil {
			errs = append(errs, a.agg.Close())
		}
		a.mu.Lock()
		serving := a.serving
		a.mu.Unlock()
		a.srv.Drain(a.cfg.DrainTimeout, serving)
		a.cancel()
		for _, f := range a.files {
			f.Close()
		}
		for _, s := range a.srcs {
			s.Close()
		}
		a.wg.Wait()
		if a.etcd != nil {
			if err := a.etcd.Close(); err != nil {
				errs = append(errs, fmt.Errorf("app: while closing etcd: %w", err))
			}
		}
		// Last, bounded (the tracing shutdown timeout): the spans still queued.
		if err := a.trace.Close(); err != nil {
			a.log.Warn("traces not all exported at shutdown", "error", err)
		}
		a.mu.Lock()
		a.closeErr = errors.Join(errs...)
		a.mu.Unlock()
		close(a.closed)
		a.log.Info("stopped", "id", a.cfg.ID)
	})
	<-a.closed
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closeErr
}

// httpLimits are the enforcer's (appkit.DefaultHTTPLimits) but for Write, longer because
// an admin apply writes to etcd (bounded by etcd.write_timeout, 5 s by default) before it
// answers.
var httpLimits = func() appkit.HTTPLimits {
	l := appkit.DefaultHTTPLimits
	l.Write = 30 * time.Second
	return l
}()
