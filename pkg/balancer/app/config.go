// Package app wires one balancer replica: configuration (file, flags, ALLOT_*
// environment), the etcd client, the rules sources the identity limits come from, the
// balancer Service (election, fenced publisher, report API), the gRPC and HTTP servers,
// metrics and graceful shutdown (resigning leadership). cmd/balancer stays a few lines.
package app

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/tlsfiles"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Config is one balancer replica's configuration (configs/balancer.yaml). Every field has
// a default except Regions and the etcd endpoints; flags and ALLOT_* variables override
// the file (see Parse).
type Config struct {
	// Regions are the regions shares are split between, in a fixed order. Required.
	Regions []string `yaml:"regions"`
	// Weights give the default split of rules that list no `shares:` (region → weight,
	// > 0; regions not listed weigh 1), in the enforcers' syntax (contract.Regions).
	// Empty: equal. Enforcers must be given the same.
	Weights contract.Regions `yaml:"weights"`
	// ID names this replica in logs. Default host-pid.
	ID string `yaml:"id"`

	Listen  ListenConfig  `yaml:"listen"`
	Etcd    EtcdConfig    `yaml:"etcd"`
	Rules   RulesConfig   `yaml:"rules"`
	Balance BalanceConfig `yaml:"balance"`
	Share   ShareConfig   `yaml:"share"`
	Admin   AdminConfig   `yaml:"admin"`
	// Dashboard: who sees customers' identities on /dashboard/ (dashboard.go).
	Dashboard DashboardConfig `yaml:"dashboard"`
	// Aggregate, with a region, makes this process that region's report aggregator
	// instead of a balancer replica (aggregate.go). Off by default.
	Aggregate AggregateConfig `yaml:"aggregate"`

	// DrainTimeout bounds graceful shutdown. Default 10s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// LogLevel is trace, debug, info, warn or error; LogJSON writes JSON lines.
	LogLevel string `yaml:"log_level"`
	LogJSON  bool   `yaml:"log_json"`

	// Tracing is OpenTelemetry tracing, configured by the standard OTEL_* environment
	// variables only (Parse reads them: appkit.TracingFromEnv), never by the file or
	// flags. Off by default.
	Tracing appkit.Tracing `yaml:"-"`
}

// ListenConfig: where the report API (gRPC) and /metrics, /healthz, /readyz, /dashboard/
// (HTTP) listen.
type ListenConfig struct {
	GRPC string `yaml:"grpc"`
	HTTP string `yaml:"http"`
	// Advertise is the report address enforcers are redirected to (the campaign value).
	// Default: the bound gRPC address.
	Advertise string `yaml:"advertise"`
	// DashboardURL is this replica's dashboard as a viewer reaches it, which standbys'
	// dashboards link to while it leads. Default: http(s)://<bound HTTP address>/dashboard/.
	DashboardURL string `yaml:"dashboard_url"`
	// TLS for the report API (server side). With ClientCAFile (mutual TLS), a report is
	// taken only for the region its client certificate names (pkg/certs). Required
	// unless InsecureReports.
	TLS ServerTLSConfig `yaml:"tls"`
	// InsecureReports is the explicit opt-out: the report API without mutual TLS, which
	// believes any report from anyone who reaches it. Refused on a non-loopback address
	// unless InsecureReportsBeyondLoopback too; New logs a warning either way.
	InsecureReports               bool `yaml:"insecure_reports"`
	InsecureReportsBeyondLoopback bool `yaml:"insecure_reports_beyond_loopback"`
}

// mutualTLS reports whether the report API verifies enforcers' client certificates.
func (l ListenConfig) mutualTLS() bool { return l.TLS.Enabled && l.TLS.ClientCAFile != "" }

// certsHint says how to make the report API's certificates.
const certsHint = "`balancer certs -dir bin/certs -regions <regions>` makes a CA, the balancer's certificate and one per region (configs/balancer.yaml names them)"

// isLoopback reports whether addr ("host:port") listens on loopback only.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ServerTLSConfig is the report API's TLS. With ClientCAFile set, enforcers must present
// a certificate signed by it.
type ServerTLSConfig = tlsfiles.Server

// TLSConfig is client TLS to etcd. Files are PEM.
type TLSConfig = tlsfiles.Client

// EtcdConfig: the cluster holding the election, the share sets and (optionally) rules.
type EtcdConfig struct {
	// endpoints, username, password, tls, dial_timeout: shared with the other binary.
	appkit.EtcdClient `yaml:",inline"`
	// ElectionPrefix is where replicas campaign. Default /allot/balancer/election.
	ElectionPrefix string `yaml:"election_prefix"`
	// SharesPrefix is where share sets are published. Default /allot/shares/.
	SharesPrefix string `yaml:"shares_prefix"`
	// SessionTTL is the election lease (whole seconds): a dead leader is replaced after
	// it. Default 10s.
	SessionTTL time.Duration `yaml:"session_ttl"`
	// WriteTimeout bounds each etcd transaction. Default 5s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
}

