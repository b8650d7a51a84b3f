package app

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/tlsfiles"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// leaderStub is a balancer leader that keeps the reports it is sent.
type leaderStub struct {
	allotv1.UnimplementedBalancerServer
	more chan struct{} // a report arrived since the last await looked (capacity 1)
	mu   sync.Mutex    // mu guards got
	got  []*allotv1.ReportRequest
}

// serveStub serves a leaderStub on a loopback port until the test ends.
func serveStub(t *testing.T, f certs.Files) (*leaderStub, string) {
	t.Helper()
	stub := &leaderStub{more: make(chan struct{}, 1)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tlsfiles.Server{Enabled: true, CertFile: f.Balancer(), KeyFile: f.BalancerKey(), ClientCAFile: f.CA()}.Build()
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)))
	allotv1.RegisterBalancerServer(srv, stub)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return stub, lis.Addr().String()
}

// reportTLS is the enforcer's balancer.tls with region's certificate under f.
func reportTLS(f certs.Files, region string) TLSConfig {
	return TLSConfig{Enabled: true, CAFile: f.CA(), CertFile: f.Enforcer(region), KeyFile: f.EnforcerKey(region)}
}

// Report takes what comes over mutual TLS from a certificate naming the report's region
// (as the balancer does), and refuses the rest.
func (l *leaderStub) Report(ctx context.Context, r *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	p, _ := peer.FromContext(ctx)
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, status.Error(codes.PermissionDenied, "stub: not TLS")
	}
	if region, err := certs.RegionOfState(ti.State); err != nil || region != r.GetRegion() {
		return nil, status.Errorf(codes.PermissionDenied, "stub: certificate region %q (%v), report region %q", region, err, r.GetRegion())
	}
	l.mu.Lock()
	l.got = append(l.got, r)
	l.mu.Unlock()
	select {
	case l.more <- struct{}{}:
	default: // a signal is pending already
	}
	return &allotv1.ReportResponse{Accepted: true}, nil
}

// await returns the first report usage that match accepts, waiting for reports to arrive
// (no polling: each report signals); it fails the test after within.
func (l *leaderStub) await(t *testing.T, within time.Duration, what string, match func(*allotv1.ReportRequest, *allotv1.IdentityUsage) bool) (*allotv1.ReportRequest, *allotv1.IdentityUsage) {
	t.Helper()
	deadline := time.After(within)
	for {
		l.mu.Lock()
		for _, r := range l.got {
			for _, u := range r.Usage {
				if match(r, u) {
					l.mu.Unlock()
					return r, u
				}
			}
		}
		l.mu.Unlock()
		select {
		case <-l.more:
		case <-deadline:
			t.Fatalf("no report with %s within %v", what, within)
		}
	}
}

// TestUsageReportsReachTheLeader: with balancer.enabled an enforcer finds the leader
// through the election key in real etcd and reports the identities it checked, with the
// share version it applies.
func TestUsageReportsReachTheLeader(t *testing.T) {
	testenv.Require(t)
	etcd := testenv.Etcd(t, 1)
	cli := etcd.Client(t)

	f := testenv.Certs(t, "", "us-east")
	stub, addr := serveStub(t, f)

	const prefix = "/usage-test/election"
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := concurrency.NewElection(sess, prefix).Campaign(ctx, addr); err != nil {
		t.Fatal(err)
	}

	cfg := DefaultConfig()
	cfg.Region, cfg.ID = "us-east", "us-east-1"
	cfg.Store.Kind = "memory"
	cfg.Etcd.Endpoints = etcd.Endpoints()
	cfg.Etcd.RegistryPrefix = "/usage-test/enforcers/"
	cfg.Rules.File = filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(cfg.Rules.File, []byte("rules:\n  - id: default\n    limits: [{name: second, rate: 10, per: 1s}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Balancer.Enabled, cfg.Balancer.ElectionPrefix, cfg.Balancer.Interval = true, prefix, time.Second
	cfg.Balancer.TLS = reportTLS(f, "us-east")
	a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	for range 30 {
		if _, err := a.Enforcer().Check(ctx, &enforcer.Request{Attrs: rules.Attrs{APIKey: "k_busy"}}); err != nil {
			t.Fatal(err)
		}
	}

	rep, found := stub.await(t, 10*time.Second, "key:k_busy reaching the leader", func(_ *allotv1.ReportRequest, u *allotv1.IdentityUsage) bool {
		return u.Identity == "key:k_busy"
	})
	if rep.Region != "us-east" || rep.EnforcerId != "us-east-1" {
		t.Fatalf("report from %q/%q, want us-east/us-east-1", rep.Region, rep.EnforcerId)
	}
	if found.Admitted != 10 || found.Refused != 20 || found.Rule != "default" {
		t.Fatalf("usage %+v, want rule default, 10 admitted, 20 refused", found)
	}
}

// TestUsageReportsToBalancerAddrs: with balancer.addrs the enforcer needs no etcd to find
// the balancer: its reports go to the listed replica that accepts (past a dead one).
func TestUsageReportsToBalancerAddrs(t *testing.T) {
	f := testenv.Certs(t, "", "eu-west")
	stub, addr := serveStub(t, f)
	deadLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := deadLis.Addr().String()
	_ = deadLis.Close()

	cfg := DefaultConfig()
	cfg.Region, cfg.ID = "eu-west", "eu-west-1"
	cfg.Rules.File = filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(cfg.Rules.File, []byte("rules:\n  - id: default\n    limits: [{name: second, rate: 10, per: 1s}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Balancer.Enabled, cfg.Balancer.Interval = true, time.Second
	cfg.Balancer.Addrs = []string{dead, addr}
	cfg.Balancer.TLS = reportTLS(f, "eu-west")
	a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Enforcer().Check(ctx, &enforcer.Request{Attrs: rules.Attrs{APIKey: "k_listed"}}); err != nil {
		t.Fatal(err)
	}
	stub.await(t, 10*time.Second, "key:k_listed reaching the listed balancer", func(r *allotv1.ReportRequest, u *allotv1.IdentityUsage) bool {
		return u.Identity == "key:k_listed" && r.Region == "eu-west"
	})
}
