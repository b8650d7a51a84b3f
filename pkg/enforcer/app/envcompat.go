package app

// envoyproxy/ratelimit's environment variables (docs/envoy-ratelimit.md, "Their settings").

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The values of Config.Compat (ALLOT_COMPAT).
const (
	// CompatAuto (the default, "") honours envoyproxy/ratelimit's variables when the
	// process has no allot configuration at all — no config file and no ALLOT_* variable
	// — and one of their variables is set: their deployment, with allot's image.
	CompatAuto = ""
	// CompatEnvoy honours their variables in any case, over the config file and under
	// the ALLOT_* variables and flags.
	CompatEnvoy = "envoy-ratelimit"
	// CompatNone never reads them (they are still named at start, as not read).
	CompatNone = "none"
)

// CompatReport says what the compatibility layer did with envoyproxy/ratelimit's
// variables, for the start log and -check-config: nothing of theirs that is set goes
// unmentioned.
type CompatReport struct {
	// On: their variables were read; Why says what decided it.
	On  bool
	Why string
	// Applied are "NAME=value: what it set" for each variable honoured.
	Applied []string
	// Unsupported are "NAME: why" for each variable of theirs set that allot does not
	// honour (the value is not shown: it may be a secret).
	Unsupported []string
	// Ignored names their variables that are set while the layer is off.
	Ignored []string
}

// envoyVar is one of envoyproxy/ratelimit's settings.
type envoyVar struct {
	name string
	// apply, if set, honours the variable (v is never ""). nil: unsupported.
	apply func(c *Config, v string, e *envoyEnv) error
	// inert, if set, says a value is what allot does anyway (USE_STATSD=false): it is then
	// applied with nothing to do, not reported as unsupported.
	inert func(v string) bool
	// why says, for an unsupported variable, what allot does instead.
	why string
	// generic: too common a name to switch the layer on by itself (PORT, LOG_LEVEL).
	generic bool
}

// envoyEnv is one run of the layer: getenv and what was decided so far.
type envoyEnv struct {
	getenv    func(string) string
	rulesFree bool // neither the file nor an ALLOT_RULES_* variable configures the rules
}

func isFalse(v string) bool { b, err := strconv.ParseBool(v); return err == nil && !b }
func isTrue(v string) bool  { b, err := strconv.ParseBool(v); return err == nil && b }
func is(vals ...string) func(string) bool {
	return func(v string) bool {
		return slices.ContainsFunc(vals, func(x string) bool { return strings.EqualFold(x, v) })
	}
}

// parseBool reads their booleans as strconv.ParseBool does (their envconfig does the same).
func parseBool(dst func(*Config) *bool) func(*Config, string, *envoyEnv) error {
	return func(c *Config, v string, _ *envoyEnv) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		*dst(c) = b
		return nil
	}
}

func parseDur(dst func(*Config) *time.Duration) func(*Config, string, *envoyEnv) error {
	return func(c *Config, v string, _ *envoyEnv) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		if d <= 0 {
			return fmt.Errorf("%v, must be > 0", d)
		}
		*dst(c) = d
		return nil
	}
}

func setStr(dst func(*Config) *string) func(*Config, string, *envoyEnv) error {
	return func(c *Config, v string, _ *envoyEnv) error { *dst(c) = v; return nil }
}

// rulesOnly wraps a rules setting: applied only when allot's own configuration names no
// rules (the file, ALLOT_RULES_*), else reported as overridden.
func rulesOnly(f func(*Config, string, *envoyEnv) error) func(*Config, string, *envoyEnv) error {
	return func(c *Config, v string, e *envoyEnv) error {
		switch {
		case !e.rulesFree:
			return errOverridden
		case f == nil:
			return nil // applyEnvoyRules reads it
		}
		return f(c, v, e)
	}
}

// withHeaders sets one of their header names, used only with
// LIMIT_RESPONSE_HEADERS_ENABLED=true (as by them).
func withHeaders(dst func(*Config) *string) func(*Config, string, *envoyEnv) error {
	return func(c *Config, v string, e *envoyEnv) error {
		if !isTrue(e.getenv("LIMIT_RESPONSE_HEADERS_ENABLED")) {
			return unusedErr("not used: LIMIT_RESPONSE_HEADERS_ENABLED is not true, as by envoyproxy/ratelimit")
		}
		*dst(c) = v
		return nil
	}
}

