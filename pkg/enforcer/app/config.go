// Package app wires one enforcer process around its node: configuration (file, flags,
// environment), the bucket store (Redis, or memory), rules sources (file, etcd), the
// share watcher, the etcd registration, the gRPC and HTTP servers (pkg/appkit), metrics,
// reload and graceful shutdown. The node itself — fallback → lease over the store, the
// share and usage tables, the usage reports, the check core — is pkg/enforcer/node.Build's,
// the same composition regionsim runs; this package gives it the process's dependencies
// (nodeconfig.go says which settings). main stays a few lines; everything here is
// testable in-process.
package app

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/grpcapi"
	"github.com/allot-dev/allot/pkg/enforcer/httpapi"
	"github.com/allot-dev/allot/pkg/enforcer/overrides"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/tlsfiles"
)

// Config is one enforcer's configuration, as written in configs/regions/<region>.yaml.
// Every field has a default (DefaultConfig) except Region; flags and ALLOT_* environment
// variables override the file (see Flags).
type Config struct {
	// Region names the region; required.
	Region string `yaml:"region"`
	// ID names this enforcer within its region (etcd registration). Default: host-pid.
	ID string `yaml:"id"`
	// Regions are every region that enforces the global limits, with weights for the
	// default split (see Regions). Empty: a single region.
	Regions contract.Regions `yaml:"regions"`

	Store StoreConfig `yaml:"store"`
	Etcd  EtcdConfig  `yaml:"etcd"`
	// Balancer: usage reports to the quota balancer's leader, found through etcd.
	Balancer BalancerConfig `yaml:"balancer"`
	Rules    RulesConfig    `yaml:"rules"`
	Listen   ListenConfig   `yaml:"listen"`
	Lease    LeaseConfig    `yaml:"lease"`
	Fallback FallbackConfig `yaml:"fallback"`
	Quota    QuotaConfig    `yaml:"quota"`
	Check    CheckConfig    `yaml:"check"`
	Auth     AuthConfig     `yaml:"forward_auth"`
	RLS      RLSConfig      `yaml:"envoy_rls"`
	Shares   SharesConfig   `yaml:"shares"`
	Explain  ExplainConfig  `yaml:"explain"`

	// Peers is N, the live enforcers in the region, when etcd is not configured; with
	// etcd, the registry counts them. Default 1.
	Peers int `yaml:"peers"`
	// DrainTimeout bounds graceful shutdown: in-flight checks get this long to finish.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// Shutdown: the pre-stop delay before the drain.
	Shutdown ShutdownConfig `yaml:"shutdown"`
	// LogLevel is trace, debug, info, warn or error. LogJSON writes JSON lines.
	LogLevel string `yaml:"log_level"`
	LogJSON  bool   `yaml:"log_json"`
	// Pprof serves net/http/pprof under /debug/pprof/ on the HTTP address. Off by default:
	// profiles reveal internals; enable it on a loopback or admin-only listener.
	Pprof bool `yaml:"pprof"`
	// GCPercent is the Go garbage collector's target (GOGC) the enforcer process runs at:
	// the heap may grow to (1 + GCPercent/100) × the live heap before a collection.
	// Default 400, not Go's 100: an enforcer's live heap is small and bounded (the lease
	// table has a hard size), and under load allocating and collecting were about a
	// quarter of its CPU at 100 (`ALLOT_BENCH_GOGC=100 make bench-load`); at 400 a heap of 40 MB live may reach
	// 200 MB. A GOGC environment variable, if set, wins (ApplyRuntime). Must be > 0.
	GCPercent int `yaml:"gc_percent"`
	// GCHeapFloorMiB is the heap the collector lets the process reach before it collects,
	// however small the live heap: after each collection GOGC is raised above GCPercent as
	// far as it takes for the next collection to come at this heap, and no further (once
	// live × (1 + GCPercent/100) is larger, GCPercent alone decides). 0, the default, is
	// no floor. An enforcer's live heap is 7–20 MB and gRPC allocates ~3–4 KB per check,
	// so at gc_percent alone it collects every second or so at 9,000 checks/s; with 256 the
	// load benchmark's p99 was 2.65 ms against 2.88–3.70 ms without it (BENCHMARKS.md), for
	// about 290 MB of memory instead of ~75. Not the default: it costs that memory and the
	// gain is inside the run-to-run spread. A GOGC environment variable turns it off
	// (ApplyRuntime). Must be in [0, 1048576].
	GCHeapFloorMiB int `yaml:"gc_heap_floor_mib"`

	// Compat says when envoyproxy/ratelimit's environment variables are read (also
	// ALLOT_COMPAT): "" (automatic: when there is no config file and no ALLOT_* variable,
	// and one of theirs is set), envoy-ratelimit (always, over the file and under ALLOT_*
	// and flags) or none. See envcompat.go and docs/envoy-ratelimit.md.
	Compat string `yaml:"compat"`
	// EnvoyCompat is what Parse did with their variables, for the start log and
	// -check-config.
	EnvoyCompat CompatReport `yaml:"-"`

	// Tracing is OpenTelemetry tracing, configured by the standard OTEL_* environment
	// variables only (Parse reads them: appkit.TracingFromEnv), never by the file or
	// flags. Off by default.
	Tracing appkit.Tracing `yaml:"-"`
}

