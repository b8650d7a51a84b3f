package app

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/cliconf"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/tlsfiles"
)

// settingOverrides are the settings flags and ALLOT_* variables change, in the order the
// environment is read.
var settingOverrides = slices.Concat([]cliconf.Override[Config]{
	{Name: "region", Usage: "region name", Apply: cliconf.Str(func(c *Config) *string { return &c.Region })},
	{Name: "id", Usage: "this enforcer's id within its region (default host-pid)", Apply: cliconf.Str(func(c *Config) *string { return &c.ID })},
	{Name: "store", Usage: "store kind: memory | redis | redis-cluster", Apply: cliconf.Str(func(c *Config) *string { return &c.Store.Kind })},
	{Name: "redis-addrs", Usage: "comma-separated Redis address(es)", Apply: cliconf.List(func(c *Config) *[]string { return &c.Store.Addrs })},
	{Name: "redis-username", Usage: "Redis ACL user", Apply: cliconf.Str(func(c *Config) *string { return &c.Store.Username })},
	{Name: "redis-password", Usage: "Redis password (prefer the environment variable)", Apply: cliconf.Str(func(c *Config) *string { return &c.Store.Password })},
}, cliconf.ClientTLS("redis", "Redis", func(c *Config) *tlsfiles.Client { return &c.Store.TLS }), []cliconf.Override[Config]{
	{Name: "redis-tls-insecure", Usage: "skip Redis certificate verification (tests only)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Store.TLS.InsecureSkipVerify })},
	{Name: "redis-key-prefix", Usage: "prefix of every Redis key", Apply: cliconf.Str(func(c *Config) *string { return &c.Store.KeyPrefix })},
	{Name: "redis-dial-timeout", Usage: "Redis dial timeout", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Store.DialTimeout })},
	{Name: "redis-read-timeout", Usage: "Redis read timeout", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Store.ReadTimeout })},
	{Name: "redis-write-timeout", Usage: "Redis write timeout", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Store.WriteTimeout })},
	{Name: "redis-pipeline", Usage: "coalesce concurrent Redis takes on one shard into one pipeline", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Store.Pipeline })},
	{Name: "redis-pool-size", Usage: "Redis connections per node", Apply: cliconf.Int(func(c *Config) *int { return &c.Store.PoolSize })},
	{Name: "etcd-endpoints", Usage: "comma-separated etcd client URLs", Apply: cliconf.List(func(c *Config) *[]string { return &c.Etcd.Endpoints })},
	{Name: "etcd-username", Usage: "etcd user", Apply: cliconf.Str(func(c *Config) *string { return &c.Etcd.Username })},
	{Name: "etcd-password", Usage: "etcd password (prefer the environment variable)", Apply: cliconf.Str(func(c *Config) *string { return &c.Etcd.Password })},
}, cliconf.ClientTLS("etcd", "etcd", func(c *Config) *tlsfiles.Client { return &c.Etcd.TLS }), []cliconf.Override[Config]{
	{Name: "etcd-registration-ttl", Usage: "etcd registration lease TTL (whole seconds)", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Etcd.RegistrationTTL })},
	{Name: "rules-file", Usage: "YAML rules file", Apply: cliconf.Str(func(c *Config) *string { return &c.Rules.File })},
	{Name: "rules-etcd-prefix", Usage: "etcd prefix holding one rule per key", Apply: cliconf.Str(func(c *Config) *string { return &c.Rules.EtcdPrefix })},
	{Name: "rules-poll-interval", Usage: "how often the rules file is checked for changes", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Rules.PollInterval })},
	{Name: "rules-format", Usage: "rules format: allot (rules file, etcd) | envoy-ratelimit (a directory of envoyproxy/ratelimit files)", Apply: cliconf.Str(func(c *Config) *string { return &c.Rules.Format })},
	{Name: "rules-dir", Usage: "directory of envoyproxy/ratelimit YAML files (rules format envoy-ratelimit)", Apply: cliconf.Str(func(c *Config) *string { return &c.Rules.Dir })},
	{Name: "rules-xds-server", Usage: "host:port of an xDS server pushing envoyproxy/ratelimit's configuration (rules format envoy-ratelimit; their CONFIG_GRPC_XDS_SERVER_URL)", Apply: cliconf.Str(func(c *Config) *string { return &c.Rules.XDS.Server })},
	{Name: "rules-xds-node-id", Usage: "the node id sent to the xDS server (default \"default\")", Apply: cliconf.Str(func(c *Config) *string { return &c.Rules.XDS.NodeID })},
	{Name: "rules-merge-domains", Usage: "merge the files of one domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Rules.MergeDomains })},
	{Name: "default-share", Usage: "removed (an error if set): the default split now comes from -regions", Apply: func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		c.Rules.DefaultShare = &f
		return err
	}},
	{Name: "regions", Usage: "every region enforcing the global limits, for the default split: us-east,eu-west or us-east=2,eu-west=1 (weights)", Apply: func(c *Config, v string) error {
		r, err := contract.ParseRegions(v)
		c.Regions = r
		return err
	}},
	{Name: "shares-etcd-prefix", Usage: "etcd prefix the balancer publishes shares under", Apply: cliconf.Str(func(c *Config) *string { return &c.Shares.EtcdPrefix })},
	{Name: "shares-stale-after", Usage: "shares not refreshed this long fall back to min(last, default)", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Shares.StaleAfter })},
	{Name: "shares-disabled", Usage: "do not watch the balancer's shares (default split only)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Shares.Disabled })},
	{Name: "balancer", Usage: "send usage reports to the quota balancer's leader (found through etcd)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Balancer.Enabled })},
	{Name: "balancer-election-prefix", Usage: "etcd prefix of the balancer's leader election", Apply: cliconf.Str(func(c *Config) *string { return &c.Balancer.ElectionPrefix })},
	{Name: "balancer-addrs", Usage: "comma-separated balancer report addresses as this region reaches them (instead of the leader's address in etcd)", Apply: cliconf.List(func(c *Config) *[]string { return &c.Balancer.Addrs })},
	{Name: "balancer-interval", Usage: "interval between usage reports", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Balancer.Interval })},
	{Name: "balancer-tls", Usage: "use TLS to the balancer's report API", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Balancer.TLS.Enabled })},
	{Name: "balancer-tls-ca", Usage: "CA file for the balancer's report API", Apply: cliconf.Str(func(c *Config) *string { return &c.Balancer.TLS.CAFile })},
	{Name: "balancer-tls-cert", Usage: "this region's client certificate for the balancer's report API (mutual TLS)", Apply: cliconf.Str(func(c *Config) *string { return &c.Balancer.TLS.CertFile })},
	{Name: "balancer-tls-key", Usage: "the key of -balancer-tls-cert", Apply: cliconf.Str(func(c *Config) *string { return &c.Balancer.TLS.KeyFile })},
	{Name: "balancer-insecure", Usage: "send usage reports in plaintext without a client certificate (only to a balancer with insecure_reports)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Balancer.Insecure })},
	{Name: "grpc-addr", Usage: "gRPC listen address (Envoy RLS and allot.v1)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.GRPC })},
	{Name: "http-addr", Usage: "HTTP listen address (/v1/check, /v1/auth, /metrics, /healthz, /readyz)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.HTTP })},
	{Name: "grpc-tls", Usage: "serve gRPC over TLS (needs -grpc-tls-cert and -grpc-tls-key)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Listen.GRPCTLS.Enabled })},
	{Name: "grpc-tls-cert", Usage: "the gRPC listener's certificate (PEM)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.GRPCTLS.CertFile })},
	{Name: "grpc-tls-key", Usage: "the key of -grpc-tls-cert", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.GRPCTLS.KeyFile })},
	{Name: "grpc-tls-client-ca", Usage: "require gRPC clients to present a certificate from this CA (mutual TLS)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.GRPCTLS.ClientCAFile })},
	{Name: "grpc-client-san", Usage: "a DNS name or IP address the gRPC client's certificate must carry (with -grpc-tls-client-ca)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.GRPCClientSAN })},
	{Name: "debug-addr", Usage: "debug listen address: /debug/pprof/ and /metrics only (default none)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.Debug })},
	{Name: "advertise-addr", Usage: "address registered in etcd (default the gRPC address)", Apply: cliconf.Str(func(c *Config) *string { return &c.Listen.Advertise })},
	{Name: "peers", Usage: "live enforcers in the region when etcd is not configured", Apply: cliconf.Int(func(c *Config) *int { return &c.Peers })},
	{Name: "drain-timeout", Usage: "graceful shutdown bound", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.DrainTimeout })},
	{Name: "pre-stop-delay", Usage: "how long to go on answering checks after SIGTERM, with /readyz failing, before the drain (0: none)", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Shutdown.PreStopDelay })},
	{Name: "grpc-max-connection-age", Usage: "how long a gRPC connection lives before the client is asked to reconnect (GOAWAY), so load spreads onto new enforcers", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Listen.MaxConnectionAge })},
	{Name: "lease-disabled", Usage: "take every check from Redis (no leases for busy keys)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Lease.Disabled })},
	{Name: "lease-ttl", Usage: "lease time to live", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Lease.TTL })},
	{Name: "lease-quiet-ttl", Usage: "how long a quiet key's lease lives (its demand over this period)", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Lease.QuietTTL })},
	{Name: "lease-window", Usage: "slice of the limit one lease batch covers", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Lease.Window })},
	{Name: "fallback-timeout", Usage: "how long a check waits for Redis before it is answered locally (the call goes on)", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Fallback.Timeout })},
	{Name: "fallback-reply-timeout", Usage: "deadline of each Redis call; a reply missing this long opens the shard's breaker", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Fallback.ReplyTimeout })},
	{Name: "fallback-trip-after", Usage: "consecutive errors from a shard that open its breaker", Apply: cliconf.Int(func(c *Config) *int { return &c.Fallback.TripAfter })},
	{Name: "fallback-first-open-for", Usage: "how long a breaker opened from closed waits before its first probe (doubling up to fallback-open-for)", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Fallback.FirstOpenFor })},
	{Name: "fallback-open-for", Usage: "the longest an open breaker waits before a probe", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Fallback.OpenFor })},
	{Name: "fallback-all-silent-for", Usage: "how long every shard must be silent before a missing reply opens a breaker with no other shard answering", Apply: cliconf.Dur(func(c *Config) *time.Duration { return &c.Fallback.AllSilentFor })},
	{Name: "fallback-slack", Usage: "local limit slack while Redis is unavailable", Apply: cliconf.Float(func(c *Config) *float64 { return &c.Fallback.Slack })},
	{Name: "rls-domain", Usage: "the only Envoy RLS domain accepted (default any)", Apply: cliconf.Str(func(c *Config) *string { return &c.RLS.Domain })},
	{Name: "rls-shadow-mode", Usage: "answer every Envoy RLS request OK, counting the would-be refusals (envoyproxy/ratelimit's SHADOW_MODE)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.RLS.ShadowMode })},
	{Name: "rls-quota-mode", Usage: "every Envoy RLS descriptor a quota one (envoyproxy/ratelimit's QUOTA_MODE)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.RLS.QuotaMode })},
	{Name: "rls-headers", Usage: "header fields of an Envoy RLS answer: ietf | envoy-ratelimit | none", Apply: cliconf.Str(func(c *Config) *string { return &c.RLS.Headers.Style })},
	{Name: "log-level", Usage: "trace | debug | info | warn | error", Apply: cliconf.Str(func(c *Config) *string { return &c.LogLevel })},
	{Name: "explain", Usage: "serve GET /v1/explain (\"why was I limited?\") on the HTTP address (needs admin tokens)", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Explain.Enabled })},
	{Name: "explain-tokens-file", Usage: "explain's tokens (the balancer's admin tokens), name:secret a line", Apply: cliconf.Str(func(c *Config) *string { return &c.Explain.TokensFile })},
	{Name: "identity-digest-key", Usage: "secret keying the identity digest in sampled refusal logs (the same on every enforcer; prefer the environment variable)", Apply: cliconf.Str(func(c *Config) *string { return &c.Check.IdentityDigestKey })},
	{Name: "log-identities", Usage: "log the identity itself (API key, IP) in sampled refusal logs", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Check.LogIdentities })},
	{Name: "pprof", Usage: "serve /debug/pprof/ on the HTTP address", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.Pprof })},
	{Name: "gc-heap-floor-mib", Usage: "the heap (MiB) the Go GC lets the process reach before collecting, however small the live heap; 0: none; a GOGC variable turns it off", Apply: cliconf.Int(func(c *Config) *int { return &c.GCHeapFloorMiB })},
	{Name: "gc-percent", Usage: "the Go GC's target percentage (GOGC) the process runs at; a GOGC variable wins", Apply: cliconf.Int(func(c *Config) *int { return &c.GCPercent })},
	{Name: "log-json", Usage: "log JSON lines", IsBool: true, Apply: cliconf.Bool(func(c *Config) *bool { return &c.LogJSON })},
})

