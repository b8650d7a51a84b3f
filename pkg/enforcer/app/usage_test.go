package app

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/testenv"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
)

// leaderStub is a balancer leader that keeps the reports it is sent.
type leaderStub struct {
	allotv1.UnimplementedBalancerServer
	more chan struct{} // a report arrived since the last await looked (capacity 1)
	mu   sync.Mutex    // mu guards got
	got  []*allotv1.ReportRequest
}

// serveStub serves a leaderStub on a loopback port until the test ends.
func serveStub(t *testing.T) (*leaderStub, string) {
	t.Helper()
	stub := &leaderStub{more: make(chan struct{}, 1)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	allotv1.RegisterBalancerServer(srv, stub)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return stub, lis.Addr().String()
}

func (l *leaderStub) Report(_ context.Context, r *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
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

	stub, addr := serveStub(t)

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
	stub, addr := serveStub(t)
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
