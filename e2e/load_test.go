// Package e2e holds tests and benchmarks that run whole processes (bin/enforcer) against
// real infrastructure from pkg/testenv.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/loadgen"
	"github.com/allot-dev/allot/pkg/testenv"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The workload of BenchmarkEnforcerRLS.
const (
	loadKeys    = 10_000 // distinct API keys
	loadZipfS   = 1.1    // Zipf exponent: key k (0-based) is drawn ∝ (k+1)^-1.1
	loadRate    = 500    // every key's limit: 500 a second, bursts of 500
	loadCallers = 64     // concurrent callers in the closed loop
	loadConns   = 4      // gRPC connections the callers share (as a few Envoys would)
	loadClosed  = 10 * time.Second
	loadOpen    = 10 * time.Second
	loadMax     = 2_000_000 // bound on calls per phase
)

const loadRules = `
version: load-1
rules:
  - id: default
    limits: [{name: second, rate: 500, per: 1s, burst: 500}]
`

// BenchmarkEnforcerRLS is the enforcer load benchmark of issue 4: one bin/enforcer process
// (built here, run as a child so its CPU can be read from /proc) against a real 3-master
// Redis Cluster, driven over gRPC by go-control-plane's Envoy RLS client.
//
// Workload. Every request is one RLS descriptor {api_key: key-K, remote_address: 10.0.0.1}
// under one rule: 500 checks a second per key, burst 500. K is drawn from 10,000 keys with
// a Zipf distribution, s = 1.1 (P(K) ∝ (K+1)^-1.1; the normaliser over 10,000 keys is ≈ 6.6,
// so key 0 carries ≈ 15% of the traffic, the top 10 keys ≈ 41%, the top 100 ≈ 65%, and
// the 9,000 keys of the tail ≈ 16%). At the 12–40k checks/s of interest the top 3–9 keys
// are offered over their limit, key 0 by 3.6–12× (so leases, pacing and the refusal cache
// are exercised on keys at their limit, as a real abusive or very popular client would),
// while every other key is under it and every one of their checks must be allowed (the
// benchmark fails on errors, not refusals; refusals are reported). The tail of keys seen a
// few times a second or less is what a real API key population looks like, and it is the
// hard part for a lease design: there is nothing to batch.
//
// Phases: a closed loop of 64 callers for 10 s (maximum throughput), then an open loop at
// half the measured rate for 10 s (latency from each request's intended send time, so
// queueing is not hidden). Metrics:
//
//	checks/s           closed loop throughput
//	server-µs/check    enforcer utime+stime (/proc/PID/stat, 100 Hz ticks) / checks
//	client-µs/check    this process' utime+stime / checks (the load generator shares the
//	                   machine: on 2 cores its CPU is taken from the server)
//	redis-calls/check  Σ over the masters of INFO commandstats evalsha+eval calls / checks
//	fallback-%         share of answers given locally by the fallback layer (breaker open,
//	                   or a check that outlived its wait): must stay ≈ 0 against a healthy
//	                   cluster
//	refused-%          share of RLS answers OVER_LIMIT
//	p50/p99/p999-ms    open loop, at half the closed-loop throughput
//
// ALLOT_BENCH_LOG=1 prints the enforcer's log (warn and above: breaker transitions) at
// the end. ALLOT_BENCH_BIN runs a prebuilt enforcer instead of building ./cmd/enforcer;
// ALLOT_BENCH_ARGS adds flags to it (e.g. "-fallback-timeout 50ms"); ALLOT_BENCH_PROFILE
// writes a 5 s CPU profile of the enforcer taken during the closed loop.
//
// The enforcer runs with its defaults (checks wait 5 ms) unless ALLOT_BENCH_ARGS says
// otherwise; fallback-% shows whether its breakers opened on the healthy cluster.
//
// Pinning: ALLOT_BENCH_SERVER_CPUS and ALLOT_BENCH_CLIENT_CPUS (taskset lists such as "1"
// and "0") pin the enforcer and this process; unset, nothing is pinned and the server, the
// client and the three redis-servers share every core. Skipped under -short.
func BenchmarkEnforcerRLS(b *testing.B) {
	if testing.Short() {
		b.Skip("load benchmark: needs Docker and a built enforcer")
	}
	testenv.Require(b)
	cluster := testenv.RedisCluster(b, testenv.ClusterOptions{Masters: 3})
	dir := b.TempDir()
	bin := os.Getenv("ALLOT_BENCH_BIN") // a prebuilt enforcer, e.g. of another commit
	if bin == "" {
		bin = filepath.Join(dir, "enforcer")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/allot-dev/allot/cmd/enforcer").CombinedOutput(); err != nil {
			b.Fatalf("while building the enforcer: %v\n%s", err, out)
		}
	}
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(loadRules), 0o644); err != nil {
		b.Fatal(err)
	}
	if cpus := os.Getenv("ALLOT_BENCH_CLIENT_CPUS"); cpus != "" {
		if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
			b.Fatalf("while pinning the client to %s: %v\n%s", cpus, err, out)
		}
	}
	srv := startEnforcer(b, bin, rulesFile, cluster.Addrs(), fmt.Sprintf("bench%d:", time.Now().UnixNano()))

	conns := make([]*grpc.ClientConn, loadConns)
	for i := range conns {
		cc, err := grpc.NewClient(srv.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		conns[i] = cc
	}
	clients := make([]rlsv3.RateLimitServiceClient, len(conns))
	for i := range conns {
		clients[i] = rlsv3.NewRateLimitServiceClient(conns[i])
	}
	// Requests are built once per key: the client's own cost should be the RPC, not this.
	reqs := make([]*rlsv3.RateLimitRequest, loadKeys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: fmt.Sprintf("key-%d", i)}, {Key: "remote_address", Value: "10.0.0.1"}},
		}}}
	}
	var refused atomicCount
	check := func(ctx context.Context, k int) error {
		// The loop's own deadline must not cut calls in flight short (gRPC's timer may fire
		// before the loop sees its context done, and that is no server error).
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		resp, err := clients[k%len(clients)].ShouldRateLimit(ctx, reqs[k])
		if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			refused.add()
		}
		return err
	}
	ctx := context.Background()
	keys := func(w int) *loadgen.Keys { return loadgen.NewKeys(loadKeys, loadZipfS, uint64(w+1)) }

	// Warm up: connections, the script cache, the Go runtime of both processes.
	loadgen.ClosedLoop(ctx, loadCallers, time.Second, loadMax, keys, check)

	for range b.N {
		s0 := srv.sample(b, cluster)
		refused.reset()
		profiled := make(chan struct{})
		if path := os.Getenv("ALLOT_BENCH_PROFILE"); path != "" {
			go func() { defer close(profiled); srv.profile(b, path) }()
		} else {
			close(profiled)
		}
		res := loadgen.ClosedLoop(ctx, loadCallers, loadClosed, loadMax, keys, check)
		s1 := srv.sample(b, cluster)
		<-profiled
		if res.Errors > 0 {
			b.Fatalf("closed loop: %d errors, first: %v", res.Errors, res.FirstErr)
		}
		n := float64(res.Calls)
		b.ReportMetric(res.PerSecond(), "checks/s")
		b.ReportMetric(float64((s1.server-s0.server).Microseconds())/n, "server-µs/check")
		b.ReportMetric(float64((s1.client-s0.client).Microseconds())/n, "client-µs/check")
		b.ReportMetric(float64(s1.redis-s0.redis)/n, "redis-calls/check")
		b.ReportMetric(100*(s1.fallback-s0.fallback)/n, "fallback-%")
		b.ReportMetric(100*float64(refused.load())/n, "refused-%")
		b.Logf("closed loop, %d callers: %.0f checks/s over %v; server %.1f µs/check, client %.1f µs/check, redis %.3f calls/check, fallback %.2f%%, refused %.1f%%",
			loadCallers, res.PerSecond(), res.Elapsed.Round(time.Millisecond),
			float64((s1.server-s0.server).Microseconds())/n, float64((s1.client-s0.client).Microseconds())/n,
			float64(s1.redis-s0.redis)/n, 100*(s1.fallback-s0.fallback)/n, 100*float64(refused.load())/n)

		rate := res.PerSecond() / 2
		o0 := srv.sample(b, cluster)
		or, err := loadgen.OpenLoop(ctx, rate, loadOpen, loadCallers, loadgen.NewKeys(loadKeys, loadZipfS, 99), check)
		if err != nil {
			b.Fatal(err)
		}
		o1 := srv.sample(b, cluster)
		if or.Errors > 0 || or.Dropped > 0 {
			b.Fatalf("open loop: %d errors, %d dropped, first: %v", or.Errors, or.Dropped, or.FirstErr)
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		on := float64(or.Calls)
		b.ReportMetric(rate, "open-rate/s")
		b.ReportMetric(ms(or.Quantile(0.5)), "p50-ms")
		b.ReportMetric(ms(or.Quantile(0.99)), "p99-ms")
		b.ReportMetric(ms(or.Quantile(0.999)), "p999-ms")
		b.Logf("open loop at %.0f/s for %v: p50 %v p99 %v p999 %v; server %.1f µs/check, client %.1f µs/check, redis %.3f calls/check, fallback %.2f%%",
			rate, loadOpen, or.Quantile(0.5), or.Quantile(0.99), or.Quantile(0.999),
			float64((o1.server-o0.server).Microseconds())/on, float64((o1.client-o0.client).Microseconds())/on,
			float64(o1.redis-o0.redis)/on, 100*(o1.fallback-o0.fallback)/on)
	}
}

