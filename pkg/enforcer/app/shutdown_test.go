package app

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/hashicorp/go-hclog"
)

// TestShutdownBoundedWithEtcdGone (issue 28, item 2): an enforcer registered in etcd,
// watching rules and shares and reporting to a balancer, loses etcd and is told to stop:
// Close returns within its bound (drain_timeout plus the registry's and reporter's etcd
// calls' own bounds), not when etcd comes back.
func TestShutdownBoundedWithEtcdGone(t *testing.T) {
	for _, how := range []string{"stopped", "paused"} {
		t.Run(how, func(t *testing.T) {
			testenv.Require(t)
			e := testenv.Etcd(t, 1)
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(baseRules), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.Region, cfg.ID = "us-east", "us-east-1"
			cfg.Etcd.Endpoints = e.Endpoints()
			cfg.Etcd.RegistrationTTL = 2 * time.Second
			cfg.Rules.File = filepath.Join(dir, "rules.yaml")
			cfg.Rules.EtcdPrefix = "/allot/rules/"
			cfg.Balancer.Enabled = true
			cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
			cfg.DrainTimeout = time.Second
			a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Info}))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- a.Run(context.Background()) }()
			if !poll(10*time.Second, func() bool { return a.Ready() == nil }) {
				t.Fatal("not ready within 10s")
			}
			if how == "stopped" {
				e.Members[0].Stop(t)
			} else {
				e.Members[0].Pause(t)
				t.Cleanup(func() { e.Members[0].Unpause(t) })
			}
			const bound = 10 * time.Second
			began := time.Now()
			closed := make(chan struct{})
			go func() { defer close(closed); _ = a.Close() }()
			select {
			case <-closed:
				t.Logf("closed in %v with etcd %s", time.Since(began).Round(time.Millisecond), how)
			case <-time.After(bound):
				t.Fatalf("Close did not return within %v with etcd %s", bound, how)
			}
			<-done
		})
	}
}