// DefaultGCHeapFloorMiB is Config.GCHeapFloorMiB's default.
const DefaultGCHeapFloorMiB = 0

// DefaultGCPercent is Config.GCPercent's default.
const DefaultGCPercent = 400

// StoreConfig says where buckets live.
type StoreConfig struct {
	// Kind is memory (exact, this process only), redis (one node) or redis-cluster.
	Kind string `yaml:"kind"`
	// Addrs are host:port of the Redis node or of cluster seed nodes.
	Addrs    []string `yaml:"addrs"`
	Username string   `yaml:"username"`
	// Password; prefer ALLOT_REDIS_PASSWORD to writing it in a file.
	Password string    `yaml:"password"`
	TLS      TLSConfig `yaml:"tls"`
	// KeyPrefix starts every Redis key. Default "allot:".
	KeyPrefix string `yaml:"key_prefix"`
	// DialTimeout, ReadTimeout, WriteTimeout of the Redis client. The fallback layer puts
	// its own deadline (fallback.reply_timeout) on each take. Defaults 1s, 100ms, 100ms.
	DialTimeout  time.Duration `yaml:"dial_timeout"`
	ReadTimeout  time.Duration `yaml:"read_timeout"`
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// PoolSize is connections per node; 0 lets go-redis choose (10 per CPU).
	PoolSize int `yaml:"pool_size"`
	// Pipeline coalesces concurrent Redis takes on one shard into one pipeline (one
	// write and one read for many checks; bucket.RedisOptions.Pipeline). Default off.
	Pipeline bool `yaml:"pipeline"`
	// MaxKeys bounds the memory store (identities). Default 1,048,576.
	MaxKeys int `yaml:"max_keys"`
}

// ServerTLSConfig is server TLS of a listener. Files are PEM.
type ServerTLSConfig = tlsfiles.Server

// TLSConfig is client TLS for Redis, etcd or the balancer. Files are PEM.
type TLSConfig = tlsfiles.Client

// EtcdConfig: with endpoints set the enforcer registers itself (so every enforcer knows
// N) and may read rules from etcd.
type EtcdConfig struct {
	// endpoints, username, password, tls, dial_timeout: shared with the other binary.
	appkit.EtcdClient `yaml:",inline"`
	// RegistryPrefix is where enforcers register (<prefix><region>/<id>).
	// Default contract.EnforcersPrefix.
	RegistryPrefix string `yaml:"registry_prefix"`
	// RegistrationTTL is the registration lease; a dead enforcer stops counting after it.
	// Default 10s.
	RegistrationTTL time.Duration `yaml:"registration_ttl"`
	// StartTimeout bounds the wait for the first registration and rules load at start;
	// past it the enforcer serves anyway and keeps trying. Default 5s.
	StartTimeout time.Duration `yaml:"start_timeout"`
}

