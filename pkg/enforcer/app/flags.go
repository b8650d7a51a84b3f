package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// override is one setting that a flag and an environment variable can change.
type override struct {
	name, usage string
	isBool      bool
	apply       func(c *Config, v string) error
}

// EnvName is the environment variable for flag name: ALLOT_ + upper case, '-' → '_'.
func EnvName(flagName string) string {
	return "ALLOT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func str(dst func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *dst(c) = v; return nil }
}

func list(dst func(*Config) *[]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		var out []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		*dst(c) = out
		return nil
	}
}

func dur(dst func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		*dst(c) = d
		return nil
	}
}

func integer(dst func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return err
		}
		*dst(c) = n
		return nil
	}
}

func boolean(dst func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		*dst(c) = b
		return nil
	}
}

func float(dst func(*Config) *float64) func(*Config, string) error {
	return func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return err
		}
		*dst(c) = f
		return nil
	}
}

var overrides = []override{
	{name: "region", usage: "region name", apply: str(func(c *Config) *string { return &c.Region })},
	{name: "id", usage: "this enforcer's id within its region (default host-pid)", apply: str(func(c *Config) *string { return &c.ID })},
	{name: "store", usage: "store kind: memory | redis | redis-cluster", apply: str(func(c *Config) *string { return &c.Store.Kind })},
	{name: "redis-addrs", usage: "comma-separated Redis address(es)", apply: list(func(c *Config) *[]string { return &c.Store.Addrs })},
	{name: "redis-username", usage: "Redis ACL user", apply: str(func(c *Config) *string { return &c.Store.Username })},
	{name: "redis-password", usage: "Redis password (prefer the environment variable)", apply: str(func(c *Config) *string { return &c.Store.Password })},
	{name: "redis-tls", usage: "use TLS to Redis", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Store.TLS.Enabled })},
	{name: "redis-tls-ca", usage: "CA file for Redis TLS", apply: str(func(c *Config) *string { return &c.Store.TLS.CAFile })},
	{name: "redis-tls-cert", usage: "client certificate for Redis TLS", apply: str(func(c *Config) *string { return &c.Store.TLS.CertFile })},
	{name: "redis-tls-key", usage: "client key for Redis TLS", apply: str(func(c *Config) *string { return &c.Store.TLS.KeyFile })},
	{name: "redis-tls-server-name", usage: "server name to verify for Redis TLS", apply: str(func(c *Config) *string { return &c.Store.TLS.ServerName })},
	{name: "redis-tls-insecure", usage: "skip Redis certificate verification (tests only)", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Store.TLS.InsecureSkipVerify })},
	{name: "redis-key-prefix", usage: "prefix of every Redis key", apply: str(func(c *Config) *string { return &c.Store.KeyPrefix })},
	{name: "redis-dial-timeout", usage: "Redis dial timeout", apply: dur(func(c *Config) *time.Duration { return &c.Store.DialTimeout })},
	{name: "redis-read-timeout", usage: "Redis read timeout", apply: dur(func(c *Config) *time.Duration { return &c.Store.ReadTimeout })},
	{name: "redis-write-timeout", usage: "Redis write timeout", apply: dur(func(c *Config) *time.Duration { return &c.Store.WriteTimeout })},
	{name: "redis-pipeline", usage: "coalesce concurrent Redis takes on one shard into one pipeline", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Store.Pipeline })},
	{name: "redis-pool-size", usage: "Redis connections per node", apply: integer(func(c *Config) *int { return &c.Store.PoolSize })},
	{name: "etcd-endpoints", usage: "comma-separated etcd client URLs", apply: list(func(c *Config) *[]string { return &c.Etcd.Endpoints })},
	{name: "etcd-username", usage: "etcd user", apply: str(func(c *Config) *string { return &c.Etcd.Username })},
	{name: "etcd-password", usage: "etcd password (prefer the environment variable)", apply: str(func(c *Config) *string { return &c.Etcd.Password })},
	{name: "etcd-tls", usage: "use TLS to etcd", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Etcd.TLS.Enabled })},
	{name: "etcd-tls-ca", usage: "CA file for etcd TLS", apply: str(func(c *Config) *string { return &c.Etcd.TLS.CAFile })},
	{name: "etcd-tls-cert", usage: "client certificate for etcd TLS", apply: str(func(c *Config) *string { return &c.Etcd.TLS.CertFile })},
	{name: "etcd-tls-key", usage: "client key for etcd TLS", apply: str(func(c *Config) *string { return &c.Etcd.TLS.KeyFile })},
	{name: "etcd-tls-server-name", usage: "server name to verify for etcd TLS", apply: str(func(c *Config) *string { return &c.Etcd.TLS.ServerName })},
	{name: "etcd-registration-ttl", usage: "etcd registration lease TTL (whole seconds)", apply: dur(func(c *Config) *time.Duration { return &c.Etcd.RegistrationTTL })},
	{name: "rules-file", usage: "YAML rules file", apply: str(func(c *Config) *string { return &c.Rules.File })},
	{name: "rules-etcd-prefix", usage: "etcd prefix holding one rule per key", apply: str(func(c *Config) *string { return &c.Rules.EtcdPrefix })},
	{name: "rules-poll-interval", usage: "how often the rules file is checked for changes", apply: dur(func(c *Config) *time.Duration { return &c.Rules.PollInterval })},
	{name: "default-share", usage: "removed (an error if set): the default split now comes from -regions", apply: func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		c.Rules.DefaultShare = &f
		return err
	}},
	{name: "regions", usage: "every region enforcing the global limits, for the default split: us-east,eu-west or us-east=2,eu-west=1 (weights)", apply: func(c *Config, v string) error {
		r, err := parseRegions(v)
		c.Regions = r
		return err
	}},
	{name: "shares-etcd-prefix", usage: "etcd prefix the balancer publishes shares under", apply: str(func(c *Config) *string { return &c.Shares.EtcdPrefix })},
	{name: "shares-stale-after", usage: "shares not refreshed this long fall back to min(last, default)", apply: dur(func(c *Config) *time.Duration { return &c.Shares.StaleAfter })},
	{name: "shares-disabled", usage: "do not watch the balancer's shares (default split only)", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Shares.Disabled })},
	{name: "balancer", usage: "send usage reports to the quota balancer's leader (found through etcd)", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Balancer.Enabled })},
	{name: "balancer-election-prefix", usage: "etcd prefix of the balancer's leader election", apply: str(func(c *Config) *string { return &c.Balancer.ElectionPrefix })},
	{name: "balancer-addrs", usage: "comma-separated balancer report addresses as this region reaches them (instead of the leader's address in etcd)", apply: list(func(c *Config) *[]string { return &c.Balancer.Addrs })},
	{name: "balancer-interval", usage: "interval between usage reports", apply: dur(func(c *Config) *time.Duration { return &c.Balancer.Interval })},
	{name: "balancer-tls", usage: "use TLS to the balancer's report API", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Balancer.TLS.Enabled })},
	{name: "balancer-tls-ca", usage: "CA file for the balancer's report API", apply: str(func(c *Config) *string { return &c.Balancer.TLS.CAFile })},
	{name: "grpc-addr", usage: "gRPC listen address (Envoy RLS and allot.v1)", apply: str(func(c *Config) *string { return &c.Listen.GRPC })},
	{name: "http-addr", usage: "HTTP listen address (/v1/check, /v1/auth, /metrics, /healthz, /readyz)", apply: str(func(c *Config) *string { return &c.Listen.HTTP })},
	{name: "advertise-addr", usage: "address registered in etcd (default the gRPC address)", apply: str(func(c *Config) *string { return &c.Listen.Advertise })},
	{name: "peers", usage: "live enforcers in the region when etcd is not configured", apply: integer(func(c *Config) *int { return &c.Peers })},
	{name: "drain-timeout", usage: "graceful shutdown bound", apply: dur(func(c *Config) *time.Duration { return &c.DrainTimeout })},
	{name: "lease-disabled", usage: "take every check from Redis (no leases for busy keys)", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Lease.Disabled })},
	{name: "lease-ttl", usage: "lease time to live", apply: dur(func(c *Config) *time.Duration { return &c.Lease.TTL })},
	{name: "lease-quiet-ttl", usage: "how long a quiet key's lease lives (its demand over this period)", apply: dur(func(c *Config) *time.Duration { return &c.Lease.QuietTTL })},
	{name: "lease-window", usage: "slice of the limit one lease batch covers", apply: dur(func(c *Config) *time.Duration { return &c.Lease.Window })},
	{name: "fallback-timeout", usage: "how long a check waits for Redis before it is answered locally (the call goes on)", apply: dur(func(c *Config) *time.Duration { return &c.Fallback.Timeout })},
	{name: "fallback-reply-timeout", usage: "deadline of each Redis call; a reply missing this long opens the shard's breaker", apply: dur(func(c *Config) *time.Duration { return &c.Fallback.ReplyTimeout })},
	{name: "fallback-trip-after", usage: "consecutive errors from a shard that open its breaker", apply: integer(func(c *Config) *int { return &c.Fallback.TripAfter })},
	{name: "fallback-first-open-for", usage: "how long a breaker opened from closed waits before its first probe (doubling up to fallback-open-for)", apply: dur(func(c *Config) *time.Duration { return &c.Fallback.FirstOpenFor })},
	{name: "fallback-open-for", usage: "the longest an open breaker waits before a probe", apply: dur(func(c *Config) *time.Duration { return &c.Fallback.OpenFor })},
	{name: "fallback-all-silent-for", usage: "how long every shard must be silent before a missing reply opens a breaker with no other shard answering", apply: dur(func(c *Config) *time.Duration { return &c.Fallback.AllSilentFor })},
	{name: "fallback-slack", usage: "local limit slack while Redis is unavailable", apply: float(func(c *Config) *float64 { return &c.Fallback.Slack })},
	{name: "rls-domain", usage: "the only Envoy RLS domain accepted (default any)", apply: str(func(c *Config) *string { return &c.RLS.Domain })},
	{name: "log-level", usage: "trace | debug | info | warn | error", apply: str(func(c *Config) *string { return &c.LogLevel })},
	{name: "pprof", usage: "serve /debug/pprof/ on the HTTP address", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Pprof })},
	{name: "log-json", usage: "log JSON lines", isBool: true, apply: boolean(func(c *Config) *bool { return &c.LogJSON })},
}

