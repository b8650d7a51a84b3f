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

// weights parses "us-east=2,eu-west=1".
func weights(c *Config, v string) error {
	m := map[string]float64{}
	for _, kv := range strings.Split(v, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, w, ok := strings.Cut(kv, "=")
		f, err := strconv.ParseFloat(w, 64)
		if !ok || err != nil {
			return fmt.Errorf("%q: want region=weight", kv)
		}
		m[strings.TrimSpace(k)] = f
	}
	c.Weights = m
	return nil
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
	{name: "regions", usage: "comma-separated regions, in a fixed order", apply: list(func(c *Config) *[]string { return &c.Regions })},
	{name: "weights", usage: "default split weights, region=weight,... (default equal)", apply: weights},
	{name: "id", usage: "this replica's name in logs (default host-pid)", apply: str(func(c *Config) *string { return &c.ID })},
	{name: "grpc-addr", usage: "report API (gRPC) listen address", apply: str(func(c *Config) *string { return &c.Listen.GRPC })},
	{name: "http-addr", usage: "HTTP listen address (/metrics, /healthz, /readyz)", apply: str(func(c *Config) *string { return &c.Listen.HTTP })},
	{name: "advertise-addr", usage: "report address standbys redirect enforcers to (default the gRPC address)", apply: str(func(c *Config) *string { return &c.Listen.Advertise })},
	{name: "tls", usage: "serve the report API over TLS", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Listen.TLS.Enabled })},
	{name: "tls-cert", usage: "report API certificate", apply: str(func(c *Config) *string { return &c.Listen.TLS.CertFile })},
	{name: "tls-key", usage: "report API key", apply: str(func(c *Config) *string { return &c.Listen.TLS.KeyFile })},
	{name: "tls-client-ca", usage: "CA enforcers' client certificates must chain to (mutual TLS)", apply: str(func(c *Config) *string { return &c.Listen.TLS.ClientCAFile })},
	{name: "etcd-endpoints", usage: "comma-separated etcd client URLs", apply: list(func(c *Config) *[]string { return &c.Etcd.Endpoints })},
	{name: "etcd-username", usage: "etcd user", apply: str(func(c *Config) *string { return &c.Etcd.Username })},
	{name: "etcd-password", usage: "etcd password (prefer the environment variable)", apply: str(func(c *Config) *string { return &c.Etcd.Password })},
	{name: "etcd-tls", usage: "use TLS to etcd", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Etcd.TLS.Enabled })},
	{name: "etcd-tls-ca", usage: "CA file for etcd TLS", apply: str(func(c *Config) *string { return &c.Etcd.TLS.CAFile })},
	{name: "etcd-tls-cert", usage: "client certificate for etcd TLS", apply: str(func(c *Config) *string { return &c.Etcd.TLS.CertFile })},
	{name: "etcd-tls-key", usage: "client key for etcd TLS", apply: str(func(c *Config) *string { return &c.Etcd.TLS.KeyFile })},
	{name: "etcd-tls-server-name", usage: "server name to verify for etcd TLS", apply: str(func(c *Config) *string { return &c.Etcd.TLS.ServerName })},
	{name: "election-prefix", usage: "etcd prefix replicas campaign under", apply: str(func(c *Config) *string { return &c.Etcd.ElectionPrefix })},
	{name: "shares-prefix", usage: "etcd prefix share sets are published under", apply: str(func(c *Config) *string { return &c.Etcd.SharesPrefix })},
	{name: "session-ttl", usage: "election lease TTL (whole seconds)", apply: dur(func(c *Config) *time.Duration { return &c.Etcd.SessionTTL })},
	{name: "rules-file", usage: "YAML rules file (the enforcers' rules)", apply: str(func(c *Config) *string { return &c.Rules.File })},
	{name: "rules-etcd-prefix", usage: "etcd prefix holding one rule per key", apply: str(func(c *Config) *string { return &c.Rules.EtcdPrefix })},
	{name: "admin", usage: "serve the admin API on the HTTP address (needs admin tokens)", isBool: true, apply: boolean(func(c *Config) *bool { return &c.Admin.Enabled })},
	{name: "admin-tokens-file", usage: "admin API tokens, name:secret a line", apply: str(func(c *Config) *string { return &c.Admin.TokensFile })},
	{name: "interval", usage: "balancing interval", apply: dur(func(c *Config) *time.Duration { return &c.Balance.Interval })},
	{name: "learning", usage: "a new leader's learning period", apply: dur(func(c *Config) *time.Duration { return &c.Balance.Learning })},
	{name: "ack-timeout", usage: "how long an increase waits for unacknowledged decreases (>= propagation)", apply: dur(func(c *Config) *time.Duration { return &c.Balance.AckTimeout })},
	{name: "min-version-gap", usage: "least time between two share set versions", apply: dur(func(c *Config) *time.Duration { return &c.Balance.MinVersionGap })},
	{name: "stale", usage: "staleness period (as the enforcers')", apply: dur(func(c *Config) *time.Duration { return &c.Balance.Stale })},
	{name: "key-ttl", usage: "an unreported identity returns to the default split after this", apply: dur(func(c *Config) *time.Duration { return &c.Balance.KeyTTL })},
	{name: "max-identities", usage: "identities tracked at most", apply: integer(func(c *Config) *int { return &c.Balance.MaxIdentities })},
	{name: "max-published", usage: "identities listed in a share set at most", apply: integer(func(c *Config) *int { return &c.Balance.MaxPublished })},
	{name: "share-floor", usage: "share each region keeps in reserve", apply: float(func(c *Config) *float64 { return &c.Share.Floor })},
	{name: "drain-timeout", usage: "graceful shutdown bound", apply: dur(func(c *Config) *time.Duration { return &c.DrainTimeout })},
	{name: "log-level", usage: "trace | debug | info | warn | error", apply: str(func(c *Config) *string { return &c.LogLevel })},
	{name: "log-json", usage: "log JSON lines", isBool: true, apply: boolean(func(c *Config) *bool { return &c.LogJSON })},
}

// ErrHelp is returned by Parse when -h or -help was given (usage has been printed).
var ErrHelp = flag.ErrHelp

// IsHelp reports whether err is the -h/-help request.
func IsHelp(err error) bool { return errors.Is(err, flag.ErrHelp) }

// Parse builds the configuration from, in increasing precedence: defaults, the config
// file (-config or ALLOT_CONFIG), ALLOT_* environment variables, and flags. getenv is
// os.Getenv in main. Usage and errors go to out. It validates the result.
func Parse(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	fs := flag.NewFlagSet("balancer", flag.ContinueOnError)
	fs.SetOutput(out)
	configPath := fs.String("config", "", "YAML config file, e.g. configs/balancer.yaml (env ALLOT_CONFIG)")
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
			fs.BoolFunc(o.name, usage, rec)
		} else {
			fs.Func(o.name, usage, rec)
		}
	}
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: balancer [flags]\n\nflags override the config file; ALLOT_* variables override it too, flags win:\n\n")
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
		if err := g.o.apply(&cfg, g.v); err != nil {
			return Config{}, fmt.Errorf("app: -%s %q: %w", g.o.name, g.v, err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}
