package app

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(idleClosed{m})
}

// idleClosed runs the tests, then closes the default transport's kept-alive
// connections: their read and write loops belong to the client's pool, not to
// a test, and live until the server side times them out.
type idleClosed struct{ m *testing.M }

func (c idleClosed) Run() int {
	code := c.m.Run()
	http.DefaultClient.CloseIdleConnections()
	return code
}

// up reports whether GET url answers, closing the body so the connection
// goes back to the pool.
func up(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParsePrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	os.WriteFile(path, []byte("region: from-file\nrules: {file: r.yaml}\npeers: 3\nstore: {kind: redis, addrs: [\"a:1\"]}\n"), 0o644)
	cfg, err := Parse([]string{"-config", path, "-peers", "5"}, env(map[string]string{
		"ALLOT_REGION": "from-env", "ALLOT_PEERS": "4", "ALLOT_REDIS_PASSWORD": "s3cret",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Region != "from-env" || cfg.Peers != 5 || cfg.Store.Password != "s3cret" || cfg.Store.Kind != "redis" || cfg.Rules.File != "r.yaml" {
		t.Fatalf("got region %q peers %d password %q kind %q rules %q", cfg.Region, cfg.Peers, cfg.Store.Password, cfg.Store.Kind, cfg.Rules.File)
	}
	cfg, err = Parse([]string{"-region", "flag", "-redis-tls", "-redis-addrs", "a:1, b:2", "-store", "redis-cluster", "-rules-file", "x"},
		env(map[string]string{"ALLOT_CONFIG": path, "ALLOT_REGION": "env"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Region != "flag" || !cfg.Store.TLS.Enabled || len(cfg.Store.Addrs) != 2 || cfg.Store.Addrs[1] != "b:2" || cfg.Peers != 3 {
		t.Fatalf("got %+v", cfg)
	}
	for _, tc := range []struct {
		args []string
		env  string
		want bool
	}{{nil, "", false}, {[]string{"-redis-pipeline"}, "", true}, {nil, "true", true}, {[]string{"-redis-pipeline=false"}, "true", false}} {
		cfg, err = Parse(tc.args, env(map[string]string{"ALLOT_CONFIG": path, "ALLOT_REDIS_PIPELINE": tc.env}), io.Discard)
		if err != nil || cfg.Store.Pipeline != tc.want {
			t.Fatalf("store.pipeline from %q and ALLOT_REDIS_PIPELINE=%q: %v (%v), want %v", tc.args, tc.env, cfg.Store.Pipeline, err, tc.want)
		}
	}
}

// TestParseTracing: tracing is off unless the OTEL_* variables configure an exporter, and
// then follows them.
func TestParseTracing(t *testing.T) {
	args := []string{"-region", "r", "-rules-file", "r"}
	cfg, err := Parse(args, env(nil), io.Discard)
	if err != nil || cfg.Tracing.Enabled {
		t.Fatalf("no OTEL_* variables: tracing %+v, %v; want off", cfg.Tracing, err)
	}
	cfg, err = Parse(args, env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
		"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.001"}), io.Discard)
	if err != nil || !cfg.Tracing.Enabled || cfg.Tracing.Endpoint != "http://collector:4317" || cfg.Tracing.Ratio != 0.001 {
		t.Fatalf("tracing %+v, %v", cfg.Tracing, err)
	}
}

func TestParseErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("region: x\nrules: {file: r}\nbogus: 1\n"), 0o644)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-rules-file", "r"}, nil, "region is empty"},
		{[]string{"-region", "r"}, nil, "no rules"},
		{[]string{"-region", "r", "-rules-file", "r", "-store", "redis"}, nil, "store.addrs is empty"},
		{[]string{"-region", "r", "-rules-file", "r", "-store", "mongo"}, nil, `store.kind "mongo"`},
		{[]string{"-region", "r", "-rules-etcd-prefix", "/p/"}, nil, "needs etcd.endpoints"},
		{[]string{"-region", "r", "-rules-file", "r", "-peers", "x"}, nil, `invalid value "x" for flag -peers`},
		{[]string{"-region", "r", "-rules-file", "r"}, map[string]string{"ALLOT_DRAIN_TIMEOUT": "soon"}, `ALLOT_DRAIN_TIMEOUT="soon"`},
		{[]string{"-config", bad}, nil, "field bogus not found"},
		{[]string{"-region", "r", "-rules-file", "r", "extra"}, nil, "unexpected arguments"},
		{[]string{"-region", "r", "-rules-file", "r", "-log-level", "loud"}, nil, `log_level "loud"`},
		{[]string{"-region", "r", "-rules-file", "r"}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, `OTEL_TRACES_SAMPLER "sometimes"`},
	} {
		_, err := Parse(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want %q", tc.args, err, tc.want)
		}
	}
	if _, err := Parse([]string{"-h"}, env(nil), io.Discard); !IsHelp(err) {
		t.Errorf("-h: %v, want help", err)
	}
}

// The shipped region configs parse and validate.
func TestRegionConfigs(t *testing.T) {
	for _, r := range []string{"us-east", "eu-west", "ap-south"} {
		cfg, err := Parse([]string{"-config", "../../../configs/regions/" + r + ".yaml"}, env(nil), io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		if cfg.Region != r || cfg.Store.Kind != "redis-cluster" || len(cfg.Etcd.Endpoints) == 0 || cfg.Rules.EtcdPrefix == "" {
			t.Errorf("%s: %+v", r, cfg)
		}
	}
}

const fileRules = `
rules:
  - id: default
    limits: [{name: second, rate: 1, per: 1s, burst: 2}]
`

// memoryApp runs an App on the memory store with rules from a file; stopped at cleanup.
func memoryApp(t *testing.T, rulesYAML string) (*App, string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(rulesYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules.File = "us-east", path
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Rules.PollInterval = time.Hour // only Reload changes rules in these tests
	a := startApp(t, cfg)
	return a, path
}

// startApp builds the app of cfg and runs it until the test ends (Close, then Run's
// error, which must be nil).
func startApp(t *testing.T, cfg Config) *App {
	t.Helper()
	a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	t.Cleanup(func() {
		a.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return a
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func httpCheck(t *testing.T, addr, body string) (int, map[string]any, http.Header) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, resp.Header
}

func TestMemoryAppServesAndReloads(t *testing.T) {
	a, path := memoryApp(t, fileRules)
	addr := a.HTTPAddr()
	for i, want := range []int{200, 200, 429} {
		if code, out, _ := httpCheck(t, addr, `{"api_key":"k"}`); code != want {
			t.Fatalf("check %d: %d %v, want %d", i, code, out, want)
		}
	}
	// A bad file is refused; the old rules keep serving.
	os.WriteFile(path, []byte("rules:\n  - id: default\n    limits: [{name: second, rate: -1, per: 1s}]\n"), 0o644)
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "rate") {
		t.Fatalf("Reload of a bad file: %v, want an error naming rate", err)
	}
	if _, out, _ := httpCheck(t, addr, `{"api_key":"k2"}`); out["rule"] != "default" {
		t.Fatalf("after bad reload: %v", out)
	}
	// A good file replaces them.
	os.WriteFile(path, []byte("rules:\n  - id: roomy\n    limits: [{name: second, rate: 100, per: 1s}]\n"), 0o644)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, out, h := httpCheck(t, addr, `{"api_key":"k"}`); code != 200 || out["rule"] != "roomy" || h.Get("RateLimit-Policy") != `"roomy/second";q=100;w=1` {
		t.Fatalf("after good reload: %d %v %v", code, out, h)
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("readyz %d", resp.StatusCode)
	}
	resp, err = http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"allot_rules_loads_total{source=\"file\"} 2", "allot_rules_failures_total{source=\"file\"} 1", "allot_registry_peers 1", "allot_memory_store_keys", "go_goroutines"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestCloseWithoutRunAndTwice(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	os.WriteFile(path, []byte(fileRules), 0o644)
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules.File = "us-east", path
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := a.HTTPAddr()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if up("http://" + addr + "/healthz") {
		t.Fatal("listener still open after Close")
	}
	if err := a.Run(context.Background()); err != ErrClosed {
		t.Fatalf("Run after Close: %v", err)
	}
}

func TestNewRefusesBadRulesFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	os.WriteFile(path, []byte("rules:\n  - id: x\n    limits: [{name: s, rate: 1, per: 1s}]\n    bogus: 1\n"), 0o644)
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules.File = "us-east", path
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("New with a bad rules file: %v, want an error naming the field", err)
	}
}

// gate is a store whose takes wait until released, to hold checks in flight.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func (g *gate) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	g.entered <- struct{}{}
	select {
	case <-g.release:
		return bucket.Result{Granted: req.Want, Remaining: 1, Source: bucket.SourceMemory}, nil
	case <-ctx.Done():
		return bucket.Result{}, ctx.Err()
	}
}

func TestCloseDrainsInFlightChecks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	os.WriteFile(path, []byte(fileRules), 0o644)
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules.File = "us-east", path
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	g := &gate{entered: make(chan struct{}, 4), release: make(chan struct{})}
	a, err := newApp(cfg, nil, g, clock.Real())
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(context.Background()) }()
	cc := dialT(t, a.GRPCAddr())
	type result struct {
		allowed bool
		err     error
	}
	inflight := make(chan result, 2)
	go func() {
		r, err := allotv1.NewAllotClient(cc).Check(context.Background(), &allotv1.CheckRequest{ApiKey: "k"})
		inflight <- result{r.GetAllowed(), err}
	}()
	go func() {
		code, _, _ := httpCheck(t, a.HTTPAddr(), `{"api_key":"k2"}`)
		inflight <- result{code == 200, nil}
	}()
	<-g.entered
	<-g.entered // both checks are inside the store
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	// New connections are refused once Close has begun; the two in flight still finish.
	if !poll(5*time.Second, func() bool { return !up("http://" + a.HTTPAddr() + "/healthz") }) {
		t.Fatal("HTTP still accepting after Close began")
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with checks in flight", err)
	default:
	}
	close(g.release)
	for i := 0; i < 2; i++ {
		if r := <-inflight; r.err != nil || !r.allowed {
			t.Fatalf("in-flight check: %+v, want allowed", r)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
}

func dialT(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