// atomicCount counts refusals across callers.
type atomicCount struct{ n atomic.Int64 }

func (c *atomicCount) add()        { c.n.Add(1) }
func (c *atomicCount) reset()      { c.n.Store(0) }
func (c *atomicCount) load() int64 { return c.n.Load() }

// enforcerProc is the enforcer child process.
type enforcerProc struct {
	cmd        *exec.Cmd
	grpc, http string
	stderr     *bytes.Buffer
}

func startEnforcer(b *testing.B, bin, rulesFile string, redisAddrs []string, prefix string) *enforcerProc {
	ports := freePorts(b, 2)
	p := &enforcerProc{grpc: ports[0], http: ports[1], stderr: new(bytes.Buffer)}
	args := []string{
		"-region", "bench", "-id", "bench-1", "-store", "redis-cluster",
		"-redis-addrs", strings.Join(redisAddrs, ","), "-redis-key-prefix", prefix,
		"-rules-file", rulesFile, "-peers", "1",
		"-grpc-addr", p.grpc, "-http-addr", p.http, "-pprof", "-log-level", "warn",
	}
	if v := os.Getenv("ALLOT_BENCH_ARGS"); v != "" { // e.g. "-fallback-timeout 50ms"
		args = append(args, strings.Fields(v)...)
	}
	name := bin
	if cpus := os.Getenv("ALLOT_BENCH_SERVER_CPUS"); cpus != "" {
		args = append([]string{"-c", cpus, bin}, args...)
		name = "taskset"
	}
	p.cmd = exec.Command(name, args...)
	p.cmd.Stderr = p.stderr
	// Environment variables must not reconfigure the child behind the benchmark's back.
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GOMAXPROCS=" + os.Getenv("GOMAXPROCS")}
	if err := p.cmd.Start(); err != nil {
		b.Fatalf("while starting the enforcer: %v", err)
	}
	b.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
		if b.Failed() || os.Getenv("ALLOT_BENCH_LOG") != "" {
			b.Logf("enforcer stderr:\n%s", p.stderr.String())
		}
	})
	end := time.Now().Add(20 * time.Second)
	for {
		if resp, err := http.Get("http://" + p.http + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(end) {
			b.Fatalf("enforcer not ready after 20s; stderr:\n%s", p.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sample is one reading of the counters the benchmark reports deltas of.
type sample struct {
	server, client time.Duration
	redis          int64
	fallback       float64
}

func (p *enforcerProc) sample(b *testing.B, c *testenv.Cluster) sample {
	s := sample{server: procCPU(b, p.cmd.Process.Pid), client: procCPU(b, os.Getpid())}
	for _, m := range c.Masters() {
		s.redis += scriptCalls(b, m)
	}
	s.fallback = p.metricSum(b, regexp.MustCompile(`(?m)^allot_enforcer_decisions_total\{[^}]*source="fallback"[^}]*\} (\S+)`))
	return s
}

// procCPU is utime+stime of pid, from /proc/PID/stat (fields 14 and 15, in clock ticks of
// 1/100 s: USER_HZ is 100 on every Linux this runs on).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(u+s) * 10 * time.Millisecond
}

var cmdstatRE = regexp.MustCompile(`(?m)^cmdstat_(evalsha|eval):calls=(\d+)`)

// scriptCalls is the number of EVALSHA and EVAL calls a master has served.
func scriptCalls(b *testing.B, n *testenv.Node) int64 {
	info, err := n.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatalf("INFO commandstats: %v", err)
	}
	var sum int64
	for _, m := range cmdstatRE.FindAllStringSubmatch(info, -1) {
		v, _ := strconv.ParseInt(m[2], 10, 64)
		sum += v
	}
	return sum
}

func (p *enforcerProc) metricSum(b *testing.B, re *regexp.Regexp) float64 {
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		b.Fatalf("while scraping /metrics: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, m := range re.FindAllSubmatch(raw, -1) {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		sum += v
	}
	return sum
}

// profile takes a 5 s CPU profile of the enforcer (run while the closed loop runs) and
// writes it to path (ALLOT_BENCH_PROFILE), for `go tool pprof`. Errors are logged: a
// missing profile must not fail the measurement.
func (p *enforcerProc) profile(b *testing.B, path string) {
	resp, err := http.Get("http://" + p.http + "/debug/pprof/profile?seconds=5")
	if err != nil {
		b.Logf("pprof: %v", err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		b.Logf("pprof: %v", err)
		return
	}
	defer f.Close()
	if _, err := bufio.NewReader(resp.Body).WriteTo(f); err != nil {
		b.Logf("pprof: %v", err)
	}
}

func freePorts(b *testing.B, n int) []string {
	var out []string
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}
