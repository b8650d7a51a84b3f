package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// envoyApp runs an App on the memory store whose rules are a copy of the shipped
// envoyproxy/ratelimit examples (configs/envoy-ratelimit/config), in format envoy-ratelimit.
func envoyApp(t *testing.T) (*App, string) {
	t.Helper()
	dir := t.TempDir()
	src := "../../../configs/envoy-ratelimit/config"
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := Parse([]string{"-region", "us-east", "-rules-format", "envoy-ratelimit", "-rules-dir", dir,
		"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-rules-poll-interval", "1h"}, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, cfg)
	return a, dir
}

func rlsDesc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// An enforcer whose rules are envoyproxy/ratelimit's README configuration, unchanged,
// answers Envoy's RLS requests as that README says, and reloads the directory with the
// guarantees of allot's own rules.
func TestEnvoyRateLimitDirectory(t *testing.T) {
	a, dir := envoyApp(t)
	cli := rlsv3.NewRateLimitServiceClient(dialT(t, a.GRPCAddr()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ask := func(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := cli.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	admitted := func(n int, domain string, ds ...*ratelimitv3.RateLimitDescriptor) int {
		t.Helper()
		ok := 0
		for range n {
			if ask(domain, ds...).OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	// The process runs on the wall clock: a per-second bucket refills while the requests
	// go out. perSecond checks that n requests admit the burst, and no more than what
	// refilled meanwhile.
	perSecond := func(name string, n, burst int, domain string, ds ...*ratelimitv3.RateLimitDescriptor) {
		t.Helper()
		start := time.Now()
		got := admitted(n, domain, ds...)
		most := burst + int(time.Since(start).Seconds()*float64(burst)) + 1
		if got < burst || got > min(most, n) {
			t.Errorf("%s: %d admitted of %d, want %d (up to %d with what refilled)", name, got, n, burst, most)
		}
	}
	// Example 2: 5 marketing messages a day to one number (and 100 to any number), each
	// number counted apart.
	for _, n := range []string{"2061111111", "2062222222"} {
		if got := admitted(7, "messaging", rlsDesc("message_type", "marketing", "to_number", n), rlsDesc("to_number", n)); got != 5 {
			t.Errorf("messaging to %s: %d admitted of 7, want 5", n, got)
		}
	}
	resp := ask("messaging", rlsDesc("message_type", "marketing", "to_number", "2061111111"), rlsDesc("to_number", "2061111111"))
	if st := resp.Statuses; st[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || st[1].Code != rlsv3.RateLimitResponse_OK ||
		!strings.HasSuffix(st[0].CurrentLimit.GetName(), "/day") || st[1].LimitRemaining != 100-8 {
		t.Errorf("messaging statuses %v", st)
	}
	// Example 3: 10 a second per address; 50.0.0.5 never.
	perSecond("50.0.0.1", 12, 10, "edge_proxy_per_ip", rlsDesc("remote_address", "50.0.0.1"))
	if got := admitted(3, "edge_proxy_per_ip", rlsDesc("remote_address", "50.0.0.5")); got != 0 {
		t.Errorf("50.0.0.5: %d admitted, want 0", got)
	}
	// Example 4: a request matches at its own depth only.
	if st := ask("example4", rlsDesc("key", "value")).Statuses[0]; st.CurrentLimit != nil {
		t.Errorf("example4 at depth 1: %v, want no limit", st)
	}
	// Example 5: unlimited.
	if got := admitted(50, "internal", rlsDesc("ldap", "x")); got != 50 {
		t.Errorf("ldap: %d admitted of 50", got)
	}
	// Example 6: user-a is in shadow mode, user-b is limited to 20.
	if got := admitted(25, "example6", rlsDesc("service", "auth", "user", "user-a")); got != 25 {
		t.Errorf("shadow user-a: %d admitted of 25", got)
	}
	perSecond("user-b", 25, 20, "example6", rlsDesc("service", "auth", "user", "user-b"))
	// Example 7: with both descriptors, the 5 a second limit is replaced by the 10.
	perSecond("example7, both descriptors", 12, 10, "example7", rlsDesc("key_1", "value_1", "user", "bkthomps"), rlsDesc("key_2", "value_2", "user", "bkthomps"))

	// A broken file never replaces the rules in force; the error names file and line.
	path := filepath.Join(dir, "edge_proxy_per_ip.yaml")
	os.WriteFile(path, []byte("domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n"), 0o644)
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), path+":4: 'requests_per_unit': 1.5 is a float") {
		t.Fatalf("Reload of a broken file: %v", err)
	}
	perSecond("after a refused reload, 50.0.0.2 (the old limit)", 12, 10, "edge_proxy_per_ip", rlsDesc("remote_address", "50.0.0.2"))
	// A good change goes in.
	os.WriteFile(path, []byte("domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 3}\n"), 0o644)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	perSecond("after a good reload, 50.0.0.3", 5, 3, "edge_proxy_per_ip", rlsDesc("remote_address", "50.0.0.3"))
	if got := admitted(3, "edge_proxy_per_ip", rlsDesc("remote_address", "50.0.0.5")); got != 3 {
		t.Errorf("the blocked address's line is gone: %d admitted of 3", got)
	}
}

func TestEnvoyRulesConfig(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-rules-format", "envoy-ratelimit"}, "rules.format envoy-ratelimit needs rules.dir"},
		{[]string{"-rules-format", "envoy-ratelimit", "-rules-dir", "d", "-rules-file", "f"}, "reads rules.dir only"},
		{[]string{"-rules-file", "f", "-rules-dir", "d"}, "rules.dir, rules.xds and rules.merge_domains are for rules.format envoy-ratelimit"},
		{[]string{"-rules-format", "lyft", "-rules-dir", "d"}, `rules.format "lyft", want allot or envoy-ratelimit`},
	} {
		_, err := Parse(append([]string{"-region", "r"}, tc.args...), env(nil), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want %q", tc.args, err, tc.want)
		}
	}
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules.Format, cfg.Rules.Dir = "us-east", FormatEnvoy, filepath.Join(t.TempDir(), "missing")
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "rules dir (envoy-ratelimit)") {
		t.Fatalf("a missing directory: %v", err)
	}
}
