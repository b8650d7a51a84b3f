package app

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const baseRules = `
rules:
  - id: default
    limits: [{name: minute, rate: 1, per: 1m, burst: 2}]
  - id: roomy
    match: {plan: roomy}
    limits: [{name: second, rate: 100000, per: 1s}]
  - id: login
    match: {endpoint: "POST /v1/login"}
    by: ip
    fail_mode: closed
    limits: [{name: minute, rate: 600, per: 1m, burst: 100}]
  - id: org-shadow
    mode: shadow
    by: org
    limits: [{name: minute, rate: 1, per: 1m, burst: 1}]
`

// stack is one region's real infrastructure: a 3-master Redis Cluster and etcd.
type stack struct {
	cluster *testenv.Cluster
	etcd    *testenv.EtcdCluster
	cli     *clientv3.Client
	dir     string
	tag     string // keeps this test's Redis keys and etcd keys apart
}

func newStack(t *testing.T) *stack {
	testenv.Require(t)
	s := &stack{
		cluster: testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3}),
		etcd:    testenv.Etcd(t, 1),
		dir:     t.TempDir(),
		tag:     fmt.Sprintf("t%d", rand.Uint32()),
	}
	s.cli = s.etcd.Client(t)
	if err := os.WriteFile(filepath.Join(s.dir, "rules.yaml"), []byte(baseRules), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *stack) config(region, id string) Config {
	cfg := DefaultConfig()
	cfg.Region, cfg.ID = region, id
	cfg.Store.Kind, cfg.Store.Addrs, cfg.Store.KeyPrefix = "redis-cluster", s.cluster.Addrs(), s.tag+":"
	cfg.Etcd.Endpoints = s.etcd.Endpoints()
	cfg.Etcd.RegistryPrefix = "/" + s.tag + "/enforcers/"
	cfg.Etcd.RegistrationTTL = 2 * time.Second
	cfg.Rules.File = filepath.Join(s.dir, "rules.yaml")
	cfg.Rules.EtcdPrefix = "/" + s.tag + "/rules/"
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Fallback.Timeout = 100 * time.Millisecond // a loaded 2-core test machine under -race
	cfg.DrainTimeout = 5 * time.Second
	return cfg
}

// start runs an App until cleanup (or until the returned stop is called).
func start(t *testing.T, cfg Config) (*App, func()) {
	t.Helper()
	a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		a.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return a, stop
}

