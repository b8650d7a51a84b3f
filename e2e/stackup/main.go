// Command stackup brings up the e2e stack (e2e/stack: three regions of Redis Cluster and
// enforcers, a 3-member etcd, two balancer replicas, nginx in front of us-east, Toxiproxy
// links with cross-region latency) for a user on one machine, prints how to reach every part, and keeps it up
// until SIGINT or SIGTERM, then removes it. `make stack-up` runs it; `make stack-down`
// removes a stack whose stackup process was killed.
//
// Everything listens on 127.0.0.1 (host networking); the addresses are printed and
// written to bin/stack.env as shell variables.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/allot-dev/allot/e2e/stack"
)

func main() {
	testing.Init() // testenv asks testing.Short()
	replicas := flag.Int("replicas", 0, "Redis replicas per master in every region (1 for failover drills by hand)")
	enforcers := flag.Int("enforcers", 2, "enforcers per region")
	balancers := flag.Int("balancers", 2, "balancer replicas (in us-east)")
	env := flag.String("env", "bin/stack.env", "file to write the addresses to (shell variables)")
	flag.Parse()
	// The harness's containers expire after their TTL; a stack for a user lives longer.
	if os.Getenv("ALLOT_TEST_CONTAINER_TTL") == "" {
		os.Setenv("ALLOT_TEST_CONTAINER_TTL", "12h")
	}

	tb := &upTB{}
	defer tb.cleanup()
	opt := stack.DefaultOptions()
	opt.Gateway = true
	opt.Balancers = *balancers
	for i := range opt.Regions {
		opt.Regions[i].Replicas = *replicas
		opt.Regions[i].Enforcers = *enforcers
	}
	ok := tb.run(func() {
		s := stack.Start(tb, opt)
		vars := describe(s)
		if err := os.MkdirAll(filepath.Dir(*env), 0o755); err == nil {
			_ = os.WriteFile(*env, []byte(vars), 0o644)
			fmt.Printf("\n(the same as shell variables in %s: `. %s`)\n", *env, *env)
		}
	})
	if !ok {
		tb.cleanup()
		os.Exit(1)
	}
	pidFile := filepath.Join(filepath.Dir(*env), "stack.pid")
	_ = os.WriteFile(pidFile, []byte(fmt.Sprintln(os.Getpid())), 0o644)
	defer func() { tb.cleanup(); os.Remove(pidFile); os.Remove(*env) }() // the files go once the stack has
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	fmt.Println("\nstack up; Ctrl-C (or make stack-down) removes it.")
	<-sig
	fmt.Println("stack: removing…")
}

// describe prints how to reach the stack and returns the same as shell variables.
func describe(s *stack.Stack) string {
	var vars strings.Builder
	fmt.Println("\n== allot stack (everything on 127.0.0.1) ==")
	fmt.Printf("etcd (in us-east):       %s\n", strings.Join(s.Etcd.Endpoints(), ","))
	fmt.Fprintf(&vars, "ALLOT_STACK_ETCD=%s\n", strings.Join(s.Etcd.Endpoints(), ","))
	for _, r := range s.Regions {
		up := strings.ToUpper(strings.ReplaceAll(r.Name, "-", "_"))
		fmt.Printf("\n%s\n  redis cluster:         %s\n  etcd as seen from here: %s\n", r.Name, strings.Join(r.Redis.Addrs(), ","), strings.Join(r.EtcdEndpoints, ","))
		fmt.Fprintf(&vars, "ALLOT_STACK_%s_REDIS=%s\nALLOT_STACK_%s_ETCD=%s\n", up, strings.Join(r.Redis.Addrs(), ","), up, strings.Join(r.EtcdEndpoints, ","))
		if len(r.BalancerAddrs) > 0 {
			fmt.Printf("  balancer as seen from here (its enforcers' balancer.addrs): %s\n", strings.Join(r.BalancerAddrs, ","))
		}
		var grpcs, https []string
		for _, e := range r.Enforcers {
			fmt.Printf("  enforcer %-11s  gRPC %s  HTTP %s  (metrics http://%s/metrics)\n", e.ID, e.GRPC, e.HTTP, e.HTTP)
			grpcs, https = append(grpcs, e.GRPC), append(https, e.HTTP)
		}
		fmt.Fprintf(&vars, "ALLOT_STACK_%s_GRPC=%s\nALLOT_STACK_%s_HTTP=%s\n", up, strings.Join(grpcs, ","), up, strings.Join(https, ","))
	}
	for _, b := range s.Balancers {
		fmt.Printf("\nbalancer %s (us-east): reports gRPC %s, dashboard http://%s/dashboard/, metrics http://%s/metrics", b.ID, b.GRPC, b.HTTP, b.HTTP)
		fmt.Fprintf(&vars, "ALLOT_STACK_BALANCER_%s=%s\n", strings.ToUpper(strings.ReplaceAll(b.ID, "-", "_")), b.HTTP)
	}
	if len(s.Balancers) > 0 {
		fmt.Println()
		fmt.Printf("  (the dashboards mask customers' identities: a balancer's dashboard.tokens_file or admin tokens, opened with ?token=, show them)\n")
		fmt.Printf("\nusage reports: mutual TLS; the CA and each region's enforcer certificate are in %s\n", s.Certs.Dir)
		fmt.Printf("  (an enforcer of your own: -balancer-tls -balancer-tls-ca %s -balancer-tls-cert %s -balancer-tls-key %s)\n",
			s.Certs.CA(), s.Certs.Enforcer(s.Regions[0].Name), s.Certs.EnforcerKey(s.Regions[0].Name))
		fmt.Fprintf(&vars, "ALLOT_STACK_CERTS=%s\n", s.Certs.Dir)
	}
	first := s.Regions[0].Enforcers[0]
	fmt.Printf("\nnginx gateway (README auth_request snippet) in front of us-east: http://%s/\n", s.Gateway.Addr)
	fmt.Fprintf(&vars, "ALLOT_STACK_GATEWAY=%s\n", s.Gateway.Addr)
	fmt.Printf(`
Try it:
  curl -si -H 'X-Api-Key: k1' http://%[1]s/v1/items          # through nginx: 200 with RateLimit fields, 429 when over
  curl -si -X POST %[2]s/v1/check -d '{"api_key":"k1","plan":"pro","endpoint":"GET /v1/search"}'
  etcdctl --endpoints %[3]s put /allot/rules/my-rule \
    '{"match":{"plan":"pro"},"limits":[{"name":"second","rate":10,"per":"1s"}]}'   # a live rule, every region

Point a gateway at a region: Envoy's rate limit filter → any enforcer's gRPC address above;
nginx/Traefik forward auth → http://<enforcer HTTP>/v1/auth (cmd/enforcer/README.md).
Drive it with regionsim's live mode (key drill-shift is the stack's rule of that plan;
the balancer here runs the shipped 10 s interval, the scenario was written for 2 s):
  %[4]s
`, s.Gateway.Addr, first.HTTP, s.Etcd.Endpoints()[0], liveCommand(liveTargets(s)))
	return vars.String()
}