// ErrHelp is returned by Parse when -h or -help was given (usage has been printed).
var ErrHelp = flag.ErrHelp

// Parse builds the configuration from, in increasing precedence: defaults, the config
// file (-config or ALLOT_CONFIG), ALLOT_* environment variables, and flags. getenv is
// os.Getenv in main. Usage and errors go to out. It validates the result.
func Parse(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	fs := flag.NewFlagSet("enforcer", flag.ContinueOnError)
	fs.SetOutput(out)
	configPath := fs.String("config", "", "YAML config file, e.g. configs/regions/us-east.yaml (env ALLOT_CONFIG)")
	type given struct {
		o *override
		v string
	}
	var flags []given
	for i := range overrides {
		o := &overrides[i]
		usage := o.usage + " (env " + EnvName(o.name) + ")"
		rec := func(v string) error { flags = append(flags, given{o, v}); return o.apply(&Config{}, v) }
		if o.isBool {
			fs.BoolFunc(o.name, usage, func(v string) error { return rec(v) })
		} else {
			fs.Func(o.name, usage, rec)
		}
	}
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: enforcer [flags]\n       enforcer rules check FILE\n\nflags override the config file; ALLOT_* variables override it too, flags win:\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("app: unexpected arguments %q", fs.Args())
	}
	path := *configPath
	if path == "" {
		path = getenv("ALLOT_CONFIG")
	}
	cfg := DefaultConfig()
	if path != "" {
		var err error
		if cfg, err = LoadFile(path); err != nil {
			return Config{}, err
		}
	}
	set := map[string]bool{}
	for _, g := range flags {
		set[g.o.name] = true
	}
	for i := range overrides {
		o := &overrides[i]
		if set[o.name] {
			continue
		}
		if v := getenv(EnvName(o.name)); v != "" {
			if err := o.apply(&cfg, v); err != nil {
				return Config{}, fmt.Errorf("app: %s=%q: %w", EnvName(o.name), v, err)
			}
		}
	}
	for _, g := range flags {
		if err := g.o.apply(&cfg, g.v); err != nil { // checked at parse; cannot fail here
			return Config{}, fmt.Errorf("app: -%s %q: %w", g.o.name, g.v, err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// IsHelp reports whether err is the -h/-help request.
func IsHelp(err error) bool { return errors.Is(err, flag.ErrHelp) }