// RulesConfig says where rules come from: a file, an etcd prefix, or both (the file is
// then the base set and etcd rules replace file rules of the same id); or, in format
// envoy-ratelimit, a directory of envoyproxy/ratelimit's configuration files.
type RulesConfig struct {
	// Format is the rules' format: allot (the default: File and/or EtcdPrefix) or
	// envoy-ratelimit (Dir; see docs/envoy-ratelimit.md).
	Format string `yaml:"format"`
	File   string `yaml:"file"`
	// Dir is the directory of envoyproxy/ratelimit YAML files (format envoy-ratelimit):
	// their runtime layout's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, a ConfigMap mount,
	// or any directory. Watched like File (PollInterval, SIGHUP).
	Dir string `yaml:"dir"`
	// XDS, with format envoy-ratelimit and instead of Dir, subscribes to their
	// configuration over xDS (RateLimitConfig resources, state of the world), as Envoy
	// Gateway serves it to envoyproxy/ratelimit with CONFIG_TYPE=GRPC_XDS_SOTW.
	XDS XDSConfig `yaml:"xds"`
	// MergeDomains merges the files (or xDS resources) of one domain, as their
	// MERGE_DOMAIN_CONFIG=true does; without it a domain in two files is refused.
	MergeDomains bool `yaml:"merge_domains"`
	// EtcdPrefix, e.g. "/allot/rules/", each key one rule; needs etcd endpoints.
	EtcdPrefix string `yaml:"etcd_prefix"`
	// PollInterval is how often the file is checked for changes. Default 2s.
	PollInterval time.Duration `yaml:"poll_interval"`
	// DefaultShare is removed: setting it is an error (see Regions for the default split).
	DefaultShare *float64 `yaml:"default_share"`
	// IPv6Prefix is the prefix IPv6 clients are limited by. Default 64.
	IPv6Prefix int `yaml:"ipv6_prefix"`
}

// XDSConfig is the xDS management server rules come from (RulesConfig.XDS); their
// variable for each field is named.
type XDSConfig struct {
	// Server is host:port (CONFIG_GRPC_XDS_SERVER_URL). Empty: no xDS.
	Server string `yaml:"server"`
	// NodeID is the node the server keys its snapshots by (CONFIG_GRPC_XDS_NODE_ID);
	// empty: "default".
	NodeID string `yaml:"node_id"`
	// NodeMetadata is sent as the node's metadata (CONFIG_GRPC_XDS_NODE_METADATA).
	NodeMetadata map[string]string `yaml:"node_metadata"`
	// Headers are added to the stream's gRPC metadata
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string `yaml:"headers"`
	// TLS to the server (CONFIG_GRPC_XDS_SERVER_USE_TLS, _CLIENT_TLS_CERT, _CLIENT_TLS_KEY,
	// _SERVER_TLS_CACERT, _SERVER_TLS_SAN as server_name). Disabled: plaintext.
	TLS TLSConfig `yaml:"tls"`
	// BackoffMin and BackoffMax pace reconnects (XDS_CLIENT_BACKOFF_INITIAL_INTERVAL,
	// _MAX_INTERVAL); zero: 1 s doubling to 30 s. NoJitter turns the jitter off
	// (XDS_CLIENT_BACKOFF_JITTER=false).
	BackoffMin time.Duration `yaml:"backoff_min"`
	BackoffMax time.Duration `yaml:"backoff_max"`
	NoJitter   bool          `yaml:"no_jitter"`
	// MaxMsgBytes bounds one response (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES); 0: 16 MiB.
	MaxMsgBytes int `yaml:"max_msg_bytes"`
}

// The rules formats (RulesConfig.Format).
const (
	FormatAllot = "allot"
	FormatEnvoy = "envoy-ratelimit"
)

