package registry

import (
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	c := DefaultConfig()
	c.Region, c.ID, c.Addr = "us-east", "enf-1", "10.0.0.1:8081"
	return c
}

func TestConfigValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // a substring naming the field and value
	}{
		{"empty prefix", func(c *Config) { c.Prefix = "" }, `Prefix ""`},
		{"prefix without slash", func(c *Config) { c.Prefix = "/allot" }, `Prefix "/allot"`},
		{"empty region", func(c *Config) { c.Region = "" }, "Region must not be empty"},
		{"region with slash", func(c *Config) { c.Region = "us/east" }, `Region "us/east" must not contain '/'`},
		{"id with space", func(c *Config) { c.ID = "a b" }, `ID "a b" must not contain ' '`},
		{"id control char", func(c *Config) { c.ID = "a\x00" }, `ID "a\x00"`},
		{"id too long", func(c *Config) { c.ID = strings.Repeat("x", 129) }, "129 bytes"},
		{"empty addr", func(c *Config) { c.Addr = " " }, `Addr " "`},
		{"ttl too small", func(c *Config) { c.TTL = 500 * time.Millisecond }, "TTL 500ms"},
		{"ttl fractional", func(c *Config) { c.TTL = 1500 * time.Millisecond }, "TTL 1.5s"},
		{"request timeout", func(c *Config) { c.RequestTimeout = -time.Second }, "RequestTimeout -1s"},
		{"revoke timeout", func(c *Config) { c.RevokeTimeout = 0 }, "RevokeTimeout 0s"},
		{"backoff min", func(c *Config) { c.BackoffMin = 0 }, "BackoffMin 0s"},
		{"backoff max", func(c *Config) { c.BackoffMax = time.Millisecond }, "BackoffMax 1ms must be at least BackoffMin 100ms"},
		{"nil logger", func(c *Config) { c.Logger = nil }, "Logger"},
		{"nil clock", func(c *Config) { c.Clock = nil }, "Clock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestConfigDefaultsFillZeroFields(t *testing.T) {
	c := Config{Region: "eu", ID: "a", Addr: ":1"}.withDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	d := DefaultConfig()
	if c.Prefix != d.Prefix || c.TTL != d.TTL || c.BackoffMax != d.BackoffMax {
		t.Fatalf("withDefaults = %+v", c)
	}
	// Set fields stay.
	c = Config{Region: "eu", ID: "a", Addr: ":1", TTL: 3 * time.Second, Prefix: "/x/"}.withDefaults()
	if c.TTL != 3*time.Second || c.Prefix != "/x/" {
		t.Fatalf("withDefaults overwrote set fields: %+v", c)
	}
}
