package app

import (
	"io"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/tlsfiles"
)

// The aggregate section is checked whole: its region must be one of regions, and the
// upstream connection must carry the region's certificate (the leader believes members
// only from it); no rules are needed to aggregate.
func TestAggregateConfigValidate(t *testing.T) {
	base, err := Parse([]string{"-config", configFile}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	up := tlsfiles.Client{Enabled: true, CAFile: "ca.pem", CertFile: "us-east.pem", KeyFile: "us-east-key.pem"}
	for _, c := range []struct {
		ag   AggregateConfig
		want string
	}{
		{AggregateConfig{Region: "mars", UpstreamTLS: up}, `aggregate.region "mars" is not one of regions`},
		{AggregateConfig{Region: "us-east"}, "aggregate.upstream_tls"},
		{AggregateConfig{Region: "us-east", UpstreamTLS: up, MaxMembers: -1}, "max_members -1"},
		{AggregateConfig{Region: "us-east", UpstreamTLS: up, UpstreamAddrs: []string{"127.0.0.1:7000", "127.0.0.1"}}, `aggregate.upstream_addrs[1]: "127.0.0.1" is not host:port`},
	} {
		cfg := base
		cfg.Aggregate = c.ag
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.ag, err, c.want)
		}
	}
	cfg := base
	cfg.Aggregate = AggregateConfig{Region: "us-east", UpstreamTLS: up, UpstreamAddrs: []string{"127.0.0.1:7000"}}
	cfg.Rules.File, cfg.Rules.EtcdPrefix = "", ""
	if err := cfg.Validate(); err != nil {
		t.Errorf("a valid aggregate section without rules: %v", err)
	}
}