// ListenConfig: addresses to serve on.
type ListenConfig struct {
	GRPC string `yaml:"grpc"`
	HTTP string `yaml:"http"`
	// GRPCTLS serves gRPC over TLS (envoyproxy/ratelimit's GRPC_SERVER_USE_TLS,
	// GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY, GRPC_CLIENT_TLS_CACERT); with
	// client_ca_file, clients must present a certificate from it. Off by default.
	GRPCTLS ServerTLSConfig `yaml:"grpc_tls"`
	// GRPCClientSAN, with grpc_tls.client_ca_file, is a DNS name (or IP address) the
	// client's certificate must carry (GRPC_CLIENT_TLS_SAN).
	GRPCClientSAN string `yaml:"grpc_client_san"`
	// Debug, if set, is a third listener serving /debug/pprof/ and /metrics only
	// (envoyproxy/ratelimit's DEBUG_HOST:DEBUG_PORT). Default: none.
	Debug string `yaml:"debug"`
	// Advertise is the address registered in etcd. Default: the gRPC listen address.
	Advertise string `yaml:"advertise"`
	// MaxConcurrentStreams per gRPC connection. Default 1024.
	MaxConcurrentStreams uint32 `yaml:"max_concurrent_streams"`
	// MaxConnectionAge is how long a gRPC connection may live before the enforcer asks its
	// client to reconnect (an HTTP/2 GOAWAY; gRPC adds ±10% jitter so a fleet's connections
	// do not all go at once). Calls in flight finish on the old connection and new calls
	// go on a new one, which the client's load balancing may give to another enforcer: an
	// Envoy keeps a connection for ever otherwise, so enforcers started after it (a rolling
	// restart, a scale-up) would get none of its checks. Must be > 0. Default 5m.
	MaxConnectionAge time.Duration `yaml:"max_connection_age"`
	// MaxConnectionAgeGrace is how long the calls in flight on a connection past its age
	// may take before it is closed. 0 or absent: drain_timeout, so a connection is never
	// cut sooner than a shutdown would cut it.
	MaxConnectionAgeGrace time.Duration `yaml:"max_connection_age_grace"`
}

// ShutdownConfig: what SIGINT or SIGTERM does before the drain (Config.DrainTimeout).
type ShutdownConfig struct {
	// PreStopDelay is how long the enforcer goes on serving after the signal, before it
	// drains: meanwhile /readyz answers 503 and the gRPC health service NOT_SERVING, so
	// load balancers take it out of rotation, while every check is still answered, on the
	// connections open and on new ones. Behind a load balancer that learns of a stopping
	// instance late (Kubernetes endpoints and Envoy's EDS, a readiness probe's period), set
	// it to at least that delay (5–10 s), and the termination grace period to at least
	// pre_stop_delay + drain_timeout. 0, the default: drain at once, as a process without
	// a load balancer in front wants.
	PreStopDelay time.Duration `yaml:"pre_stop_delay"`
}

// LeaseConfig tunes pkg/lease (busy keys take batches of tokens). Zero fields keep
// lease.DefaultConfig's values.
type LeaseConfig struct {
	Disabled bool          `yaml:"disabled"`
	TTL      time.Duration `yaml:"ttl"`
	QuietTTL time.Duration `yaml:"quiet_ttl"`
	Window   time.Duration `yaml:"window"`
	BusyHits int           `yaml:"busy_hits"`
	MaxKeys  int           `yaml:"max_keys"`
	// SightEvery and SightTTL pace the sightings that count the enforcers serving a busy
	// key (lease.Config): its batches and its local limits during an outage are sized by
	// that count instead of every live enforcer of the region.
	SightEvery time.Duration `yaml:"sight_every"`
	SightTTL   time.Duration `yaml:"sight_ttl"`
}

// FallbackConfig tunes pkg/fallback (per-shard deadlines, breakers, local limits). Zero
// fields keep fallback.DefaultConfig's values.
type FallbackConfig struct {
	Timeout      time.Duration `yaml:"timeout"`
	ReplyTimeout time.Duration `yaml:"reply_timeout"`
	AllSilentFor time.Duration `yaml:"all_silent_for"`
	ProbeTimeout time.Duration `yaml:"probe_timeout"`
	TripAfter    int           `yaml:"trip_after"`
	FirstOpenFor time.Duration `yaml:"first_open_for"`
	OpenFor      time.Duration `yaml:"open_for"`
	MaxInFlight  int           `yaml:"max_in_flight"`
	Slack        float64       `yaml:"slack"`
	MaxLocalKeys int           `yaml:"max_local_keys"`
}

// QuotaConfig tunes pkg/quota (calendar quotas counted in batches). Zero fields keep
// quota.DefaultConfig's values.
type QuotaConfig struct {
	// Flush is how often each enforcer adds its counts to the quota counters in Redis and
	// learns the others' (default 2 s): the batch interval of the over-error bound.
	Flush      time.Duration `yaml:"flush"`
	Keep       time.Duration `yaml:"keep"`
	MaxEntries int           `yaml:"max_entries"`
}