// fileOnly is the runtime directory's variables: not used under CONFIG_TYPE=GRPC_XDS_SOTW,
// there as here (Envoy Gateway sets them anyway).
func fileOnly(_ *Config, _ string, e *envoyEnv) error {
	if strings.EqualFold(e.getenv("CONFIG_TYPE"), "GRPC_XDS_SOTW") {
		return errUnused
	}
	return nil
}

var errUnused = unusedErr("not used with CONFIG_TYPE=GRPC_XDS_SOTW, as by envoyproxy/ratelimit")

// unusedErr is a variable that is read but, with the others as they are, means nothing,
// there as here: named in the report as such.
type unusedErr string

func (e unusedErr) Error() string { return string(e) }

// withServerTLS sets a gRPC server TLS file only when GRPC_SERVER_USE_TLS is true (their
// server reads the files only then).
func withServerTLS(dst func(*Config) *string) func(*Config, string, *envoyEnv) error {
	return func(c *Config, v string, e *envoyEnv) error {
		if !isTrue(e.getenv("GRPC_SERVER_USE_TLS")) {
			return unusedErr("not used: GRPC_SERVER_USE_TLS is not true, as by envoyproxy/ratelimit")
		}
		*dst(c) = v
		return nil
	}
}

var errOverridden = errors.New("not applied: allot's own rules configuration (file or ALLOT_RULES_*) wins")

// parseMap reads their map variables, "k1:v1,k2:v2" (k=v is taken too).
func parseMap(v string) (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		i := strings.IndexAny(kv, ":=")
		if i <= 0 {
			return nil, fmt.Errorf("%q is not key:value", kv)
		}
		m[strings.TrimSpace(kv[:i])] = strings.TrimSpace(kv[i+1:])
	}
	return m, nil
}

// port checks a port number.
func port(v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q is not a port number", v)
	}
	return nil
}

// hostPort joins their HOST and PORT pairs, each with their default.
func hostPort(e *envoyEnv, hostVar, defHost, portVar, defPort string) (string, error) {
	h, p := e.getenv(hostVar), e.getenv(portVar)
	if h == "" {
		h = defHost
	}
	if p == "" {
		p = defPort
	}
	if err := port(p); err != nil {
		return "", fmt.Errorf("%s: %w", portVar, err)
	}
	return net.JoinHostPort(h, p), nil
}

// logLevels maps their LOG_LEVEL (logrus's names) to allot's.
var logLevels = map[string]string{"trace": "trace", "debug": "debug", "info": "info", "warn": "warn", "warning": "warn",
	"error": "error", "fatal": "error", "panic": "error"}

