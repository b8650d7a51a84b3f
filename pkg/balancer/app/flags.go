package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/cliconf"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/tlsfiles"
)

// weights parses "us-east=2,eu-west=1" (contract.ParseRegions, every weight written).
func weights(c *Config, v string) error {
	for _, kv := range strings.Split(v, ",") {
		if kv = strings.TrimSpace(kv); kv != "" && !strings.Contains(kv, "=") {
			return fmt.Errorf("%q: want region=weight", kv)
		}
	}
	m, err := contract.ParseRegions(v)
	if err != nil {
		return fmt.Errorf("%w: want region=weight", err)
	}
	c.Weights = m
	return nil
}

// overrides are the settings flags and ALLOT_* variables change, in the order the
// environment is read.
var overrides = slices.Concat([]cliconf.Override[Config]{
	{Name: "regions", Usage: "comma-separated regions, in a fixed order", Apply: cliconf.List(func(c *Config) *[]string { return &c.Regions })},
	{Name: "weights", Usage: "default split weights, region=weight,... (default equal)", Apply: weights},
	{Name: "id", Usage: "this replica's name in logs (default host-pid)", Apply: cliconf.Str(func(c *Config) *string { return &c.ID })},
	{Name: "grpc-addr", Usage: "report API (gRPC) listen address", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.GRPC })},
	{Name: "http-addr", Usage: "HTTP listen address (/metrics, /healthz, /readyz)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.HTTP })},
	{Name: "advertise-addr", Usage: "report address standbys redirect enforcers to (default the gRPC address)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.Advertise })},
	{Name: "dashboard-url", Usage: "this replica's dashboard URL as viewers reach it (standbys link to the leader's; default from the HTTP address)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.DashboardURL })},
	{Name: "tls", Usage: "serve the report API over TLS", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Listen.TLS.Enabled })},
	{Name: "tls-cert", Usage: "report API certificate", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.TLS.CertFile })},
	{Name: "tls-key", Usage: "report API key", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.TLS.KeyFile })},
	{Name: "tls-client-ca", Usage: "CA enforcers' client certificates must chain to (mutual TLS)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.TLS.ClientCAFile })},
	{Name: "insecure-reports", Usage: "accept reports without mutual TLS (anyone's; loopback only unless -insecure-reports-beyond-loopback)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Listen.InsecureReports })},
	{Name: "insecure-reports-beyond-loopback", Usage: "allow -insecure-reports on a non-loopback address", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Listen.InsecureReportsBeyondLoopback })},
	{Name: "etcd-endpoints", Usage: "comma-separated etcd client URLs", Apply: cliconf.List(func(c *Config) *[]string { return &c.Etcd.Endpoints })},
	{Name: "etcd-username", Usage: "etcd user", Apply: cliconf.Str(func(c *Config) *string { return &c.Etcd.Username })},
	{Name: "etcd-password", Usage: "etcd password (prefer the environment variable)", Apply: cliconf.Str(func(c *Config) *string { return &c.Etcd.Password })},
}, cliconf.ClientTLS("etcd", "etcd", func(c *Config) *tlsfiles.Client { return &c.Etcd.TLS }), []cliconf.Override[Config]{
	{Name: "election-prefix", Usage: "etcd prefix replicas campaign under", Apply: cliconf.Str(func(c *Config) *string { return &c.Etcd.ElectionPrefix })},
	{Name: "shares-prefix", Usage: "etcd prefix share sets are published under", Apply: cliconf.Str(func(c *Config) *string { return &c.Etcd.SharesPrefix })},
	{Name: "session-ttl", Usage: "election lease TTL (whole seconds)", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Etcd.SessionTTL })},
	{Name: "rules-file", Usage: "YAML rules file (the enforcers' rules)", Apply: cliconf.Str(func(c *Config) *string { return &c.Rules.File })},
	{Name: "rules-etcd-prefix", Usage: "etcd prefix holding one rule per key", Apply: cliconf.Str(func(c *Config) *string { return &c.Rules.EtcdPrefix })},
	{Name: "admin", Usage: "serve the admin API on the HTTP address (needs admin tokens)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Admin.Enabled })},
	{Name: "admin-tokens-file", Usage: "admin API tokens, name:secret a line", Apply: cliconf.Str(func(c *Config) *string { return &c.Admin.TokensFile })},
	{Name: "dashboard-tokens-file", Usage: "read-only dashboard tokens that see identities (name:secret a line; admin tokens see them too)", Apply: cliconf.Str(func(c *Config) *string { return &c.Dashboard.TokensFile })},
	{Name: "dashboard-show-identities", Usage: "show identities on the dashboard to everyone, token or not (a balancer nobody else reaches)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Dashboard.ShowIdentities })},
	{Name: "interval", Usage: "balancing interval", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Balance.Interval })},
	{Name: "learning", Usage: "a new leader's learning period", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Balance.Learning })},
	{Name: "ack-timeout", Usage: "how long an increase waits for unacknowledged decreases (>= propagation)", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Balance.AckTimeout })},
	{Name: "min-version-gap", Usage: "least time between two share set versions", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Balance.MinVersionGap })},
	{Name: "stale", Usage: "staleness period (as the enforcers')", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Balance.Stale })},
	{Name: "key-ttl", Usage: "an unreported identity returns to the default split after this", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Balance.KeyTTL })},
	{Name: "max-identities", Usage: "identities tracked at most", Apply: cliconf.Int(func(c *Config) *int { return &c.Balance.MaxIdentities })},
	{Name: "max-published", Usage: "identities listed in a share set at most", Apply: cliconf.Int(func(c *Config) *int { return &c.Balance.MaxPublished })},
	{Name: "share-floor", Usage: "share each region keeps in reserve", Apply: cliconf.Float(func(c *Config) *float64 { return &c.Share.Floor })},
	{Name: "drain-timeout", Usage: "graceful shutdown bound", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.DrainTimeout })},
	{Name: "log-level", Usage: "trace | debug | info | warn | error", Apply: cliconf.Str(func(c *Config) *string { return &c.LogLevel })},
	{Name: "log-json", Usage: "log JSON lines", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.LogJSON })},
})

