package app

import (
	"os"

	"github.com/allot-dev/allot/pkg/enforcer/grpcapi"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Istio's deployment of envoyproxy/ratelimit, its environment as it is: with no allot
// configuration the layer turns itself on and every variable is honoured or named.
func TestEnvoyEnvIstio(t *testing.T) {
	cfg, err := ParseUnchecked(nil, env(map[string]string{
		"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "USE_STATSD": "false",
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
		"RUNTIME_IGNOREDOTFILES": "true", "REDIS_AUTH": "ratelimit:s3cret", "MEMCACHE_HOST_PORT": "m:11211",
	}), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.EnvoyCompat
	if !r.On || !strings.Contains(r.Why, "no allot configuration") {
		t.Fatalf("compat %+v, want on", r)
	}
	if cfg.Region != DefaultCompatRegion || cfg.Listen.HTTP != "0.0.0.0:8080" || cfg.Listen.GRPC != "0.0.0.0:8081" {
		t.Errorf("region %q, listen %+v", cfg.Region, cfg.Listen)
	}
	if cfg.Store.Kind != "redis" || !slices.Equal(cfg.Store.Addrs, []string{"redis:6379"}) ||
		cfg.Store.Username != "ratelimit" || cfg.Store.Password != "s3cret" {
		t.Errorf("store %+v", cfg.Store)
	}
	if cfg.Rules.Format != FormatEnvoy || cfg.Rules.Dir != "/data/ratelimit/config" || cfg.LogLevel != "debug" {
		t.Errorf("rules %+v, log level %q", cfg.Rules, cfg.LogLevel)
	}
	if len(r.Unsupported) != 1 || !strings.HasPrefix(r.Unsupported[0], "MEMCACHE_HOST_PORT: not supported") {
		t.Errorf("unsupported %q, want MEMCACHE_HOST_PORT named", r.Unsupported)
	}
	for _, a := range r.Applied {
		if strings.Contains(a, "s3cret") {
			t.Errorf("a secret in the report: %q", a)
		}
	}
}

// Envoy Gateway's: their xDS server, node id and TLS.
func TestEnvoyEnvGateway(t *testing.T) {
	cfg, err := ParseUnchecked(nil, env(map[string]string{
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001",
		"CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt",
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "a:1,b:2",
		"GRPC_PORT": "8082", "PORT": "8090", "REDIS_TYPE": "cluster", "REDIS_URL": "r1:6379,r2:6379",
		"REDIS_TLS": "true", "USE_PROMETHEUS": "true", "SHADOW_MODE": "true",
	}), nil)
	if err != nil {
		t.Fatal(err)
	}
	x := cfg.Rules.XDS
	if cfg.Rules.Format != FormatEnvoy || cfg.Rules.Dir != "" || x.Server != "envoy-gateway:18001" || x.NodeID != "envoy-ratelimit" ||
		!x.TLS.Enabled || x.TLS.CAFile != "/certs/ca.crt" || x.TLS.CertFile != "/certs/tls.crt" || x.Headers["b"] != "2" {
		t.Errorf("rules %+v", cfg.Rules)
	}
	if cfg.Listen.HTTP != "0.0.0.0:8090" || cfg.Listen.GRPC != "0.0.0.0:8082" {
		t.Errorf("listen %+v", cfg.Listen)
	}
	if cfg.Store.Kind != "redis-cluster" || len(cfg.Store.Addrs) != 2 || !cfg.Store.TLS.Enabled {
		t.Errorf("store %+v", cfg.Store)
	}
	if u := cfg.EnvoyCompat.Unsupported; len(u) != 0 || !cfg.RLS.ShadowMode || cfg.RLS.Headers.Style != HeadersNone {
		t.Errorf("unsupported %q, shadow %v, headers %+v: want SHADOW_MODE honoured, no header fields (their default)", u, cfg.RLS.ShadowMode, cfg.RLS.Headers)
	}
	if g := cfg.grpcConfig(); !g.Shadow || g.Headers.Style != grpcapi.HeadersNone {
		t.Errorf("grpc config %+v", g)
	}
	cfg, err = ParseUnchecked(nil, env(map[string]string{"REDIS_URL": "r:1", "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
		"LIMIT_REMAINING_HEADER": "X-RateLimit-Remaining", "QUOTA_MODE": "true"}), nil)
	if g := cfg.grpcConfig(); err != nil || g.Headers.Style != grpcapi.HeadersEnvoyRatelimit || g.Headers.Remaining != "X-RateLimit-Remaining" || !g.QuotaMode {
		t.Errorf("their headers: %v, %+v", err, g)
	}
	cfg, err = ParseUnchecked(nil, env(map[string]string{"REDIS_URL": "r:1", "LIMIT_REMAINING_HEADER": "X-R"}), nil)
	if err != nil || cfg.RLS.Headers.Remaining != "" || cfg.Validate() != nil {
		t.Errorf("a header name without LIMIT_RESPONSE_HEADERS_ENABLED (unused, as theirs): %v, %+v", err, cfg.RLS.Headers)
	}
	cfg, err = ParseUnchecked(nil, env(map[string]string{"CONFIG_TYPE": "FILE"}), nil)
	if u := cfg.EnvoyCompat.Unsupported; err != nil || len(u) != 1 || !strings.HasPrefix(u[0], "REDIS_URL: not set: buckets are kept in this process's memory") {
		t.Errorf("unsupported %q, want SHADOW_MODE (true) named", u)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

// The layers: defaults < file < their variables < ALLOT_* < flags; and when the layer
// is on, off, or refuses a value.
func TestEnvoyEnvLayers(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	os.WriteFile(file, []byte("region: eu\ncompat: envoy-ratelimit\nrules: {file: r.yaml}\nstore: {kind: redis, addrs: ['f:1']}\n"), 0o644)
	cfg, err := ParseUnchecked([]string{"-config", file, "-grpc-addr", "127.0.0.1:1"}, env(map[string]string{
		"REDIS_URL": "theirs:6379", "PORT": "9000", "ALLOT_HTTP_ADDR": "127.0.0.1:2", "RUNTIME_ROOT": "/data",
	}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Region != "eu" || cfg.Store.Addrs[0] != "theirs:6379" || cfg.Listen.HTTP != "127.0.0.1:2" || cfg.Listen.GRPC != "127.0.0.1:1" {
		t.Errorf("region %q, store %v, listen %+v", cfg.Region, cfg.Store.Addrs, cfg.Listen)
	}
	if cfg.Rules.File != "r.yaml" || cfg.Rules.Dir != "" {
		t.Errorf("the file's rules should win: %+v", cfg.Rules)
	}
	if u := strings.Join(cfg.EnvoyCompat.Unsupported, "\n"); !strings.Contains(u, "RUNTIME_ROOT: not applied: allot's own rules configuration") {
		t.Errorf("unsupported %q, want RUNTIME_ROOT named as overridden", u)
	}

	// Off: a config file, or an ALLOT_* variable, or compat none; their variables are named.
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
	}{
		"file":  {[]string{"-config", "../../../configs/regions/us-east.yaml"}, map[string]string{"REDIS_URL": "x:1"}},
		"allot": {nil, map[string]string{"REDIS_URL": "x:1", "ALLOT_REGION": "eu"}},
		"none":  {nil, map[string]string{"REDIS_URL": "x:1", "ALLOT_COMPAT": "none"}},
		"port":  {nil, map[string]string{"PORT": "9000"}}, // too generic to turn it on
	} {
		cfg, err := ParseUnchecked(tc.args, env(tc.env), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r := cfg.EnvoyCompat; r.On || len(r.Ignored) != 1 || cfg.Store.Kind == "redis" && cfg.Store.Addrs[0] == "x:1" {
			t.Errorf("%s: %+v, store %+v: want off, the variable named", name, r, cfg.Store)
		}
	}

	// Values allot cannot honour are errors naming the variable.
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "m,s1:26379"}, `REDIS_TYPE: "sentinel" not supported`},
		{map[string]string{"REDIS_URL": "/var/run/nutcracker/ratelimit.sock"}, "REDIS_URL: a Unix socket is not supported"},
		{map[string]string{"REDIS_URL": "a:1", "REDIS_SOCKET_TYPE": "unix"}, `REDIS_SOCKET_TYPE: "unix" not supported`},
		{map[string]string{"REDIS_URL": "a:1,b:2"}, "REDIS_URL: 2 addresses, but REDIS_TYPE is single"},
		{map[string]string{"GRPC_PORT": "eighty"}, `GRPC_PORT: "eighty" is not a port number`},
		{map[string]string{"CONFIG_TYPE": "XDS"}, "CONFIG_TYPE: want FILE or GRPC_XDS_SOTW"},
		{map[string]string{"CONFIG_TYPE": "FILE", "LOG_LEVEL": "loud"}, "LOG_LEVEL: want trace"},
		{map[string]string{"ALLOT_COMPAT": "lyft"}, `compat "lyft"`},
	} {
		_, err := ParseUnchecked(nil, env(tc.env), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
}

// Every variable the layer knows is honoured, inert or explained: none is dropped without
// a word.
func TestEnvoyVarsExplained(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range envoyVars {
		if seen[v.name] {
			t.Errorf("%s twice", v.name)
		}
		seen[v.name] = true
		if v.apply == nil && v.why == "" && v.inert == nil {
			t.Errorf("%s: neither honoured nor explained", v.name)
		}
		if v.apply == nil && v.inert != nil && v.why == "" && !v.inert("some value") {
			t.Errorf("%s: a value not inert would be reported with no reason", v.name)
		}
	}
}