// envoyVars is every variable of envoyproxy/ratelimit's settings, in their order.
var envoyVars = []envoyVar{
	{name: "HOST", generic: true, apply: func(c *Config, v string, e *envoyEnv) (err error) {
		c.Listen.HTTP, err = hostPort(e, "HOST", "0.0.0.0", "PORT", "8080")
		return err
	}},
	{name: "PORT", generic: true, apply: func(c *Config, v string, e *envoyEnv) (err error) {
		c.Listen.HTTP, err = hostPort(e, "HOST", "0.0.0.0", "PORT", "8080")
		return err
	}},
	{name: "DEBUG_HOST", generic: true, apply: func(c *Config, v string, e *envoyEnv) (err error) {
		c.Listen.Debug, err = hostPort(e, "DEBUG_HOST", "0.0.0.0", "DEBUG_PORT", "6070")
		return err
	}},
	{name: "DEBUG_PORT", generic: true, apply: func(c *Config, v string, e *envoyEnv) (err error) {
		c.Listen.Debug, err = hostPort(e, "DEBUG_HOST", "0.0.0.0", "DEBUG_PORT", "6070")
		return err
	}},
	{name: "GRPC_UDS", why: "allot serves gRPC on TCP only (GRPC_HOST:GRPC_PORT)"},
	{name: "GRPC_HOST", generic: true, apply: func(c *Config, v string, e *envoyEnv) (err error) {
		c.Listen.GRPC, err = hostPort(e, "GRPC_HOST", "0.0.0.0", "GRPC_PORT", "8081")
		return err
	}},
	{name: "GRPC_PORT", apply: func(c *Config, v string, e *envoyEnv) (err error) {
		c.Listen.GRPC, err = hostPort(e, "GRPC_HOST", "0.0.0.0", "GRPC_PORT", "8081")
		return err
	}},
	{name: "GRPC_MAX_CONNECTION_AGE", apply: parseDur(func(c *Config) *time.Duration { return &c.Listen.MaxConnectionAge })},
	{name: "GRPC_MAX_CONNECTION_AGE_GRACE", apply: parseDur(func(c *Config) *time.Duration { return &c.Listen.MaxConnectionAgeGrace })},
	{name: "GRPC_SERVER_USE_TLS", apply: parseBool(func(c *Config) *bool { return &c.Listen.GRPCTLS.Enabled })},
	{name: "GRPC_SERVER_TLS_CERT", apply: withServerTLS(func(c *Config) *string { return &c.Listen.GRPCTLS.CertFile })},
	{name: "GRPC_SERVER_TLS_KEY", apply: withServerTLS(func(c *Config) *string { return &c.Listen.GRPCTLS.KeyFile })},
	{name: "GRPC_CLIENT_TLS_CACERT", apply: withServerTLS(func(c *Config) *string { return &c.Listen.GRPCTLS.ClientCAFile })},
	{name: "GRPC_CLIENT_TLS_SAN", apply: withServerTLS(func(c *Config) *string { return &c.Listen.GRPCClientSAN })},
	{name: "LOG_LEVEL", generic: true, apply: func(c *Config, v string, _ *envoyEnv) error {
		l, ok := logLevels[strings.ToLower(v)]
		if !ok {
			return fmt.Errorf("want trace, debug, info, warn, error, fatal or panic")
		}
		c.LogLevel = l
		return nil
	}},
	{name: "LOG_FORMAT", generic: true, apply: func(c *Config, v string, _ *envoyEnv) error {
		switch strings.ToLower(v) {
		case "json":
			c.LogJSON = true
		case "text":
			c.LogJSON = false
		default:
			return fmt.Errorf("want text or json")
		}
		return nil
	}},
	{name: "CONFIG_TYPE", apply: rulesOnly(func(c *Config, v string, e *envoyEnv) error {
		switch strings.ToUpper(v) {
		case "FILE", "GRPC_XDS_SOTW":
			return nil // applyEnvoyRules reads it
		}
		return fmt.Errorf("want FILE or GRPC_XDS_SOTW")
	})},
	{name: "FORCE_START_WITHOUT_INITIAL_CONFIG", inert: func(string) bool { return true }},
	{name: "CONFIG_GRPC_XDS_NODE_ID", apply: rulesOnly(nil)},
	{name: "CONFIG_GRPC_XDS_NODE_METADATA", apply: rulesOnly(nil)},
	{name: "CONFIG_GRPC_XDS_SERVER_URL", apply: rulesOnly(nil)},
	{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", why: "allot's xDS client paces reconnects with XDS_CLIENT_BACKOFF_INITIAL_INTERVAL and _MAX_INTERVAL"},
	{name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", apply: rulesOnly(nil)},
	{name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", apply: rulesOnly(nil)},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", apply: rulesOnly(nil)},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", apply: rulesOnly(nil)},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", apply: rulesOnly(nil)},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", apply: rulesOnly(nil)},
	{name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", apply: rulesOnly(nil)},
	{name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", apply: rulesOnly(nil)},
	{name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", why: "allot's backoff jitter is on or off (XDS_CLIENT_BACKOFF_JITTER), not a factor"},
	{name: "XDS_CLIENT_BACKOFF_JITTER", apply: rulesOnly(nil)},
	{name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", apply: rulesOnly(nil)},
	{name: "USE_DOG_STATSD", inert: isFalse, why: "allot exports Prometheus metrics on /metrics, no statsd"},
	{name: "USE_DOG_STATSD_MOGRIFIERS", why: "allot exports Prometheus metrics on /metrics, no statsd"},
	{name: "USE_STATSD", inert: isFalse, why: "allot exports Prometheus metrics on /metrics (PORT), no statsd"},
	{name: "STATSD_HOST", why: "allot exports Prometheus metrics on /metrics, no statsd"},
	{name: "STATSD_PORT", why: "allot exports Prometheus metrics on /metrics, no statsd"},
	{name: "EXTRA_TAGS", why: "allot's metrics have fixed, bounded labels"},
	{name: "STATS_FLUSH_INTERVAL", why: "allot's metrics are scraped (Prometheus), not flushed"},
	{name: "DISABLE_STATS", inert: isFalse, why: "allot's metrics cannot be turned off (they cost nothing unscraped)"},
	{name: "USE_PROMETHEUS", inert: isTrue, why: "allot always serves Prometheus metrics, on /metrics of PORT"},
	{name: "PROMETHEUS_ADDR", why: "allot serves /metrics on PORT (the HTTP listener), not on an address of its own"},
	{name: "PROMETHEUS_PATH", inert: is("/metrics"), why: "allot's metrics path is /metrics"},
	{name: "PROMETHEUS_MAPPER_YAML", why: "allot's metric names are its own (allot_*), not mapped statsd names"},
	{name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", why: "allot's durations are in seconds (_seconds)"},
	{name: "RUNTIME_ROOT", apply: rulesOnly(fileOnly)},
	{name: "RUNTIME_SUBDIRECTORY", apply: rulesOnly(fileOnly)},
	{name: "RUNTIME_APPDIRECTORY", apply: rulesOnly(fileOnly)},
	{name: "RUNTIME_IGNOREDOTFILES", inert: func(string) bool { return true }},
	{name: "RUNTIME_WATCH_ROOT", inert: func(string) bool { return true }},
	{name: "EXPIRATION_JITTER_MAX_SECONDS", why: "allot's buckets expire when full again; reset times are jittered by check.reset_jitter_max"},
	{name: "LOCAL_CACHE_SIZE_IN_BYTES", why: "allot's refusal cache and leases are always on, bounded by lease.max_keys"},
	{name: "NEAR_LIMIT_RATIO", why: "allot has no near-limit stat"},
	{name: "CACHE_KEY_PREFIX", apply: setStr(func(c *Config) *string { return &c.Store.KeyPrefix })},
	{name: "BACKEND_TYPE", inert: is("redis"), why: "allot's stores are Redis (single or cluster) and memory; no memcache"},
	{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", inert: func(string) bool { return true }},
	{name: "LIMIT_RESPONSE_HEADERS_ENABLED", apply: func(c *Config, v string, _ *envoyEnv) error {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		if on {
			c.RLS.Headers.Style = HeadersEnvoy
		}
		return nil
	}},
	{name: "LIMIT_LIMIT_HEADER", apply: withHeaders(func(c *Config) *string { return &c.RLS.Headers.Limit })},
	{name: "LIMIT_REMAINING_HEADER", apply: withHeaders(func(c *Config) *string { return &c.RLS.Headers.Remaining })},
	{name: "LIMIT_RESET_HEADER", apply: withHeaders(func(c *Config) *string { return &c.RLS.Headers.Reset })},
	{name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", inert: func(string) bool { return true }},
	{name: "REDIS_SOCKET_TYPE", apply: func(c *Config, v string, _ *envoyEnv) error {
		if !strings.EqualFold(v, "tcp") {
			return fmt.Errorf("%q not supported: allot reaches Redis over TCP only (REDIS_SOCKET_TYPE=tcp, REDIS_URL=host:port)", v)
		}
		return nil
	}},
	{name: "REDIS_TYPE", apply: func(c *Config, v string, e *envoyEnv) error {
		switch strings.ToLower(v) {
		case "single", "cluster":
			return nil // REDIS_URL reads it
		case "sentinel":
			return errors.New(`"sentinel" not supported: allot uses a single Redis or a Redis Cluster (REDIS_TYPE single or cluster)`)
		}
		return fmt.Errorf("%q, want single or cluster", v)
	}},
	{name: "REDIS_URL", apply: func(c *Config, v string, e *envoyEnv) error {
		if strings.HasPrefix(v, "/") {
			return errors.New("a Unix socket is not supported: allot reaches Redis over TCP (host:port)")
		}
		var addrs []string
		for _, a := range strings.Split(v, ",") {
			a = strings.TrimPrefix(strings.TrimSpace(a), "redis://")
			if _, _, err := net.SplitHostPort(a); err != nil {
				return fmt.Errorf("%q: want host:port", a)
			}
			addrs = append(addrs, a)
		}
		c.Store.Kind, c.Store.Addrs = "redis", addrs
		if strings.EqualFold(e.getenv("REDIS_TYPE"), "cluster") {
			c.Store.Kind = "redis-cluster"
		} else if len(addrs) > 1 {
			return fmt.Errorf("%d addresses, but REDIS_TYPE is single (set REDIS_TYPE=cluster)", len(addrs))
		}
		return nil
	}},
	{name: "REDIS_POOL_SIZE", apply: func(c *Config, v string, _ *envoyEnv) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("%q, want a whole number >= 1", v)
		}
		c.Store.PoolSize = n
		return nil
	}},
	{name: "REDIS_AUTH", apply: func(c *Config, v string, _ *envoyEnv) error {
		if user, pass, ok := strings.Cut(v, ":"); ok {
			c.Store.Username, c.Store.Password = user, pass
		} else {
			c.Store.Password = v
		}
		return nil
	}},
	{name: "REDIS_TLS", apply: parseBool(func(c *Config) *bool { return &c.Store.TLS.Enabled })},
	{name: "REDIS_TLS_CLIENT_CERT", apply: setStr(func(c *Config) *string { return &c.Store.TLS.CertFile })},
	{name: "REDIS_TLS_CLIENT_KEY", apply: setStr(func(c *Config) *string { return &c.Store.TLS.KeyFile })},
	{name: "REDIS_TLS_CACERT", apply: setStr(func(c *Config) *string { return &c.Store.TLS.CAFile })},
	{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", apply: parseBool(func(c *Config) *bool { return &c.Store.TLS.InsecureSkipVerify })},
	{name: "REDIS_PIPELINE_WINDOW", inert: is("0", "0s"), why: "allot pipelines with ALLOT_REDIS_PIPELINE (on or off), not a flush window"},
	{name: "REDIS_PIPELINE_LIMIT", inert: func(string) bool { return true }}, // unused by them too
	{name: "REDIS_CLUSTER_PIPELINE_PARALLELISM", why: "allot sends each check's script to its shard at once"},
	{name: "REDIS_PERSECOND", inert: isFalse, why: "allot keeps every bucket of a key in one Redis (Cluster); no second Redis for per-second limits"},
	{name: "REDIS_PERSECOND_SOCKET_TYPE", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_TYPE", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_URL", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_POOL_SIZE", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_AUTH", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_TLS", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_SENTINEL_AUTH", why: "Redis Sentinel is not supported"},
	{name: "REDIS_PERSECOND_SENTINEL_AUTH", why: "Redis Sentinel is not supported"},
	{name: "REDIS_PERSECOND_PIPELINE_WINDOW", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_PIPELINE_LIMIT", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", inert: isFalse, why: "Redis being down never fails allot's health (the outage fallback answers); /readyz names it as degraded"},
	{name: "REDIS_TIMEOUT", why: "allot's Redis deadlines are fallback.reply_timeout (per call) and store.dial_timeout"},
	{name: "REDIS_PERSECOND_TIMEOUT", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", inert: is("WAIT"), why: "allot's Redis pool waits for a connection; the fallback deadline bounds the wait"},
	{name: "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", why: "no second Redis for per-second limits (REDIS_PERSECOND)"},
	{name: "REDIS_STARTUP_INITIAL_INTERVAL", why: "allot starts without Redis and answers from the outage fallback until it is reachable"},
	{name: "REDIS_STARTUP_MAX_INTERVAL", why: "allot starts without Redis and answers from the outage fallback until it is reachable"},
	{name: "REDIS_STARTUP_MAX_ELAPSED_TIME", why: "allot starts without Redis and answers from the outage fallback until it is reachable"},
	{name: "MEMCACHE_HOST_PORT", why: "no memcache store"},
	{name: "MEMCACHE_MAX_IDLE_CONNS", why: "no memcache store"},
	{name: "MEMCACHE_SRV", why: "no memcache store"},
	{name: "MEMCACHE_SRV_REFRESH", why: "no memcache store"},
	{name: "MEMCACHE_TLS", why: "no memcache store"},
	{name: "MEMCACHE_TLS_CLIENT_CERT", why: "no memcache store"},
	{name: "MEMCACHE_TLS_CLIENT_KEY", why: "no memcache store"},
	{name: "MEMCACHE_TLS_CACERT", why: "no memcache store"},
	{name: "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", why: "no memcache store"},
	{name: "SHADOW_MODE", apply: parseBool(func(c *Config) *bool { return &c.RLS.ShadowMode })},
	{name: "QUOTA_MODE", apply: parseBool(func(c *Config) *bool { return &c.RLS.QuotaMode })},
	{name: "RESPONSE_DYNAMIC_METADATA", inert: isFalse, why: "allot returns no dynamic metadata"},
	{name: "MERGE_DOMAIN_CONFIG", apply: parseBool(func(c *Config) *bool { return &c.Rules.MergeDomains })},
	{name: "TRACING_ENABLED", inert: isFalse, why: "allot's tracing is configured by the standard OTEL_* variables"},
	{name: "TRACING_SERVICE_NAME", why: "allot's tracing is configured by the standard OTEL_* variables"},
	{name: "TRACING_SERVICE_NAMESPACE", why: "allot's tracing is configured by the standard OTEL_* variables"},
	{name: "TRACING_SERVICE_INSTANCE_ID", why: "allot's tracing is configured by the standard OTEL_* variables"},
	{name: "TRACING_EXPORTER_PROTOCOL", why: "allot's tracing is configured by the standard OTEL_* variables"},
	{name: "TRACING_SAMPLING_RATE", why: "allot's tracing is configured by the standard OTEL_* variables"},
}

// EnvoyVarNames are the names of envoyproxy/ratelimit's settings that the layer knows.
func EnvoyVarNames() []string {
	out := make([]string, len(envoyVars))
	for i, v := range envoyVars {
		out[i] = v.name
	}
	return out
}

// DefaultCompatRegion is the region of an enforcer the layer configures without one.
const DefaultCompatRegion = "default"

// readEnvoyEnv is command.Foreign: envoyproxy/ratelimit's variables over the config file
// and under ALLOT_*, when Config.Compat (or ALLOT_COMPAT) says so. It records what it did
// in c.EnvoyCompat; a value it cannot honour as asked (REDIS_TYPE=sentinel, a bad port) is
// an error naming the variable.
func readEnvoyEnv(c *Config, getenv func(string) string, fileGiven bool) error {
	if v := getenv("ALLOT_COMPAT"); v != "" {
		c.Compat = v
	}
	var set []string
	for _, v := range envoyVars {
		if getenv(v.name) != "" {
			set = append(set, v.name)
		}
	}
	r := &c.EnvoyCompat
	*r = CompatReport{}
	switch c.Compat {
	case CompatNone:
		r.Why = "compat: none"
	case CompatEnvoy:
		r.On, r.Why = true, "compat: "+CompatEnvoy
	case CompatAuto:
		allot := ""
		for _, n := range command.EnvNames() {
			if getenv(n) != "" {
				allot = n
				break
			}
		}
		trigger := ""
		for _, v := range envoyVars {
			if !v.generic && getenv(v.name) != "" {
				trigger = v.name
				break
			}
		}
		switch {
		case fileGiven:
			r.Why = "a config file is given (set compat: envoy-ratelimit to read their variables too)"
		case allot != "":
			r.Why = allot + " is set (set ALLOT_COMPAT=envoy-ratelimit to read their variables too)"
		case trigger == "":
			r.Why = "none of their variables is set"
		default:
			r.On, r.Why = true, "no allot configuration, and "+trigger+" is set"
		}
	default:
		return fmt.Errorf("compat %q, want %s or %s (or empty: automatic)", c.Compat, CompatEnvoy, CompatNone)
	}
	if !r.On {
		r.Ignored = set
		return nil
	}
	if c.Region == "" {
		c.Region = DefaultCompatRegion
	}
	// Their listeners' defaults: every interface, 8080 (HTTP) and 8081 (gRPC).
	e := &envoyEnv{getenv: getenv, rulesFree: c.Rules.File == "" && c.Rules.Dir == "" && c.Rules.EtcdPrefix == "" && c.Rules.XDS.Server == ""}
	for _, n := range []string{"ALLOT_RULES_FORMAT", "ALLOT_RULES_FILE", "ALLOT_RULES_DIR", "ALLOT_RULES_ETCD_PREFIX", "ALLOT_RULES_XDS_SERVER"} {
		if getenv(n) != "" {
			e.rulesFree = false
		}
	}
	// Their answers carry no header field unless LIMIT_RESPONSE_HEADERS_ENABLED=true.
	if c.RLS.Headers.Style == "" {
		c.RLS.Headers.Style = HeadersNone
	}
	var err error
	if c.Listen.HTTP, err = hostPort(e, "HOST", "0.0.0.0", "PORT", "8080"); err != nil {
		return err
	}
	if c.Listen.GRPC, err = hostPort(e, "GRPC_HOST", "0.0.0.0", "GRPC_PORT", "8081"); err != nil {
		return err
	}
	var errs []error
	for _, v := range envoyVars {
		val := getenv(v.name)
		switch {
		case val == "":
		case v.inert != nil && v.inert(val):
			r.Applied = append(r.Applied, v.name+"="+val+": what allot does anyway")
		case v.apply == nil:
			r.Unsupported = append(r.Unsupported, v.name+": not supported, ignored: "+v.why)
		default:
			err := v.apply(c, val, e)
			switch {
			case errors.As(err, new(unusedErr)):
				r.Applied = append(r.Applied, v.name+"="+val+": "+err.Error())
			case errors.Is(err, errOverridden):
				r.Unsupported = append(r.Unsupported, v.name+": "+err.Error())
			case err != nil:
				errs = append(errs, fmt.Errorf("%s: %w", v.name, err))
			default:
				r.Applied = append(r.Applied, v.name+"="+shown(v.name, val))
			}
		}
	}
	if getenv("REDIS_URL") == "" && c.Store.Kind == "memory" && getenv("ALLOT_STORE") == "" {
		r.Unsupported = append(r.Unsupported, "REDIS_URL: not set: buckets are kept in this process's memory, not shared (their default, a Unix socket to a local proxy, is not supported)")
	}
	if e.rulesFree {
		if err := applyEnvoyRules(c, getenv); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// shown is a variable's value for the logs: secrets masked.
func shown(name, v string) string {
	if name == "REDIS_AUTH" {
		return "(secret)"
	}
	return v
}

// applyEnvoyRules configures the rules as their CONFIG_TYPE says: their runtime
// directory (FILE, the default) or their xDS server (GRPC_XDS_SOTW).
func applyEnvoyRules(c *Config, getenv func(string) string) error {
	c.Rules.Format = FormatEnvoy
	if !strings.EqualFold(getenv("CONFIG_TYPE"), "GRPC_XDS_SOTW") {
		root := getenv("RUNTIME_ROOT")
		if root == "" {
			root = "/srv/runtime_data/current"
		}
		app := getenv("RUNTIME_APPDIRECTORY")
		if app == "" {
			app = "config"
		}
		c.Rules.Dir = filepath.Join(root, getenv("RUNTIME_SUBDIRECTORY"), app)
		return nil
	}
	x := &c.Rules.XDS
	x.Server = getenv("CONFIG_GRPC_XDS_SERVER_URL")
	if x.Server == "" {
		x.Server = "localhost:18000"
	}
	x.NodeID = getenv("CONFIG_GRPC_XDS_NODE_ID")
	var errs []error
	bad := func(name string, err error) { errs = append(errs, fmt.Errorf("%s: %w", name, err)) }
	var err error
	if v := getenv("CONFIG_GRPC_XDS_NODE_METADATA"); v != "" {
		if x.NodeMetadata, err = parseMap(v); err != nil {
			bad("CONFIG_GRPC_XDS_NODE_METADATA", err)
		}
	}
	if v := getenv("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"); v != "" {
		if x.Headers, err = parseMap(v); err != nil {
			bad("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", err)
		}
	}
	if v := getenv("CONFIG_GRPC_XDS_SERVER_USE_TLS"); v != "" {
		if x.TLS.Enabled, err = strconv.ParseBool(v); err != nil {
			bad("CONFIG_GRPC_XDS_SERVER_USE_TLS", err)
		}
	}
	x.TLS.CertFile = getenv("CONFIG_GRPC_XDS_CLIENT_TLS_CERT")
	x.TLS.KeyFile = getenv("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")
	x.TLS.CAFile = getenv("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
	x.TLS.ServerName = getenv("CONFIG_GRPC_XDS_SERVER_TLS_SAN")
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", &x.BackoffMin}, {"XDS_CLIENT_BACKOFF_MAX_INTERVAL", &x.BackoffMax}} {
		if v := getenv(d.name); v != "" {
			if *d.dst, err = time.ParseDuration(v); err != nil {
				bad(d.name, err)
			}
		}
	}
	if v := getenv("XDS_CLIENT_BACKOFF_JITTER"); v != "" {
		j, err := strconv.ParseBool(v)
		if err != nil {
			bad("XDS_CLIENT_BACKOFF_JITTER", err)
		}
		x.NoJitter = !j
	}
	if v := getenv("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"); v != "" {
		if x.MaxMsgBytes, err = strconv.Atoi(v); err != nil {
			bad("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", err)
		}
	}
	return errors.Join(errs...)
}