// command is the enforcer's command line: the overrides above over the config file.
var command = cliconf.Command[Config]{
	Name: "enforcer",
	Synopsis: []string{"enforcer rules check [--format allot|envoy-ratelimit] PATH", "enforcer rules import [--merge-domains] DIR",
		"enforcer probe [flags]   (GET /readyz on the HTTP address these flags give; exit 0 when ready)"},
	ConfigExample: "configs/regions/us-east.yaml",
	Prefix:        "app: ", Overrides: settingOverrides, Default: DefaultConfig, Validate: (*Config).Validate,
}

func init() { command.Foreign = readEnvoyEnv } // readEnvoyEnv reads command's variables: no initialisation cycle

// ErrHelp is returned by Parse when -h or -help was given (usage has been printed).
var ErrHelp = flag.ErrHelp

// IsHelp reports whether err is the -h/-help request.
func IsHelp(err error) bool { return errors.Is(err, flag.ErrHelp) }

// Parse builds one enforcer's configuration from, in increasing precedence: defaults,
// the region's config file (-config or ALLOT_CONFIG), ALLOT_* environment variables,
// and flags; then validates it. Tracing comes from the OTEL_* variables alone
// (appkit.TracingFromEnv). getenv is os.Getenv in main; usage and flag errors go to out.
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

// ParseUnchecked is Parse without Validate, for `enforcer probe`, which needs only the
// HTTP address: a container's health check runs with the container's environment but
// not the server's command line, so the rest of a configuration given by flags (the
// region, say) may be missing, and the address is then the default or ALLOT_HTTP_ADDR.
func ParseUnchecked(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	c := command
	c.Validate = nil
	return c.Parse(args, getenv, out)
}