// RulesConfig: the same rules the enforcers load (a file, an etcd prefix, or both).
type RulesConfig struct {
	File         string        `yaml:"file"`
	EtcdPrefix   string        `yaml:"etcd_prefix"`
	PollInterval time.Duration `yaml:"poll_interval"`
	IPv6Prefix   int           `yaml:"ipv6_prefix"`
}

// BalanceConfig tunes the core (balancer.CoreConfig); see its fields for the meaning.
type BalanceConfig struct {
	Interval      time.Duration `yaml:"interval"`
	EarlyGap      time.Duration `yaml:"early_gap"`
	ShiftGap      time.Duration `yaml:"shift_gap"`
	Learning      time.Duration `yaml:"learning"`
	AckTimeout    time.Duration `yaml:"ack_timeout"`
	MinVersionGap time.Duration `yaml:"min_version_gap"`
	SilentAfter   time.Duration `yaml:"silent_after"`
	Stale         time.Duration `yaml:"stale"`
	KeyTTL        time.Duration `yaml:"key_ttl"`
	TickEvery     time.Duration `yaml:"tick_every"`
	MaxEntries    int           `yaml:"max_entries"`
	MaxIdentities int           `yaml:"max_identities"`
	MaxPublished  int           `yaml:"max_published"`
	MaxEnforcers  int           `yaml:"max_enforcers"`
	// MaxQuotaEntries caps the calendar quotas the leader keeps counts of (balancer.CoreConfig).
	MaxQuotaEntries int `yaml:"max_quota_entries"`
}

// ShareConfig tunes the policy (share.Config).
type ShareConfig struct {
	Floor    float64 `yaml:"floor"`
	Alpha    float64 `yaml:"alpha"`
	DeadBand float64 `yaml:"dead_band"`
	Headroom float64 `yaml:"headroom"`
}

// DefaultConfig returns the defaults (balancer.DefaultCoreConfig's, DefaultServiceConfig's).
func DefaultConfig() Config {
	cc, sc := balancer.DefaultCoreConfig(), balancer.DefaultServiceConfig()
	return Config{
		Listen:    ListenConfig{GRPC: "127.0.0.1:9090", HTTP: "127.0.0.1:9091"},
		Admin:     defaultAdminConfig(),
		Dashboard: DashboardConfig{TokensEnv: "ALLOT_DASHBOARD_TOKENS"},
		Etcd: EtcdConfig{EtcdClient: appkit.EtcdClient{DialTimeout: 2 * time.Second}, ElectionPrefix: contract.ElectionPrefix,
			SharesPrefix: contract.SharesPrefix, SessionTTL: sc.SessionTTL, WriteTimeout: sc.WriteTimeout},
		Rules: RulesConfig{PollInterval: 2 * time.Second, IPv6Prefix: 64},
		Balance: BalanceConfig{Interval: cc.Interval, EarlyGap: cc.EarlyGap, ShiftGap: cc.ShiftGap, Learning: cc.Learning, AckTimeout: cc.AckTimeout,
			MinVersionGap: cc.MinVersionGap,
			SilentAfter:   cc.SilentAfter, Stale: cc.Stale, KeyTTL: cc.KeyTTL, TickEvery: sc.TickEvery,
			MaxEntries: cc.MaxEntries, MaxIdentities: cc.MaxIdentities, MaxPublished: cc.MaxPublished, MaxEnforcers: cc.MaxEnforcers,
			MaxQuotaEntries: cc.MaxQuotaEntries},
		Share:        ShareConfig{Floor: cc.Share.Floor, Alpha: cc.Share.Alpha, DeadBand: cc.Share.DeadBand, Headroom: cc.Share.Headroom},
		DrainTimeout: 10 * time.Second,
		LogLevel:     "info",
	}
}

// weights returns the weights in Regions order (nil: equal).
func (c *Config) weights() []float64 {
	if len(c.Weights) == 0 {
		return nil
	}
	out := make([]float64, len(c.Regions))
	for i, r := range c.Regions {
		out[i] = 1
		if w, ok := c.Weights[r]; ok {
			out[i] = w
		}
	}
	return out
}