// CheckConfig tunes the enforcer core. Zero fields keep enforcer.DefaultConfig's values.
type CheckConfig struct {
	MaxDescriptors   int           `yaml:"max_descriptors"`
	MaxEntries       int           `yaml:"max_entries"`
	MaxKeyLen        int           `yaml:"max_key_len"`
	MaxValueLen      int           `yaml:"max_value_len"`
	MaxHits          int64         `yaml:"max_hits"`
	ResetJitterMax   time.Duration `yaml:"reset_jitter_max"`
	DecisionLogEvery uint64        `yaml:"decision_log_every"`
	RefusalLogEvery  uint64        `yaml:"refusal_log_every"`
	// SettleWindow is how long a check's settlement handle may be settled (in [1s, 24h];
	// enforcer.Config.SettleWindow): after it the estimate stands.
	SettleWindow time.Duration `yaml:"settle_window"`
	// IdentityDigestKey keys the identity digest of the sampled refusal logs (see
	// enforcer.Config.IdentityDigestKey): the same secret on every enforcer makes digests
	// match across the fleet; prefer $ALLOT_IDENTITY_DIGEST_KEY to the file. Empty: a
	// random key per process.
	IdentityDigestKey string `yaml:"identity_digest_key"`
	// LogIdentities adds the identity itself (API key, IP) to the sampled refusal logs.
	LogIdentities bool `yaml:"log_identities"`
}

// AuthConfig names the forward-auth headers; empty fields keep httpapi's defaults.
type AuthConfig struct {
	APIKeyHeader       string `yaml:"api_key_header"`
	PlanHeader         string `yaml:"plan_header"`
	OrgHeader          string `yaml:"org_header"`
	EndpointHeader     string `yaml:"endpoint_header"`
	RealIPHeader       string `yaml:"real_ip_header"`
	ForwardedForHeader string `yaml:"forwarded_for_header"`
	TrustedHops        int    `yaml:"trusted_hops"`
	RefuseStatus       int    `yaml:"refuse_status"`
	// TrustedProxies: the gateway's addresses (CIDR prefixes or single addresses) whose
	// requests may set the gateway-only headers; absent: loopback only; []: none.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// TrustedHeaders: the gateway-only headers believed from them; absent: what the
	// README's snippets set (httpapi.DefaultTrustedHeaders). Add X-Endpoint, X-Plan,
	// X-Org or X-RateLimit-Hits only for a gateway that sets or strips each one.
	TrustedHeaders []string `yaml:"trusted_headers"`
}

// RLSConfig: Envoy RLS options (grpcapi.Config). Their envoyproxy/ratelimit
// variables are named.
type RLSConfig struct {
	// Domain, if set, is the only domain accepted.
	Domain string `yaml:"domain"`
	// ShadowMode answers every request OK; the would-be refusals are counted
	// (SHADOW_MODE).
	ShadowMode bool `yaml:"shadow_mode"`
	// QuotaMode makes every descriptor a quota one (QUOTA_MODE).
	QuotaMode bool `yaml:"quota_mode"`
	// LimitOverrides honours a descriptor's own limit, as envoyproxy/ratelimit always
	// does; off by default: a caller that can set it can raise its own limit.
	LimitOverrides bool `yaml:"limit_overrides"`
	// Headers are the header fields an answer adds.
	Headers RLSHeaders `yaml:"headers"`
}

// RLSHeaders picks the header fields of an Envoy RLS answer.
type RLSHeaders struct {
	// Style is ietf (the default: RateLimit and RateLimit-Policy), envoy-ratelimit
	// (theirs: LIMIT_RESPONSE_HEADERS_ENABLED=true) or none.
	Style string `yaml:"style"`
	// Limit, Remaining and Reset name envoy-ratelimit's fields; empty: theirs
	// (RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset; LIMIT_LIMIT_HEADER,
	// LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER).
	Limit     string `yaml:"limit"`
	Remaining string `yaml:"remaining"`
	Reset     string `yaml:"reset"`
}

// The header styles (RLSHeaders.Style).
const (
	HeadersIETF  = "ietf"
	HeadersEnvoy = "envoy-ratelimit"
	HeadersNone  = "none"
)

// grpcConfig is the Envoy RLS front end's configuration.
func (c *Config) grpcConfig() grpcapi.Config {
	r := c.RLS
	g := grpcapi.Config{Domain: r.Domain, Shadow: r.ShadowMode, QuotaMode: r.QuotaMode, LimitOverrides: r.LimitOverrides,
		Headers: grpcapi.Headers{Limit: r.Headers.Limit, Remaining: r.Headers.Remaining, Reset: r.Headers.Reset}}
	switch r.Headers.Style {
	case HeadersEnvoy:
		g.Headers.Style = grpcapi.HeadersEnvoyRatelimit
	case HeadersNone:
		g.Headers.Style = grpcapi.HeadersNone
	}
	return g
}

