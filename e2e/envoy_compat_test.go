package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/e2e/stack"
	"github.com/allot-dev/allot/pkg/testenv"
	tpoll "github.com/allot-dev/allot/pkg/testenv/poll"
)

// Issue 23 §3: allot run as envoyproxy/ratelimit is deployed, unchanged. Each test builds
// cmd/enforcer, runs it as a process with nothing but their environment variables (no
// config file, no ALLOT_* variable, no flag), against a real Redis in a container, and
// asks it Envoy's RLS v3 questions.

// enforcerBin builds cmd/enforcer into t's temporary directory (the go build cache makes
// the second build a link) and returns its path.
func enforcerBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "enforcer")
	build := exec.Command("go", "build", "-o", bin, "./cmd/enforcer")
	build.Dir = stack.RepoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// compatEnforcer is the enforcer process, its addresses and its log.
type compatEnforcer struct {
	http, grpc string
	log        *syncBuffer
	rls        rlsv3.RateLimitServiceClient
}

// startCompat runs the enforcer with env (NAME=value; nothing of the test's own
// environment) on two free loopback ports given as their HOST, PORT, GRPC_HOST and
// GRPC_PORT, and stops it (SIGTERM, then waits) at cleanup.
func startCompat(t *testing.T, bin string, env ...string) *compatEnforcer {
	t.Helper()
	ports := testenv.Ports(t, 2)
	e := &compatEnforcer{http: fmt.Sprintf("127.0.0.1:%d", ports[0]), grpc: fmt.Sprintf("127.0.0.1:%d", ports[1]), log: &syncBuffer{}}
	env = append(env, "HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[0]), "GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(ports[1]))
	cmd := exec.Command(bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, e.log, e.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("enforcer log:\n%s", e.log.String())
		}
	})
	cc, err := grpc.NewClient(e.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	e.rls = rlsv3.NewRateLimitServiceClient(cc)
	return e
}

// healthcheck is GET /healthcheck: the status code and body, or 0 if nothing answers.
func (e *compatEnforcer) healthcheck() (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + e.http + "/healthcheck")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (e *compatEnforcer) waitHealthy(t *testing.T) {
	t.Helper()
	tpoll.True(t, time.Minute, "/healthcheck 200 OK", func() bool { code, body := e.healthcheck(); return code == 200 && body == "OK" })
}

func (e *compatEnforcer) ask(t *testing.T, domain string, kv ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := e.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// codes asks n times and returns the overall codes, "OK" or "OVER_LIMIT" each.
func (e *compatEnforcer) codes(t *testing.T, n int, domain string, kv ...string) string {
	t.Helper()
	var out []string
	for range n {
		out = append(out, e.ask(t, domain, kv...).OverallCode.String())
	}
	return strings.Join(out, " ")
}

func headerNamed(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if strings.EqualFold(h.Key, name) {
			return h.Value
		}
	}
	return ""
}

// istioConfig is Istio's sample configuration for envoyproxy/ratelimit (its ConfigMap),
// as it is.
const istioConfig = `domain: ratelimit
descriptors:
  - key: PATH
    value: "/productpage"
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: PATH
    value: "api"
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
`