// command is the balancer's command line: the overrides above over the config file.
var command = cliconf.Command[Config]{
	Name:          "balancer",
	Synopsis:      []string{"balancer probe [flags]   (GET /readyz on the HTTP address these flags give; exit 0 when ready)"},
	ConfigExample: "configs/balancer.yaml",
	Prefix:        "app: ", Overrides: overrides, Default: DefaultConfig, Validate: (*Config).Validate,
}

// Parse builds a balancer replica's configuration from, in increasing precedence:
// defaults, the config file (-config or ALLOT_CONFIG), ALLOT_* environment variables and
// flags, and validates it. Tracing comes from the OTEL_* variables alone
// (appkit.TracingFromEnv). getenv is os.Getenv in main. Usage and errors go to out.
func Parse(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	cfg, err := command.Parse(args, getenv, out)
	if err != nil {
		return cfg, err
	}
	if cfg.Tracing, err = appkit.TracingFromEnv(getenv); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// ParseUnchecked is Parse without Validate, for `balancer probe`, which needs only the
// HTTP address and whether it is TLS: a container's health check runs with the
// container's environment but not the server's command line.
func ParseUnchecked(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	c := command
	c.Validate = nil
	return c.Parse(args, getenv, out)
}

// HTTPOverTLS reports whether the HTTP listener of a replica with this configuration
// serves TLS (the admin API's admin.tls puts it there).
func (c *Config) HTTPOverTLS() bool { return c.Admin.Enabled && c.Admin.TLS.Enabled }

// IsHelp reports whether err is the -h/-help request (Parse has printed the usage).
func IsHelp(err error) bool { return errors.Is(err, flag.ErrHelp) }

// ErrHelp is the error of IsHelp.
var ErrHelp = flag.ErrHelp