// DefaultMaxConnectionAge is ListenConfig.MaxConnectionAge's default.
const DefaultMaxConnectionAge = 5 * time.Minute

// DefaultConfig returns the defaults: memory store, listen on 127.0.0.1:8081 (gRPC) and
// :8080 (HTTP), gRPC connections renewed every 5 minutes, one peer, no pre-stop delay,
// 10 s drain, info logs.
func DefaultConfig() Config {
	return Config{
		Store: StoreConfig{
			Kind: "memory", KeyPrefix: "allot:", DialTimeout: time.Second,
			ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, MaxKeys: 1 << 20,
		},
		Etcd: EtcdConfig{
			EtcdClient: appkit.EtcdClient{DialTimeout: 2 * time.Second}, RegistryPrefix: contract.EnforcersPrefix,
			RegistrationTTL: 10 * time.Second, StartTimeout: 5 * time.Second,
		},
		Rules:  RulesConfig{PollInterval: 2 * time.Second, IPv6Prefix: 64},
		Shares: SharesConfig{EtcdPrefix: contract.SharesPrefix, StaleAfter: overrides.DefaultStale},
		Listen: ListenConfig{GRPC: "127.0.0.1:8081", HTTP: "127.0.0.1:8080", MaxConcurrentStreams: 1024,
			MaxConnectionAge: DefaultMaxConnectionAge},
		Peers:          1,
		DrainTimeout:   10 * time.Second,
		GCPercent:      DefaultGCPercent,
		GCHeapFloorMiB: DefaultGCHeapFloorMiB,
		LogLevel:       "info",
	}
}