// configMapDir writes files into dir the way the kubelet mounts a ConfigMap: the files
// in a timestamped directory, ..data a symlink to it, and each name a symlink through
// ..data.
func configMapDir(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	ts := filepath.Join(dir, "..2026_12_04_16_00_00.000000001")
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// TestEnvoyCompatIstio: Istio's deployment of envoyproxy/ratelimit (its sample's
// environment, the ConfigMap mounted at RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config) with
// allot's binary in place of theirs.
func TestEnvoyCompatIstio(t *testing.T) {
	testenv.Require(t)
	redis := testenv.Redis(t)
	root := t.TempDir()
	cm := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cm, 0o755); err != nil {
		t.Fatal(err)
	}
	configMapDir(t, cm, map[string]string{"config.yaml": istioConfig})
	env := []string{
		"LOG_LEVEL=info", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr, "USE_STATSD=false",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"STATSD_HOST=statsd", "LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REMAINING_HEADER=X-RateLimit-Remaining", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(testenv.Ports(t, 1)[0]),
	}

	// -check-config sees the same: the configuration good, what is not supported named.
	bin := enforcerBin(t)
	check := exec.Command(bin, "-check-config")
	check.Env = env
	out, err := check.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "configuration ok (region default, store redis, rules envoy-ratelimit "+cm+")") ||
		!strings.Contains(string(out), "envoyproxy/ratelimit variable STATSD_HOST: not supported") {
		t.Fatalf("-check-config: %v\n%s", err, out)
	}

	e := startCompat(t, bin, env...)
	e.waitHealthy(t)
	for _, want := range []string{
		`envoyproxy/ratelimit compatibility: their environment variables are read`,
		`envoyproxy/ratelimit setting not supported by allot: variable=STATSD_HOST`,
		`envoyproxy/ratelimit setting honoured: setting=LIMIT_RESPONSE_HEADERS_ENABLED=true`,
	} {
		if !strings.Contains(e.log.String(), want) {
			t.Errorf("the log does not say %q", want)
		}
	}

	// Their debug port: pprof and the metrics.
	for _, path := range []string{"/debug/pprof/", "/metrics"} {
		resp, err := http.Get("http://127.0.0.1:" + strings.TrimPrefix(env[len(env)-1], "DEBUG_PORT=") + path)
		if err != nil {
			t.Fatalf("debug port %s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("debug port %s: %s", path, resp.Status)
		}
	}

	// /productpage: 1 a minute; another path, 100 a minute.
	if got := e.codes(t, 3, "ratelimit", "PATH", "/productpage"); got != "OK OVER_LIMIT OVER_LIMIT" {
		t.Errorf("/productpage: %s", got)
	}
	resp := e.ask(t, "ratelimit", "PATH", "/productpage")
	if st := resp.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.LimitRemaining != 0 || st.CurrentLimit == nil {
		t.Errorf("/productpage status %v", st)
	}
	if got := e.codes(t, 5, "ratelimit", "PATH", "/reviews"); got != "OK OK OK OK OK" {
		t.Errorf("/reviews: %s", got)
	}
	// Their header fields (LIMIT_RESPONSE_HEADERS_ENABLED), one renamed.
	resp = e.ask(t, "ratelimit", "PATH", "api")
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || headerNamed(resp, "RateLimit-Limit") != "2" ||
		headerNamed(resp, "X-RateLimit-Remaining") != "1" || headerNamed(resp, "RateLimit-Reset") == "" || headerNamed(resp, "RateLimit") != "" {
		t.Errorf("api: %v, want OK with their header fields", resp)
	}
	resp = e.ask(t, "ratelimit", "PATH", "api")
	resp2 := e.ask(t, "ratelimit", "PATH", "api")
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp2.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT ||
		headerNamed(resp2, "X-RateLimit-Remaining") != "0" {
		t.Errorf("api, 2 a minute: %v then %v", resp, resp2)
	}
	// The counts are in their Redis.
	if n, err := redis.Client().DBSize(context.Background()).Result(); err != nil || n == 0 {
		t.Errorf("Redis holds %d keys (%v), want the buckets", n, err)
	}

	// A ConfigMap update (the kubelet swaps ..data) is followed.
	ts2 := filepath.Join(cm, "..2026_12_04_16_05_00.000000002")
	os.MkdirAll(ts2, 0o755)
	os.WriteFile(filepath.Join(ts2, "config.yaml"), []byte(strings.Replace(istioConfig, "requests_per_unit: 1\n", "requests_per_unit: 3\n", 1)), 0o644)
	tmp := filepath.Join(cm, "..data_tmp")
	os.Symlink(filepath.Base(ts2), tmp)
	if err := os.Rename(tmp, filepath.Join(cm, "..data")); err != nil {
		t.Fatal(err)
	}
	tpoll.True(t, 30*time.Second, "the updated ConfigMap", func() bool {
		return e.ask(t, "ratelimit", "PATH", "/productpage").Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 3
	})
}

