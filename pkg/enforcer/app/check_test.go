package app

import (
	"strings"
	"testing"
)

// Check reads what the configuration names, and the environment it is given, never the
// process's own.
func TestCheckReadsNamedFilesAndEnvironment(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules.File = "us-east", "../../../configs/rules/example.yaml"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := Check(cfg, []string{"PATH=/bin", "ALLOT_REGION=us-east"}); err != nil {
		t.Fatalf("a good configuration: %v", err)
	}
	for _, tc := range []struct {
		name    string
		change  func(*Config)
		environ []string
		says    string
	}{
		{"rules file missing", func(c *Config) { c.Rules.File = "no-such-rules.yaml" }, nil, "no-such-rules.yaml"},
		{"store tls file missing", func(c *Config) {
			c.Store.Kind, c.Store.Addrs = "redis", []string{"127.0.0.1:6379"}
			c.Store.TLS.Enabled, c.Store.TLS.CAFile = true, "no-such-ca.pem"
		}, nil, "store.tls"},
		{"explain without tokens", func(c *Config) { c.Explain.Enabled = true }, nil, "explain"},
		{"unread variable", nil, []string{"ALLOT_REDIS_PASWORD=x", "ALLOT_ADMIN_TOKENS=ops:0123456789abcdef0123"}, "ALLOT_REDIS_PASWORD set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			if tc.change != nil {
				tc.change(&c)
			}
			if err := Check(c, tc.environ); err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Check: %v, want an error saying %q", err, tc.says)
			}
		})
	}
	// Explain's tokens come from the environment Check is given (ALLOT_ADMIN_TOKENS is read).
	c := cfg
	c.Explain.Enabled = true
	if err := Check(c, []string{"ALLOT_ADMIN_TOKENS=ops:0123456789abcdef0123"}); err != nil {
		t.Errorf("explain with tokens in the environment: %v", err)
	}
}