// Validate names the first bad field.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("app: config: "+format, a...)) }
	if c.Region == "" {
		bad("region is empty (set region:, -region or ALLOT_REGION)")
	}
	switch c.Store.Kind {
	case "memory":
	case "redis", "redis-cluster":
		if len(c.Store.Addrs) == 0 {
			bad("store.addrs is empty for store %q", c.Store.Kind)
		}
		if c.Store.Kind == "redis" && len(c.Store.Addrs) > 1 {
			bad("store.addrs has %d addresses; store redis takes one (use redis-cluster)", len(c.Store.Addrs))
		}
	default:
		bad("store.kind %q, want memory, redis or redis-cluster", c.Store.Kind)
	}
	switch r := c.Rules; r.Format {
	case "", FormatAllot:
		if r.File == "" && r.EtcdPrefix == "" {
			bad("no rules: set rules.file and/or rules.etcd_prefix (or rules.format %s with rules.dir)", FormatEnvoy)
		}
		if r.Dir != "" || r.MergeDomains || r.XDS.Server != "" {
			bad("rules.dir, rules.xds and rules.merge_domains are for rules.format %s (format is %q)", FormatEnvoy, r.Format)
		}
	case FormatEnvoy:
		switch {
		case r.Dir == "" && r.XDS.Server == "":
			bad("rules.format %s needs rules.dir (a directory of envoyproxy/ratelimit files) or rules.xds.server (their configuration over xDS)", FormatEnvoy)
		case r.Dir != "" && r.XDS.Server != "":
			bad("rules.dir %q and rules.xds.server %q: set one (a directory, or xDS)", r.Dir, r.XDS.Server)
		}
		if x := r.XDS; x.Server != "" {
			if _, _, err := net.SplitHostPort(x.Server); err != nil {
				bad("rules.xds.server %q: want host:port", x.Server)
			}
			if x.BackoffMin < 0 || x.BackoffMax < 0 || x.BackoffMax != 0 && x.BackoffMax < x.BackoffMin {
				bad("rules.xds.backoff_min %v, backoff_max %v: want 0 <= min <= max", x.BackoffMin, x.BackoffMax)
			}
			if x.MaxMsgBytes < 0 {
				bad("rules.xds.max_msg_bytes %d, must be >= 0", x.MaxMsgBytes)
			}
		}
		if r.File != "" || r.EtcdPrefix != "" {
			bad("rules.format %s reads rules.dir only; rules.file and rules.etcd_prefix are for format %s", FormatEnvoy, FormatAllot)
		}
	default:
		bad("rules.format %q, want %s or %s", r.Format, FormatAllot, FormatEnvoy)
	}
	if c.Balancer.Enabled && len(c.Etcd.Endpoints) == 0 && len(c.Balancer.Addrs) == 0 {
		bad("balancer.enabled needs etcd.endpoints (the leader is found there) or balancer.addrs")
	}
	if b := c.Balancer; b.Enabled && !b.Insecure && (!b.TLS.Enabled || b.TLS.CertFile == "") {
		bad("balancer: reports would not be authenticated: set balancer.tls.enabled with cert_file and key_file (this region's client certificate) and ca_file (`balancer certs -dir bin/certs` makes them), or balancer.insecure: true (-balancer-insecure) for a balancer that takes unauthenticated reports")
	}
	if c.Balancer.ViaAggregator && len(c.Balancer.Addrs) > 0 {
		bad("balancer.via_aggregator and balancer.addrs are both set: reports go to the region's aggregator (found in etcd) or to the listed balancer addresses, not both")
	}
	if len(c.Balancer.Addrs) > 0 && !c.Balancer.Enabled {
		bad("balancer.addrs is set but balancer.enabled is false: no reports would be sent")
	}
	for i, a := range c.Balancer.Addrs {
		if err := report.CheckAddr(a); err != nil {
			bad("balancer.addrs[%d]: %v", i, err)
		}
	}
	if c.Rules.EtcdPrefix != "" && len(c.Etcd.Endpoints) == 0 {
		bad("rules.etcd_prefix %q needs etcd.endpoints", c.Rules.EtcdPrefix)
	}
	if c.Listen.GRPC == "" && c.Listen.HTTP == "" {
		bad("listen: neither grpc nor http address set")
	}
	if c.Listen.GRPCClientSAN != "" && (!c.Listen.GRPCTLS.Enabled || c.Listen.GRPCTLS.ClientCAFile == "") {
		bad("listen.grpc_client_san %q needs listen.grpc_tls with client_ca_file (client certificates)", c.Listen.GRPCClientSAN)
	}
	switch c.RLS.Headers.Style {
	case "", HeadersIETF, HeadersEnvoy, HeadersNone:
	default:
		bad("envoy_rls.headers.style %q, want %s, %s or %s", c.RLS.Headers.Style, HeadersIETF, HeadersEnvoy, HeadersNone)
	}
	if h := c.RLS.Headers; h.Style != HeadersEnvoy && (h.Limit != "" || h.Remaining != "" || h.Reset != "") {
		bad("envoy_rls.headers: limit, remaining and reset name the fields of style %s (style is %q)", HeadersEnvoy, h.Style)
	}
	if c.Peers < 1 {
		bad("peers %d, must be >= 1", c.Peers)
	}
	if c.GCPercent <= 0 {
		bad("gc_percent %d, must be > 0", c.GCPercent)
	}
	if c.GCHeapFloorMiB < 0 || c.GCHeapFloorMiB > 1<<20 {
		bad("gc_heap_floor_mib %d, must be in [0, %d] (0: no floor)", c.GCHeapFloorMiB, 1<<20)
	}
	if c.DrainTimeout <= 0 {
		bad("drain_timeout %v, must be > 0", c.DrainTimeout)
	}
	if c.Etcd.RegistrationTTL < time.Second || c.Etcd.RegistrationTTL%time.Second != 0 {
		bad("etcd.registration_ttl %v, must be whole seconds >= 1s", c.Etcd.RegistrationTTL)
	}
	for _, l := range []string{"trace", "debug", "info", "warn", "error"} {
		if strings.EqualFold(c.LogLevel, l) {
			goto levelOK
		}
	}
	bad("log_level %q, want trace, debug, info, warn or error", c.LogLevel)
levelOK:
	if _, err := httpapi.ParseTrustedProxies(c.Auth.TrustedProxies); err != nil {
		bad("forward_auth: %v", err)
	} else if err := c.authConfig().Validate(); err != nil {
		bad("forward_auth: %v", err)
	}
	c.validateShares(bad)
	errs = append(errs, c.validateSections()...)
	if err := c.Tracing.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// enforcerConfig applies the check settings over enforcer.DefaultConfig.