// gatewayPolicy is what Envoy Gateway generates for a BackendTrafficPolicy of n requests a
// minute per x-user-id on one route of listener default/eg/http.
func gatewayPolicy(n uint32) *rlconf.RateLimitConfig {
	return &rlconf.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlconf.RateLimitDescriptor{{
		Key: "httproute/default/backend/rule/0/match/0/www_example_com", Value: "httproute/default/backend/rule/0/match/0/www_example_com",
		Descriptors: []*rlconf.RateLimitDescriptor{{Key: "rule-0-match-0",
			RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_MINUTE, RequestsPerUnit: n}}},
	}}}
}

// TestEnvoyCompatGateway: Envoy Gateway's deployment of envoyproxy/ratelimit
// (CONFIG_TYPE=GRPC_XDS_SOTW, its RateLimitConfig pushed from a management server),
// with a Redis Cluster from REDIS_TYPE=cluster, allot's binary in place of theirs.
func TestEnvoyCompatGateway(t *testing.T) {
	testenv.Require(t)
	cluster := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 1})
	srv := testenv.StartXDS(t, "envoy-ratelimit", "") // as Envoy Gateway runs it
	e := startCompat(t, enforcerBin(t),
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+srv.Addr(), "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=cluster", "REDIS_URL="+strings.Join(cluster.Addrs(), ","),
		"USE_STATSD=false", "USE_PROMETHEUS=true", "LOG_LEVEL=info", "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
	)
	// No configuration yet: it serves (after its start timeout) but is not healthy.
	tpoll.True(t, time.Minute, "/healthcheck answering 500 before any configuration", func() bool {
		code, _ := e.healthcheck()
		return code == http.StatusInternalServerError
	})
	srv.Set("1", gatewayPolicy(3))
	e.waitHealthy(t)
	route := "httproute/default/backend/rule/0/match/0/www_example_com"
	user := func(u string) []string { return []string{route, route, "rule-0-match-0", u} }
	if got := e.codes(t, 5, "default/eg/http", user("alice")...); got != "OK OK OK OVER_LIMIT OVER_LIMIT" {
		t.Errorf("3 a minute: %s", got)
	}
	if resp := e.ask(t, "default/eg/http", user("bob")...); resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("another user, counted apart, no header fields (their default): %v", resp)
	}
	// Envoy Gateway pushes a changed policy.
	srv.Set("2", gatewayPolicy(6))
	n := 0
	tpoll.True(t, 30*time.Second, "the pushed change", func() bool {
		n++
		return e.ask(t, "default/eg/http", user("probe-"+strconv.Itoa(n))...).Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 6
	})
	if got := e.codes(t, 8, "default/eg/http", user("carol")...); got != "OK OK OK OK OK OK OVER_LIMIT OVER_LIMIT" {
		t.Errorf("6 a minute: %s", got)
	}
	// A broken one (a unit beside unlimited: true) is refused; the last good one stays.
	bad := gatewayPolicy(1)
	bad.Descriptors[0].Descriptors[0].RateLimit.Unlimited = true
	srv.Set("3", bad)
	tpoll.True(t, 30*time.Second, "the NACK logged", func() bool { return strings.Contains(e.log.String(), "refused (NACK)") })
	if got := e.codes(t, 8, "default/eg/http", user("dave")...); got != "OK OK OK OK OK OK OVER_LIMIT OVER_LIMIT" {
		t.Errorf("after a broken push, 6 a minute still: %s", got)
	}
	if code, body := e.healthcheck(); code != 200 || body != "OK" {
		t.Errorf("/healthcheck %d %q after a refused push, want 200 OK (the last good configuration serves)", code, body)
	}
}
