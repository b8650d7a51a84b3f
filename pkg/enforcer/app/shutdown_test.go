package app

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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
			cfg.Balancer.TLS = reportTLS(testenv.Certs(t, "", "us-east"), "us-east")
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
			// /readyz names the registry's trouble once (it said "registry: registry: …").
			var ready error
			if !poll(10*time.Second, func() bool { ready = a.Ready(); return ready != nil && strings.Contains(ready.Error(), "registry: ") }) {
				t.Fatalf("Ready with etcd %s: %v, want degraded naming the registry", how, ready)
			}
			if strings.Contains(ready.Error(), "registry: registry:") {
				t.Fatalf("Ready: %v, with a doubled prefix", ready)
			}
			t.Logf("Ready with etcd %s: %v", how, ready)
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

// TestRefusedEtcdRuleIsVisible (issue 28, item 4): an etcd rule the enforcer refuses is
// shown by /readyz (200, "degraded", naming the key and the field) and by the
// allot_rules_refused gauge the AllotEtcdRuleRefused alert reads, while a rule written
// after it applies.
func TestRefusedEtcdRuleIsVisible(t *testing.T) {
	testenv.Require(t)
	e := testenv.Etcd(t, 1)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(baseRules), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Region, cfg.ID = "us-east", "us-east-1"
	cfg.Etcd.Endpoints = e.Endpoints()
	cfg.Rules.File = filepath.Join(dir, "rules.yaml")
	cfg.Rules.EtcdPrefix = "/allot/rules/"
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	a, _ := start(t, cfg)
	if !poll(10*time.Second, func() bool { return a.Ready() == nil }) {
		t.Fatalf("not ready: %v", a.Ready())
	}
	cli := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/allot/rules/k1", `{"match":{"api_key":"k1"},"limits":[{"name":"s","rate":500,"per":"1s"}]}`); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/allot/rules/pro2", `{"match":{"plan":"pro2"},"limits":[{"name":"s","rate":50,"per":"1s"}]}`); err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + a.HTTPAddr() + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var code int
	var body string
	if !poll(5*time.Second, func() bool { code, body = get("/readyz"); return strings.Contains(body, "/allot/rules/k1") }) {
		t.Fatalf("/readyz: %d %q, want the refused key named", code, body)
	}
	if code != http.StatusOK || !strings.Contains(body, "degraded") || !strings.Contains(body, "expires_at") {
		t.Fatalf("/readyz: %d %q, want 200 degraded naming expires_at", code, body)
	}
	t.Logf("/readyz: %s", body)
	if _, m := get("/metrics"); !strings.Contains(m, `allot_rules_refused{source="etcd"} 1`) {
		t.Fatalf("metrics lack allot_rules_refused 1")
	}
	if !poll(5*time.Second, func() bool { return a.Rules().Current().Rule("pro2") != nil }) {
		t.Fatal("a rule written after the refused one did not apply")
	}
}