// liveCommand is the regionsim command that drives the stack, quoted for a POSIX shell:
// -targets holds '|' between a region's addresses, which a shell would take for a pipe.
func liveCommand(targets string) string {
	return "go run ./cmd/regionsim run -mode live -scenario configs/scenarios/stack-shift.yaml \\\n    -targets " + shellQuote(targets)
}

// shellQuote quotes s for a POSIX shell: in single quotes, each ' inside closed, escaped and reopened.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// liveTargets is regionsim's -targets for the stack: region=grpc|grpc,...
func liveTargets(s *stack.Stack) string {
	var parts []string
	for _, r := range s.Regions {
		var addrs []string
		for _, e := range r.Enforcers {
			addrs = append(addrs, e.GRPC)
		}
		parts = append(parts, r.Name+"="+strings.Join(addrs, "|"))
	}
	return strings.Join(parts, ",")
}

// upTB is the testing.TB the harness needs, outside a test: logs to stderr, cleanups run
// at the end in reverse order, Fatal ends the goroutine (run reports it).
type upTB struct {
	testing.TB // not set: only the methods below are called by the harness

	mu       sync.Mutex // mu guards cleanups, failed
	cleanups []func()
	failed   bool
}

func (u *upTB) run(f func()) bool {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	<-done
	return !u.Failed()
}

func (u *upTB) cleanup() {
	u.mu.Lock()
	c := u.cleanups
	u.cleanups = nil
	u.mu.Unlock()
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

func (u *upTB) Helper()                   {}
func (u *upTB) Name() string              { return "stack-up" }
func (u *upTB) Logf(f string, a ...any)   { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (u *upTB) Log(a ...any)              { fmt.Fprintln(os.Stderr, a...) }
func (u *upTB) Errorf(f string, a ...any) { u.Logf(f, a...); u.fail() }
func (u *upTB) Error(a ...any)            { u.Log(a...); u.fail() }
func (u *upTB) Fatalf(f string, a ...any) { u.Errorf(f, a...); runtime.Goexit() }
func (u *upTB) Fatal(a ...any)            { u.Error(a...); runtime.Goexit() }
func (u *upTB) FailNow()                  { u.fail(); runtime.Goexit() }
func (u *upTB) Fail()                     { u.fail() }
func (u *upTB) Skip(a ...any)             { u.Fatal(a...) }
func (u *upTB) Skipf(f string, a ...any)  { u.Fatalf(f, a...) }
func (u *upTB) SkipNow()                  { u.Fatal("skipped") }
func (u *upTB) Skipped() bool             { return false }
func (u *upTB) Failed() bool              { u.mu.Lock(); defer u.mu.Unlock(); return u.failed }
func (u *upTB) fail()                     { u.mu.Lock(); u.failed = true; u.mu.Unlock() }
func (u *upTB) Cleanup(f func())          { u.mu.Lock(); u.cleanups = append(u.cleanups, f); u.mu.Unlock() }
func (u *upTB) Setenv(k, v string)        { os.Setenv(k, v) }
func (u *upTB) TempDir() string {
	d, err := os.MkdirTemp("", "allot-stack-")
	if err != nil {
		u.Fatal(err)
	}
	u.Cleanup(func() { os.RemoveAll(d) })
	return d
}
