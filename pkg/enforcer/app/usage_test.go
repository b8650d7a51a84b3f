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
	mu  sync.Mutex // mu guards got
	got []*allotv1.ReportRequest
}

func (l *leaderStub) Report(_ context.Context, r *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, r)
	return &allotv1.ReportResponse{Accepted: true}, nil
}

// TestUsageReportsReachTheLeader: with balancer.enabled an enforcer finds the leader
// through the election key in real etcd and reports the identities it checked, with the
// share version it applies.
func TestUsageReportsReachTheLeader(t *testing.T) {
	testenv.Require(t)
	etcd := testenv.Etcd(t, 1)
	cli := etcd.Client(t)

	stub := &leaderStub{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	allotv1.RegisterBalancerServer(srv, stub)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	const prefix = "/usage-test/election"
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := concurrency.NewElection(sess, prefix).Campaign(ctx, lis.Addr().String()); err != nil {
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

	deadline := time.Now().Add(10 * time.Second)
	for {
		stub.mu.Lock()
		var found *allotv1.IdentityUsage
		var rep *allotv1.ReportRequest
		for _, r := range stub.got {
			for _, u := range r.Usage {
				if u.Identity == "key:k_busy" {
					found, rep = u, r
				}
			}
		}
		stub.mu.Unlock()
		if found != nil {
			if rep.Region != "us-east" || rep.EnforcerId != "us-east-1" {
				t.Fatalf("report from %q/%q, want us-east/us-east-1", rep.Region, rep.EnforcerId)
			}
			if found.Admitted != 10 || found.Refused != 20 || found.Rule != "default" {
				t.Fatalf("usage %+v, want rule default, 10 admitted, 20 refused", found)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no report with key:k_busy reached the leader within 10 s")
		}
		time.Sleep(50 * time.Millisecond) // bounded poll of a real network path
	}
}

// TestUsageReportsToBalancerAddrs: with balancer.addrs the enforcer needs no etcd to find
// the balancer: its reports go to the listed replica that accepts (past a dead one).
func TestUsageReportsToBalancerAddrs(t *testing.T) {
	stub := &leaderStub{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	allotv1.RegisterBalancerServer(srv, stub)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
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
	cfg.Balancer.Addrs = []string{dead, lis.Addr().String()}
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		stub.mu.Lock()
		found := false
		for _, r := range stub.got {
			for _, u := range r.Usage {
				found = found || (u.Identity == "key:k_listed" && r.Region == "eu-west")
			}
		}
		stub.mu.Unlock()
		if found {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no report with key:k_listed reached the listed balancer within 10 s")
		}
		time.Sleep(50 * time.Millisecond) // bounded poll of a real network path
	}
}