func (c *Config) enforcerConfig() enforcer.Config {
	ec := enforcer.DefaultConfig()
	ch := c.Check
	overrideIfSet(&ec.Limits.MaxDescriptors, ch.MaxDescriptors)
	overrideIfSet(&ec.Limits.MaxEntries, ch.MaxEntries)
	overrideIfSet(&ec.Limits.MaxKeyLen, ch.MaxKeyLen)
	overrideIfSet(&ec.Limits.MaxValueLen, ch.MaxValueLen)
	overrideIfSet(&ec.Limits.MaxHits, ch.MaxHits)
	overrideIfSet(&ec.ResetJitterMax, ch.ResetJitterMax)
	overrideIfSet(&ec.DecisionLogEvery, ch.DecisionLogEvery)
	overrideIfSet(&ec.RefusalLogEvery, ch.RefusalLogEvery)
	overrideIfSet(&ec.SettleWindow, ch.SettleWindow)
	if ch.IdentityDigestKey != "" {
		ec.IdentityDigestKey = []byte(ch.IdentityDigestKey)
	}
	ec.LogIdentities = ch.LogIdentities
	ec.Region = c.Region
	return ec
}

func (c *Config) authConfig() httpapi.Config {
	a := c.Auth
	proxies, err := httpapi.ParseTrustedProxies(a.TrustedProxies)
	if err != nil { // Validate says so; should it be skipped, trust no peer
		proxies = []netip.Prefix{}
	}
	return httpapi.Config{
		APIKeyHeader: a.APIKeyHeader, PlanHeader: a.PlanHeader, OrgHeader: a.OrgHeader,
		EndpointHeader: a.EndpointHeader, RealIPHeader: a.RealIPHeader,
		ForwardedForHeader: a.ForwardedForHeader, TrustedHops: a.TrustedHops, RefuseStatus: a.RefuseStatus,
		TrustedProxies: proxies, TrustedHeaders: a.TrustedHeaders,
	}
}

// BalancerConfig: usage reports to the quota balancer (pkg/enforcer/report). Zero fields take
// pkg/enforcer/report's defaults.
type BalancerConfig struct {
	// Enabled turns usage reports on; needs etcd.endpoints (the leader is found there) or
	// Addrs.
	Enabled bool `yaml:"enabled"`
	// ElectionPrefix is the balancer's election prefix. Default contract.ElectionPrefix.
	ElectionPrefix string `yaml:"election_prefix"`
	// ViaAggregator sends the reports to this region's elected report aggregator
	// (pkg/aggregator, `balancer` with an aggregate section; docs/design.md §12), found
	// in etcd on contract.AggregatorElection(AggregatorPrefix, region), instead of the
	// balancer leader. Default false: the direct path.
	ViaAggregator bool `yaml:"via_aggregator"`
	// AggregatorPrefix is the aggregators' election prefix. Default
	// contract.AggregatorPrefix.
	AggregatorPrefix string `yaml:"aggregator_prefix"`
	// Addrs, if set, are the balancer replicas' report addresses as this region reaches
	// them (host:port each; e.g. through the region's own load balancer or proxy), used
	// instead of the address the leader advertises in etcd. A report goes to the address
	// that last accepted one; on an error or a standby's answer the next address is tried.
	// A standby's redirect to an address not in this list is not followed.
	Addrs []string `yaml:"addrs"`
	// Interval between reports. Default 10s.
	Interval time.Duration `yaml:"interval"`
	// Capacity is how many (rule, identity) pairs are tracked. Default 16384.
	Capacity int `yaml:"capacity"`
	// MaxIdentities caps one report; keep it <= the balancer's cap. Default 4096.
	MaxIdentities int `yaml:"max_identities"`
	// SendTimeout bounds each report RPC. Default 2s.
	SendTimeout time.Duration `yaml:"send_timeout"`
	// TLS for the report API: required (with CertFile and KeyFile, this region's client
	// certificate from `balancer certs`, and CAFile verifying the balancer) unless
	// Insecure.
	TLS TLSConfig `yaml:"tls"`
	// Insecure is the explicit opt-out: reports in plaintext, without a client
	// certificate (only a balancer with listen.insecure_reports takes them). Logged as a
	// warning at start.
	Insecure bool `yaml:"insecure"`
}