// poll calls f every 10 ms until it returns true or d passes; it reports whether f did.
func poll(d time.Duration, f func() bool) bool {
	end := time.Now().Add(d)
	for {
		if f() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var (
	policyRE  = regexp.MustCompile(`^"default/minute";q=2;w=120$`)
	currentRE = regexp.MustCompile(`^"default/minute";r=(\d+);t=(\d+)$`)
)

func TestIntegration(t *testing.T) {
	s := newStack(t)
	a, _ := start(t, s.config("us-east", "e1"))
	cc := dialT(t, a.GRPCAddr())
	rls := rlsv3.NewRateLimitServiceClient(cc)
	allot := allotv1.NewAllotClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("EnvoyRLS", func(t *testing.T) {
		req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k-rls"}, {Key: "remote_address", Value: "192.0.2.1"}},
		}}}
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			resp, err := rls.ShouldRateLimit(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			h := map[string]string{}
			for _, hv := range resp.ResponseHeadersToAdd {
				h[hv.Key] = hv.Value
			}
			if resp.OverallCode != want || resp.Statuses[0].Code != want {
				t.Fatalf("call %d: %v, want %v", i, resp, want)
			}
			m := currentRE.FindStringSubmatch(h["RateLimit"])
			if !policyRE.MatchString(h["RateLimit-Policy"]) || m == nil || m[1] != fmt.Sprint(max(1-i, 0)) {
				t.Fatalf("call %d headers %v", i, h)
			}
			if want == rlsv3.RateLimitResponse_OVER_LIMIT && (h["Retry-After"] == "" || h["X-RateLimit-Rule"] != "default") {
				t.Fatalf("refusal headers %v", h)
			}
		}
		r, err := allot.Check(ctx, &allotv1.CheckRequest{ApiKey: "k-rls-2"})
		if err != nil || !r.Allowed || r.Source != allotv1.Source_SOURCE_REDIS {
			t.Fatalf("allot.v1: %v %v, want allowed from redis", r, err)
		}
	})

	t.Run("HTTP", func(t *testing.T) {
		for i, want := range []int{200, 200, 429} {
			code, out, h := httpCheck(t, a.HTTPAddr(), `{"api_key":"k-http","ip":"2001:db8::1"}`)
			if code != want || out["rule"] != "default" || !policyRE.MatchString(h.Get("RateLimit-Policy")) || currentRE.FindString(h.Get("RateLimit")) == "" {
				t.Fatalf("check %d: %d %v %v", i, code, out, h)
			}
			if want == 429 && (h.Get("Retry-After") == "" || h.Get("X-RateLimit-Rule") != "default") {
				t.Fatalf("refusal headers %v", h)
			}
		}
		for i, want := range []int{200, 200, 429} {
			req, _ := http.NewRequest("GET", "http://"+a.HTTPAddr()+"/v1/auth", nil)
			req.Header.Set("X-Api-Key", "k-auth")
			req.Header.Set("X-Forwarded-Method", "GET")
			req.Header.Set("X-Forwarded-Uri", "/v1/items")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want || resp.Header.Get("RateLimit") == "" {
				t.Fatalf("auth %d: %d %v", i, resp.StatusCode, resp.Header)
			}
		}
		resp, err := http.Get("http://" + a.HTTPAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("readyz %d %s", resp.StatusCode, b)
		}
		resp, err = http.Get("http://" + a.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, re := range []string{`allot_redis_calls_total [1-9]`, `allot_registry_peers 1`, `allot_registry_healthy 1`,
			`allot_enforcer_decisions_total\{result="allowed",source="redis"\} [1-9]`, `allot_enforcer_decisions_total\{result="refused",source="(redis|refusal-cache)"\} [1-9]`, `allot_lease_table_keys`, `allot_fallback_local_keys 0`} {
			if !regexp.MustCompile(re).Match(b) {
				t.Errorf("metrics lack %s", re)
			}
		}
	})

	t.Run("ShadowNeverRefuses", func(t *testing.T) {
		for i := 0; i < 20; i++ {
			r, err := allot.Check(ctx, &allotv1.CheckRequest{ApiKey: fmt.Sprintf("k-shadow-%d", i%3), Plan: "roomy", Org: "o-shadow"})
			if err != nil || !r.Allowed {
				t.Fatalf("check %d: %v %v, want allowed", i, r, err)
			}
			if i > 0 && (len(r.ShadowRefused) != 1 || r.ShadowRefused[0] != "org-shadow") {
				t.Fatalf("check %d: shadow refused %v, want [org-shadow]", i, r.ShadowRefused)
			}
		}
	})

	t.Run("EtcdRuleWithin1sAndOverrideExpiresOnTime", func(t *testing.T) {
		exp := time.Now().Add(4 * time.Second).Truncate(time.Second)
		rule := fmt.Sprintf(`{"id": "etcd-override", "match": {"api_key": "k-etcd"}, "expires_at": %q, "limits": [{"name": "second", "rate": 1000, "per": "1s"}]}`, exp.UTC().Format(time.RFC3339))
		put := time.Now()
		if _, err := s.cli.Put(ctx, "/"+s.tag+"/rules/etcd-override", rule); err != nil {
			t.Fatal(err)
		}
		var seen time.Duration
		if !poll(time.Second, func() bool {
			r, err := allot.Check(ctx, &allotv1.CheckRequest{ApiKey: "k-etcd"})
			seen = time.Since(put)
			return err == nil && r.Rule == "etcd-override"
		}) {
			t.Fatalf("rule written to etcd not enforced within 1s")
		}
		t.Logf("rule change enforced %v after the etcd put", seen.Round(time.Millisecond))
		time.Sleep(time.Until(exp.Add(-300 * time.Millisecond)))
		if r, err := allot.Check(ctx, &allotv1.CheckRequest{ApiKey: "k-etcd"}); err != nil || r.Rule != "etcd-override" {
			t.Fatalf("300ms before expiry: %v %v, want etcd-override", r, err)
		}
		time.Sleep(time.Until(exp))
		r, err := allot.Check(ctx, &allotv1.CheckRequest{ApiKey: "k-etcd"})
		late := time.Since(exp)
		if err != nil || r.Rule != "default" {
			t.Fatalf("%v after expiry: %v %v, want default", late, r, err)
		}
		t.Logf("override gone %v after its expires_at (first check after it)", late.Round(time.Millisecond))
	})

	t.Run("ReloadGivesTheRunningEtcdSourceANewBase", func(t *testing.T) {
		a.mu.Lock()
		src := a.etcdSrc
		a.mu.Unlock()
		path := filepath.Join(s.dir, "rules.yaml")
		extra := baseRules + "  - id: reloaded\n    match: {plan: reloaded}\n    limits: [{name: second, rate: 5, per: 1s}]\n"
		if err := os.WriteFile(path, []byte(extra), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.WriteFile(path, []byte(baseRules), 0o644); a.Reload() })
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
		if r, err := allot.Check(ctx, &allotv1.CheckRequest{ApiKey: "k-reload", Plan: "reloaded"}); err != nil || r.Rule != "reloaded" {
			t.Fatalf("after Reload: %v %v, want the new base rule", r, err)
		}
		if r, err := allot.Check(ctx, &allotv1.CheckRequest{ApiKey: "k-etcd"}); err != nil || r.Rule == "" {
			t.Fatalf("after Reload the etcd rules are gone: %v %v", r, err)
		}
		a.mu.Lock()
		same := a.etcdSrc == src
		a.mu.Unlock()
		if !same {
			t.Fatal("Reload replaced the etcd source; it should give the running one a new base")
		}
	})

	t.Run("BadRuleRefusedOldKeepsServing", func(t *testing.T) {
		before := a.Rules().Current().Version()
		if _, err := s.cli.Put(ctx, "/"+s.tag+"/rules/broken", `{"id": "broken", "limits": [{"name": "s", "rate": -5, "per": "1s"}]}`); err != nil {
			t.Fatal(err)
		}
		a.mu.Lock()
		src := a.etcdSrc
		a.mu.Unlock()
		if !poll(5*time.Second, func() bool { // refused alone (issue 28): listed, not LastError
			st := src.Status()
			return len(st.Refused) == 1 && strings.Contains(st.Refused[0].Err.Error(), "broken")
		}) {
			t.Fatalf("bad rule not reported: %+v", src.Status())
		}
		if v := a.Rules().Current().Version(); v != before {
			t.Fatalf("version moved from %s to %s on a bad rule", before, v)
		}
		if r, err := allot.Check(ctx, &allotv1.CheckRequest{ApiKey: "k-after-bad"}); err != nil || r.Rule != "default" || !r.Allowed {
			t.Fatalf("after a bad rule: %v %v", r, err)
		}
		if _, err := s.cli.Delete(ctx, "/"+s.tag+"/rules/broken"); err != nil {
			t.Fatal(err)
		}
		if !poll(5*time.Second, func() bool { st := src.Status(); return st.LastError == nil && len(st.Refused) == 0 }) {
			t.Fatalf("still failing after the bad rule was deleted: %+v", src.Status())
		}
	})

	t.Run("PeersAndRegistrationReleased", func(t *testing.T) {
		b, stopB := start(t, s.config("us-east", "e2"))
		other, _ := start(t, s.config("eu-west", "w1"))
		if !poll(5*time.Second, func() bool { return a.peers() == 2 && b.peers() == 2 && other.peers() == 1 }) {
			t.Fatalf("peers: a %d b %d other %d, want 2 2 1", a.peers(), b.peers(), other.peers())
		}
		stopB()
		start := time.Now()
		if !poll(3*time.Second, func() bool { return a.peers() == 1 }) {
			t.Fatalf("peers still %d after e2 shut down", a.peers())
		}
		t.Logf("registration released %v after shutdown", time.Since(start).Round(time.Millisecond))
	})

	// Last: it pauses a Redis master.
	t.Run("FailClosedDuringRedisOutage", func(t *testing.T) {
		const ip = "198.51.100.7"
		victim := s.cluster.MasterFor(a.redisStore.Key("ip:"+ip, "login/minute"))
		openKey := ""
		for i := 0; i < 10000 && openKey == ""; i++ {
			k := fmt.Sprintf("k-open-%d", i)
			if s.cluster.MasterFor(a.redisStore.Key("key:"+k, "roomy/second")) == victim {
				openKey = k
			}
		}
		// Keyless, so the rules counted by api_key count it by its IP too: plan roomy
		// keeps the tight default rule from refusing it first.
		login := &allotv1.CheckRequest{Ip: ip, Endpoint: "POST /v1/login", Plan: "roomy"}
		if r, err := allot.Check(ctx, login); err != nil || !r.Allowed || r.Source != allotv1.Source_SOURCE_REDIS {
			t.Fatalf("before the outage: %v %v", r, err)
		}
		victim.Pause(t)
		paused := true
		t.Cleanup(func() {
			if paused {
				victim.Unpause(t)
			}
		})
		for i := 0; i < 10; i++ {
			r, err := allot.Check(ctx, login)
			if err != nil || r.Allowed || r.Rule != "login" || r.Source != allotv1.Source_SOURCE_FAIL_CLOSED {
				t.Fatalf("login check %d during the outage: %v %v, want refused fail-closed by login", i, r, err)
			}
			r, err = allot.Check(ctx, &allotv1.CheckRequest{ApiKey: openKey, Plan: "roomy"})
			if err != nil || !r.Allowed || r.Source != allotv1.Source_SOURCE_FALLBACK {
				t.Fatalf("fail-open check %d during the outage: %v %v, want allowed from fallback", i, r, err)
			}
		}
		resp, err := http.Get("http://" + a.HTTPAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// Still in rotation: the fallback layer answers (P2); /readyz names the degraded store.
		if resp.StatusCode != 200 || !strings.Contains(string(body), "degraded") || !strings.Contains(string(body), "store") {
			t.Errorf("readyz during the outage: %d %q, want 200 naming the degraded store", resp.StatusCode, body)
		}
		victim.Unpause(t)
		paused = false
		if !poll(10*time.Second, func() bool {
			r, err := allot.Check(ctx, login)
			return err == nil && r.Allowed && r.Source == allotv1.Source_SOURCE_REDIS
		}) {
			t.Fatalf("login not served from redis again after the outage")
		}
	})
}