// coreConfig is the balancer.CoreConfig the file describes (Limits unset).
func (c *Config) coreConfig() balancer.CoreConfig {
	cc := balancer.DefaultCoreConfig()
	b := c.Balance
	cc.Regions, cc.Weights = c.Regions, c.weights()
	cc.Interval, cc.EarlyGap, cc.ShiftGap, cc.Learning, cc.AckTimeout = b.Interval, b.EarlyGap, b.ShiftGap, b.Learning, b.AckTimeout
	cc.SilentAfter, cc.Stale, cc.KeyTTL, cc.MinVersionGap = b.SilentAfter, b.Stale, b.KeyTTL, b.MinVersionGap
	cc.MaxEntries, cc.MaxIdentities, cc.MaxPublished, cc.MaxEnforcers = b.MaxEntries, b.MaxIdentities, b.MaxPublished, b.MaxEnforcers
	cc.MaxQuotaEntries = b.MaxQuotaEntries
	cc.Share.Floor, cc.Share.Alpha, cc.Share.DeadBand, cc.Share.Headroom = c.Share.Floor, c.Share.Alpha, c.Share.DeadBand, c.Share.Headroom
	return cc
}

// Validate names every bad field and value.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("app: config: "+format, a...)) }
	if len(c.Regions) == 0 {
		bad("regions is empty (set regions:, -regions or ALLOT_REGIONS)")
	}
	for r := range c.Weights {
		found := false
		for _, x := range c.Regions {
			found = found || x == r
		}
		if !found {
			bad("weights names region %q, not in regions %v", r, c.Regions)
		}
	}
	if len(c.Etcd.Endpoints) == 0 {
		bad("etcd.endpoints is empty: the election and the shares live in etcd")
	}
	errs = append(errs, c.validateAggregate()...)
	if c.Rules.File == "" && c.Rules.EtcdPrefix == "" && !c.aggregating() {
		bad("no rules: set rules.file and/or rules.etcd_prefix")
	}
	if c.Listen.GRPC == "" {
		bad("listen.grpc is empty: the report API needs an address")
	}
	if t := c.Listen.TLS; t.Enabled && (t.CertFile == "" || t.KeyFile == "") {
		bad("listen.tls.enabled needs cert_file and key_file")
	}
	switch l := c.Listen; {
	case l.mutualTLS():
	case !l.InsecureReports:
		bad("reports would not be authenticated: set listen.tls.enabled, cert_file, key_file and client_ca_file (mutual TLS; %s), or set listen.insecure_reports: true (-insecure-reports) to believe anyone's reports on loopback", certsHint)
	case !isLoopback(l.GRPC) && !l.InsecureReportsBeyondLoopback:
		bad("listen.insecure_reports with listen.grpc %q, not a loopback address: anyone who reaches it could forge reports; use mutual TLS (listen.tls.client_ca_file), listen on 127.0.0.1, or set listen.insecure_reports_beyond_loopback: true as well", l.GRPC)
	}
	if c.DrainTimeout <= 0 {
		bad("drain_timeout %v, must be > 0", c.DrainTimeout)
	}
	if c.Etcd.DialTimeout <= 0 {
		bad("etcd.dial_timeout %v, must be > 0", c.Etcd.DialTimeout)
	}
	if c.Rules.PollInterval <= 0 {
		bad("rules.poll_interval %v, must be > 0", c.Rules.PollInterval)
	}
	ok := false
	for _, l := range []string{"trace", "debug", "info", "warn", "error"} {
		ok = ok || strings.EqualFold(c.LogLevel, l)
	}
	if !ok {
		bad("log_level %q, want trace, debug, info, warn or error", c.LogLevel)
	}
	errs = append(errs, c.Admin.validate(c)...)
	sc := c.serviceConfig()
	// What New fills in is not the file's to get wrong: stand-ins for the checks.
	sc.Core.Limits = func(string, string) (balancer.Limits, bool) { return balancer.Limits{}, false }
	sc.Etcd = new(clientv3.Client)
	if sc.Advertise == "" {
		sc.Advertise = "bound-grpc-address"
	}
	if err := sc.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Tracing.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// serviceConfig is the balancer.ServiceConfig the file describes (Etcd, Limits, Clock,
// Logger and Registerer unset; Advertise from the config, maybe empty).
func (c *Config) serviceConfig() balancer.ServiceConfig {
	sc := balancer.DefaultServiceConfig()
	sc.Core = c.coreConfig()
	sc.ElectionPrefix, sc.SharesPrefix = c.Etcd.ElectionPrefix, c.Etcd.SharesPrefix
	sc.SessionTTL, sc.WriteTimeout, sc.TickEvery = c.Etcd.SessionTTL, c.Etcd.WriteTimeout, c.Balance.TickEvery
	sc.Advertise = c.Listen.Advertise
	return sc
}
