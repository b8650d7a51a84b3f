package app

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/hashicorp/go-hclog"

	"github.com/allot-dev/allot/pkg/testenv"
	pollT "github.com/allot-dev/allot/pkg/testenv/poll"
)

// gatewayRateLimit is what Envoy Gateway generates for one rule of a BackendTrafficPolicy:
// n a minute per x-user-id on one route.
func gatewayRateLimit(name string, n uint32) *rlconf.RateLimitConfig {
	return &rlconf.RateLimitConfig{Name: name, Domain: "default/eg/http", Descriptors: []*rlconf.RateLimitDescriptor{{
		Key: "rule-0-match-0", Value: "rule-0-match-0",
		Descriptors: []*rlconf.RateLimitDescriptor{{Key: "x-user-id",
			RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_MINUTE, RequestsPerUnit: n}}},
	}}}
}

// An enforcer whose rules come over xDS follows the server: the first configuration
// before it is ready, each change, and never a broken one.
func TestRulesOverXDS(t *testing.T) {
	srv := testenv.StartXDS(t, "allot-test", "")
	srv.Set("1", gatewayRateLimit("default/eg/http", 3))
	cfg, err := Parse([]string{"-region", "us-east", "-rules-format", "envoy-ratelimit", "-rules-xds-server", srv.Addr(),
		"-rules-xds-node-id", "allot-test", "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0"}, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, cfg)
	if err := a.Ready(); err != nil {
		t.Fatalf("Ready after New: %v (New waits for the first configuration)", err)
	}
	cli := rlsv3.NewRateLimitServiceClient(dialT(t, a.GRPCAddr()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	user := 0
	admitted := func(n int) int {
		t.Helper()
		user++
		d := rlsDesc("rule-0-match-0", "rule-0-match-0", "x-user-id", "u"+strings.Repeat("x", user))
		ok := 0
		for range n {
			resp, err := cli.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	if got := admitted(5); got != 3 {
		t.Fatalf("3 a minute: %d admitted of 5", got)
	}

	// A change reaches the enforcer.
	srv.Set("2", gatewayRateLimit("default/eg/http", 6))
	pollT.True(t, 20*time.Second, "the second configuration", func() bool { return a.Rules().Current().Version() != "" && admitted(8) == 6 })

	// A broken resource (a unit beside unlimited) is NACKed and the rules in force stay.
	before := a.Rules().Current().Version()
	bad := gatewayRateLimit("default/eg/http", 2)
	bad.Descriptors[0].Descriptors[0].RateLimit.Unlimited = true
	srv.Set("3", bad)
	pollT.True(t, 20*time.Second, "the NACK", func() bool { return a.xds.src.Status().Rejected > 0 })
	if v := a.Rules().Current().Version(); v != before {
		t.Fatalf("rules changed to %s on a broken configuration", v)
	}
	if got := admitted(8); got != 6 {
		t.Fatalf("after a broken configuration: %d admitted of 8, want 6 (the last good)", got)
	}
	if err := a.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
	if st := a.file.Status(); st.Failures == 0 || st.LastError == nil || !strings.Contains(st.LastError.Error(), "unlimited") {
		t.Errorf("status %+v, want the NACK counted and named", st)
	}
}

// With no server answering, the enforcer starts (after the start timeout) but is not
// ready until a configuration arrives.
func TestRulesOverXDSNotReady(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules.Format, cfg.Rules.XDS.Server = "us-east", FormatEnvoy, addr
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Etcd.StartTimeout = 50 * time.Millisecond
	a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Error}))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Ready(); err != errNoXDSRules {
		t.Fatalf("Ready: %v, want %v", err, errNoXDSRules)
	}
}
