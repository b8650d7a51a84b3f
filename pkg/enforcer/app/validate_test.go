package app

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestConfigErrorsAreErrors: a negative value where a positive one is needed is refused
// with the field named, never replaced by the default; the layers' own checks run on the
// sections as the app would build them; forward_auth goes through httpapi's Validate.
func TestConfigErrorsAreErrors(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.Region = "r"
		c.Rules.File = "rules.yaml"
		c.Store.Kind, c.Store.Addrs = "redis-cluster", []string{"127.0.0.1:7000"}
		return c
	}
	if err := func() error { c := base(); return c.Validate() }(); err != nil {
		t.Fatalf("a good redis-cluster config: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Fallback.Timeout = -5 * time.Millisecond }, "fallback.timeout -5ms, must be > 0"},
		{func(c *Config) { c.Fallback.ReplyTimeout = time.Millisecond }, "ReplyTimeout 1ms, must be >= Timeout"},
		{func(c *Config) { c.Fallback.Slack = -1 }, "fallback.slack -1"},
		{func(c *Config) { c.Fallback.TripAfter = -1 }, "fallback.trip_after -1"},
		{func(c *Config) { c.Lease.TTL = -time.Second }, "lease.ttl -1s"},
		{func(c *Config) { c.Store.ReadTimeout = -time.Second }, "store.read_timeout -1s"},
		{func(c *Config) { c.Check.MaxHits = -1 }, "check.max_hits -1"},
		{func(c *Config) { c.Check.ResetJitterMax = -time.Second }, "check.reset_jitter_max -1s"},
		{func(c *Config) { c.Check.SettleWindow = -time.Second }, "check.settle_window -1s"},
		{func(c *Config) { c.Rules.PollInterval = -time.Second }, "rules.poll_interval -1s"},
		{func(c *Config) { f := 1.5; c.Rules.DefaultShare = &f }, "rules.default_share 1.5 is no longer supported"},
		{func(c *Config) { c.Balancer.Interval = -time.Second }, "balancer.interval -1s, must be > 0"},
		{func(c *Config) { c.Etcd.StartTimeout = -time.Second }, "etcd.start_timeout -1s"},
		{func(c *Config) { c.Auth.TrustedHops = 20 }, "forward_auth: httpapi: trusted hops 20"},
		{func(c *Config) { c.Auth.RefuseStatus = 200 }, "refuse status 200"},
		{func(c *Config) { c.Listen.MaxConnectionAge = 0 }, "listen.max_connection_age 0s, must be > 0"},
		{func(c *Config) { c.Listen.MaxConnectionAgeGrace = -time.Second }, "listen.max_connection_age_grace -1s"},
		{func(c *Config) { c.Shutdown.PreStopDelay = -time.Second }, "shutdown.pre_stop_delay -1s, must be >= 0"},
	} {
		c := base()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
		}
	}
}

// balancer.addrs: each a host:port, named by index; only with balancer.enabled; it stands
// in for etcd as the way to the balancer.
func TestConfigBalancerAddrs(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.Region, c.Rules.File = "r", "rules.yaml"
		c.Balancer.Enabled = true
		c.Balancer.Addrs = []string{"balancer-1.eu-west.internal:7070", "127.0.0.1:7071"}
		c.Balancer.TLS = TLSConfig{Enabled: true, CAFile: "ca.pem", CertFile: "enforcer-r.pem", KeyFile: "enforcer-r-key.pem"}
		return c
	}
	if err := func() error { c := base(); return c.Validate() }(); err != nil {
		t.Fatalf("balancer.addrs without etcd: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Balancer.Addrs[1] = "" }, `balancer.addrs[1]: "" is not host:port`},
		{func(c *Config) { c.Balancer.Addrs[0] = "balancer-1" }, `balancer.addrs[0]: "balancer-1" is not host:port`},
		{func(c *Config) { c.Balancer.Addrs[0] = ":7070" }, `balancer.addrs[0]: ":7070" has an empty host`},
		{func(c *Config) { c.Balancer.Addrs[1] = "b:0" }, `balancer.addrs[1]: "b:0": port "0"`},
		{func(c *Config) { c.Balancer.Enabled = false }, "balancer.addrs is set but balancer.enabled is false"},
		{func(c *Config) { c.Balancer.ViaAggregator = true }, "balancer.via_aggregator and balancer.addrs are both set"},
		{func(c *Config) { c.Balancer.Addrs = nil }, "balancer.enabled needs etcd.endpoints (the leader is found there) or balancer.addrs"},
		// Reports are authenticated unless the opt-out says otherwise (issue 27 §1).
		{func(c *Config) { c.Balancer.TLS = TLSConfig{} }, "set balancer.tls.enabled with cert_file and key_file"},
		{func(c *Config) { c.Balancer.TLS.CertFile = "" }, "or balancer.insecure: true"},
	} {
		c := base()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
		}
	}
}

// -balancer-addrs and ALLOT_BALANCER_ADDRS are comma-separated lists; a bad entry is
// refused by Parse with its index.
func TestParseBalancerAddrs(t *testing.T) {
	base := []string{"-region", "r", "-rules-file", "r", "-balancer",
		"-balancer-tls", "-balancer-tls-ca", "ca.pem", "-balancer-tls-cert", "r.pem", "-balancer-tls-key", "r-key.pem"}
	cfg, err := Parse(append(base, "-balancer-addrs", "b1:7070, b2:7070"), env(nil), io.Discard)
	if err != nil || len(cfg.Balancer.Addrs) != 2 || cfg.Balancer.Addrs[1] != "b2:7070" {
		t.Fatalf("-balancer-addrs: %v %v", cfg.Balancer.Addrs, err)
	}
	if b := cfg.Balancer.TLS; b.CertFile != "r.pem" || b.KeyFile != "r-key.pem" || b.CAFile != "ca.pem" {
		t.Fatalf("-balancer-tls-*: %+v", b)
	}
	if _, err := Parse([]string{"-region", "r", "-rules-file", "r", "-balancer", "-balancer-addrs", "b1:7070", "-balancer-insecure"}, env(nil), io.Discard); err != nil {
		t.Fatalf("-balancer-insecure, the explicit opt-out: %v", err)
	}
	cfg, err = Parse(base, env(map[string]string{"ALLOT_BALANCER_ADDRS": "b3:1,b4:2"}), io.Discard)
	if err != nil || len(cfg.Balancer.Addrs) != 2 || cfg.Balancer.Addrs[0] != "b3:1" {
		t.Fatalf("ALLOT_BALANCER_ADDRS: %v %v", cfg.Balancer.Addrs, err)
	}
	if _, err := Parse(append(base, "-balancer-addrs", "b1:7070,b2"), env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), `balancer.addrs[1]: "b2" is not host:port`) {
		t.Fatalf("a bad entry: %v", err)
	}
}
